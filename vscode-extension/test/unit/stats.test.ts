import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import { formatStatsReport, formatStatusText, parseStats, shownAcceptance } from '../../src/stats';

const RAW = {
  requests: 12,
  cancelled: 3,
  tokens: 480,
  target_forwards: 160,
  acceptance: { ngram: 0.614, model: 0.736 },
  ttft_p50_s: 0.021,
  ttft_p95_s: 0.0485,
  tokens_per_s: 41.46,
  cache_hits: 4,
  suggestions: { shown: 8, accepted: 2, partially_accepted_chars: 9, accept_rate: 0.25 },
};

describe('parseStats', () => {
  it('reads the contract\'s snake_case fields', () => {
    assert.deepEqual(parseStats(RAW), {
      requests: 12,
      cancelled: 3,
      tokens: 480,
      targetForwards: 160,
      acceptance: { ngram: 0.614, model: 0.736 },
      ttftP50S: 0.021,
      ttftP95S: 0.0485,
      tokensPerS: 41.46,
      suggestions: { shown: 8, accepted: 2, acceptRate: 0.25 },
      cacheHits: 4,
    });
  });

  it('treats missing or nonsense numbers as unknown, not as zero rates', () => {
    const stats = parseStats({ requests: 0, acceptance: { ngram: null, model: 1.7 }, tokens_per_s: null });
    assert.deepEqual(stats?.acceptance, { ngram: null, model: null });
    assert.equal(stats?.tokensPerS, null);
    assert.equal(stats?.tokens, 0);
  });

  it('rejects what is not stats', () => {
    assert.equal(parseStats(null), undefined);
    assert.equal(parseStats('busy'), undefined);
    assert.equal(parseStats({ tokens: 3 }), undefined);
  });
});

describe('formatStatusText', () => {
  const stats = parseStats({ ...RAW, suggestions: undefined })!;

  it('shows one drafter\'s acceptance when the user chose it', () => {
    assert.equal(formatStatusText(stats, 'ngram'), 'acc 61% · 41 tok/s');
    assert.equal(formatStatusText(stats, 'model'), 'acc 74% · 41 tok/s');
  });

  it('shows both rates, n-gram first, for hybrid or the server\'s choice', () => {
    assert.equal(formatStatusText(stats, 'hybrid'), 'acc 61%/74% · 41 tok/s');
    assert.equal(formatStatusText(stats, undefined), 'acc 61%/74% · 41 tok/s');
  });

  it('shows no acceptance without drafting, and a dash before any timing', () => {
    assert.equal(formatStatusText(stats, 'none'), '41 tok/s');
    assert.equal(formatStatusText(parseStats({ requests: 0 })!, undefined), '– tok/s');
  });

  it('skips a drafter that has not drafted yet', () => {
    const onlyNgram = parseStats({ ...RAW, suggestions: undefined, acceptance: { ngram: 0.5, model: null } })!;
    assert.deepEqual(shownAcceptance(onlyNgram, 'hybrid'), [['n-gram', 0.5]]);
    assert.equal(formatStatusText(onlyNgram, 'hybrid'), 'acc 50% · 41 tok/s');
  });
});

describe('the accept rate in the status bar', () => {
  it('follows tokens/s once a suggestion was shown', () => {
    assert.equal(formatStatusText(parseStats(RAW)!, 'ngram'), 'acc 61% · 41 tok/s · 25% taken');
    assert.equal(formatStatusText(parseStats({ ...RAW, suggestions: { shown: 0 } })!, 'ngram'), 'acc 61% · 41 tok/s');
  });
});

describe('formatStatsReport', () => {
  it('lists every counter with units', () => {
    assert.equal(
      formatStatsReport(parseStats(RAW)!),
      [
        'requests: 12 (3 cancelled)',
        'tokens: 480 in 160 target forwards (3.00 per forward)',
        'acceptance: n-gram 61%, model 74%',
        'time to first token: p50 21 ms, p95 49 ms',
        'throughput: 41.5 tokens/s',
        'suggestions: 8 shown, 2 accepted (25%); 4 answered from the cache',
      ].join('\n'),
    );
  });

  it('says when nothing has been measured yet', () => {
    const report = formatStatsReport(parseStats({ requests: 0 })!);
    assert.match(report, /tokens: 0 in 0 target forwards\n/);
    assert.match(report, /n-gram no drafts yet, model no drafts yet/);
    assert.match(report, /p50 –, p95 –/);
  });
});
