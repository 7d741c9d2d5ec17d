import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import { parseStats } from '../../src/stats';
import { StatusState, statusView } from '../../src/statusView';

const READY: StatusState = {
  enabled: true,
  connection: 'ready',
  busy: false,
  error: undefined,
  stats: undefined,
  draft: undefined,
  server: 'spec-complete serve --stdio',
};
const STATS = parseStats({ requests: 3, acceptance: { ngram: 0.5, model: null }, tokens_per_s: 30 });

describe('statusView', () => {
  it('shows the stats when ready', () => {
    const view = statusView({ ...READY, stats: STATS });
    assert.equal(view.text, '$(sparkle) acc 50% · 30 tok/s');
    assert.equal(view.isError, false);
    assert.match(view.tooltip, /Server: spec-complete serve --stdio/);
  });

  it('spins while a completion is outstanding', () => {
    assert.equal(statusView({ ...READY, busy: true, stats: STATS }).text, '$(sync~spin) acc 50% · 30 tok/s');
  });

  it('turns red with the server\'s message after a failed request', () => {
    const view = statusView({ ...READY, error: 'server busy: 2 in flight' });
    assert.equal(view.text, '$(error) spec-complete');
    assert.equal(view.isError, true);
    assert.match(view.tooltip, /server busy: 2 in flight/);
  });

  it('turns red when the connection failed, even when switched off', () => {
    const view = statusView({ ...READY, enabled: false, connection: 'error', error: 'spawn ENOENT' });
    assert.equal(view.isError, true);
  });

  it('shows off rather than a stale request error once switched off', () => {
    assert.equal(statusView({ ...READY, enabled: false, error: 'server busy' }).text, '$(circle-slash) spec-complete');
  });

  it('says when completions are off, starting or stopped', () => {
    assert.equal(statusView({ ...READY, enabled: false }).text, '$(circle-slash) spec-complete');
    assert.equal(statusView({ ...READY, connection: 'starting' }).text, '$(sync~spin) spec-complete');
    assert.equal(statusView({ ...READY, connection: 'stopped' }).text, '$(debug-disconnect) spec-complete');
  });
});
