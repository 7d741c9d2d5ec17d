// `specComplete/stats`: the server's counters, checked on arrival and turned into the status
// bar's text and the "Show Stats" report. No `vscode` import.

import { RequestType0 } from 'vscode-languageserver-protocol';
import { DraftMethod } from './settings';

export interface ServerStats {
  readonly requests: number;
  readonly cancelled: number;
  readonly tokens: number;
  readonly targetForwards: number;
  /** Fraction of drafted tokens the target accepted, per drafter; null before any draft. */
  readonly acceptance: { readonly ngram: number | null; readonly model: number | null };
  readonly ttftP50S: number | null;
  readonly ttftP95S: number | null;
  readonly tokensPerS: number | null;
  /** What the editor reported about suggestions: shown, accepted wholly, and their ratio. */
  readonly suggestions: { readonly shown: number; readonly accepted: number; readonly acceptRate: number | null };
  /** Completions answered from earlier ones (typed through, undo/redo) without a model call. */
  readonly cacheHits: number;
}

export const StatsRequest = new RequestType0<unknown, void>('specComplete/stats');

/** The server's JSON (snake_case, as the contract names it), or undefined if it is not stats. */
export function parseStats(raw: unknown): ServerStats | undefined {
  if (raw === null || typeof raw !== 'object') {
    return undefined;
  }
  const stats = raw as Record<string, unknown>;
  const acceptance = (stats.acceptance ?? {}) as Record<string, unknown>;
  const suggestions = (stats.suggestions ?? {}) as Record<string, unknown>;
  if (typeof stats.requests !== 'number') {
    return undefined;
  }
  return {
    requests: stats.requests,
    cancelled: count(stats.cancelled),
    tokens: count(stats.tokens),
    targetForwards: count(stats.target_forwards),
    acceptance: { ngram: rate(acceptance.ngram), model: rate(acceptance.model) },
    ttftP50S: seconds(stats.ttft_p50_s),
    ttftP95S: seconds(stats.ttft_p95_s),
    tokensPerS: seconds(stats.tokens_per_s),
    suggestions: {
      shown: count(suggestions.shown),
      accepted: count(suggestions.accepted),
      acceptRate: rate(suggestions.accept_rate),
    },
    cacheHits: count(stats.cache_hits),
  };
}

/**
 * The acceptance rates worth showing for a draft method: one drafter's when the user chose
 * one, both when hybrid or left to the server, none when drafting is off.
 */
export function shownAcceptance(stats: ServerStats, draft: DraftMethod | undefined): Array<[string, number]> {
  const rates: Array<[string, number | null]> =
    draft === 'ngram' ? [['n-gram', stats.acceptance.ngram]]
      : draft === 'model' ? [['model', stats.acceptance.model]]
        : draft === 'none' ? []
          : [['n-gram', stats.acceptance.ngram], ['model', stats.acceptance.model]];
  return rates.filter((entry): entry is [string, number] => entry[1] !== null);
}

/**
 * Status bar text, e.g. 'acc 72% · 41 tok/s', or 'acc 61%/74% · 41 tok/s' when two drafters
 * report (n-gram first), or '– tok/s' before the server has timed anything; then the share of
 * shown suggestions accepted, once one was shown: '· 50% taken'.
 */
export function formatStatusText(stats: ServerStats, draft: DraftMethod | undefined): string {
  const parts: string[] = [];
  const rates = shownAcceptance(stats, draft);
  if (rates.length > 0) {
    parts.push(`acc ${rates.map(([, value]) => percent(value)).join('/')}`);
  }
  parts.push(`${stats.tokensPerS === null ? '–' : Math.round(stats.tokensPerS)} tok/s`);
  if (stats.suggestions.acceptRate !== null) {
    parts.push(`${percent(stats.suggestions.acceptRate)} taken`);
  }
  return parts.join(' · ');
}

/** The multi-line report of the "Show Stats" command. */
export function formatStatsReport(stats: ServerStats): string {
  const acceptance = (value: number | null) => (value === null ? 'no drafts yet' : percent(value));
  const secs = (value: number | null) => (value === null ? '–' : `${(value * 1000).toFixed(0)} ms`);
  return [
    `requests: ${stats.requests} (${stats.cancelled} cancelled)`,
    `tokens: ${stats.tokens} in ${stats.targetForwards} target forwards` +
      (stats.targetForwards > 0 ? ` (${(stats.tokens / stats.targetForwards).toFixed(2)} per forward)` : ''),
    `acceptance: n-gram ${acceptance(stats.acceptance.ngram)}, model ${acceptance(stats.acceptance.model)}`,
    `time to first token: p50 ${secs(stats.ttftP50S)}, p95 ${secs(stats.ttftP95S)}`,
    `throughput: ${stats.tokensPerS === null ? '–' : stats.tokensPerS.toFixed(1)} tokens/s`,
    `suggestions: ${stats.suggestions.shown} shown, ${stats.suggestions.accepted} accepted` +
      (stats.suggestions.acceptRate === null ? '' : ` (${percent(stats.suggestions.acceptRate)})`) +
      `; ${stats.cacheHits} answered from the cache`,
  ].join('\n');
}

function percent(fraction: number): string {
  return `${Math.round(fraction * 100)}%`;
}

function count(value: unknown): number {
  return typeof value === 'number' && Number.isFinite(value) ? value : 0;
}

function rate(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 && value <= 1 ? value : null;
}

function seconds(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : null;
}
