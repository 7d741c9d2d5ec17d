import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import { CancellationToken, CancellationTokenSource } from 'vscode-languageserver-protocol';
import { BusyTracker, CompletionGate, debounced, quietFor } from '../../src/requestGate';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('quietFor', () => {
  it('resolves true after the wait', async () => {
    assert.equal(await quietFor(5, CancellationToken.None), true);
  });

  it('resolves false at once when cancelled during the wait', async () => {
    const source = new CancellationTokenSource();
    const started = Date.now();
    const waiting = quietFor(10_000, source.token);
    source.cancel();
    assert.equal(await waiting, false);
    assert.ok(Date.now() - started < 1000);
  });

  it('resolves false for a token cancelled before the wait', async () => {
    const source = new CancellationTokenSource();
    source.cancel();
    assert.equal(await quietFor(5, source.token), false);
  });
});

describe('CompletionGate', () => {
  it('cancels the older request when a newer one begins', () => {
    const gate = new CompletionGate();
    const first = gate.begin(CancellationToken.None);
    const second = gate.begin(CancellationToken.None);
    assert.equal(first.token.isCancellationRequested, true);
    assert.equal(second.token.isCancellationRequested, false);
  });

  it('passes on the caller\'s cancellation', () => {
    const gate = new CompletionGate();
    const outer = new CancellationTokenSource();
    const ticket = gate.begin(outer.token);
    outer.cancel();
    assert.equal(ticket.token.isCancellationRequested, true);
  });

  it('starts cancelled when the caller\'s token already is', () => {
    const outer = new CancellationTokenSource();
    outer.cancel();
    assert.equal(new CompletionGate().begin(outer.token).token.isCancellationRequested, true);
  });

  it('does not cancel a newer request when an older one finishes', () => {
    const gate = new CompletionGate();
    const first = gate.begin(CancellationToken.None);
    const second = gate.begin(CancellationToken.None);
    first.done();
    gate.begin(CancellationToken.None); // would cancel `second` only if it were still the latest
    assert.equal(second.token.isCancellationRequested, true);
    const third = gate.begin(CancellationToken.None);
    second.done();
    assert.equal(third.token.isCancellationRequested, false);
  });

  it('cancelAll cancels what is in flight', () => {
    const gate = new CompletionGate();
    const ticket = gate.begin(CancellationToken.None);
    gate.cancelAll();
    assert.equal(ticket.token.isCancellationRequested, true);
  });
});

describe('debounced', () => {
  it('sends only the last of a burst of keystrokes', async () => {
    const gate = new CompletionGate();
    const sent: number[] = [];
    const send = (n: number) => async () => {
      sent.push(n);
      return n;
    };
    const burst = [1, 2, 3].map((n) => debounced(gate, CancellationToken.None, 20, send(n)));
    assert.deepEqual(await Promise.all(burst), [undefined, undefined, 3]);
    assert.deepEqual(sent, [3]);
  });

  it('cancels the in-flight request\'s token when the user types again', async () => {
    const gate = new CompletionGate();
    let inFlight: CancellationToken | undefined;
    const slow = debounced(gate, CancellationToken.None, 0, async (token) => {
      inFlight = token;
      await quietFor(10_000, token);
      return token.isCancellationRequested ? 'cancelled' : 'finished';
    });
    await sleep(5);
    assert.equal(inFlight?.isCancellationRequested, false);
    const next = debounced(gate, CancellationToken.None, 0, async () => 'next');
    assert.equal(inFlight?.isCancellationRequested, true);
    assert.deepEqual(await Promise.all([slow, next]), ['cancelled', 'next']);
  });

  it('does not send when VS Code cancels during the debounce', async () => {
    const outer = new CancellationTokenSource();
    let sent = false;
    const pending = debounced(new CompletionGate(), outer.token, 10_000, async () => {
      sent = true;
    });
    outer.cancel();
    assert.equal(await pending, undefined);
    assert.equal(sent, false);
  });

  it('passes the server\'s error through', async () => {
    const failing = debounced(new CompletionGate(), CancellationToken.None, 0, async () => {
      throw new Error('server busy');
    });
    await assert.rejects(failing, /server busy/);
  });
});

describe('BusyTracker', () => {
  it('reports busy only for work outstanding past the threshold', async () => {
    const changes: boolean[] = [];
    const tracker = new BusyTracker((busy) => changes.push(busy), 20);
    await tracker.track(sleep(1));
    assert.deepEqual(changes, []); // quick work: no flicker
    await tracker.track(sleep(60));
    assert.deepEqual(changes, [true, false]);
  });

  it('stays busy while any request is in flight', async () => {
    const changes: boolean[] = [];
    const tracker = new BusyTracker((busy) => changes.push(busy), 5);
    const long = tracker.track(sleep(60));
    await tracker.track(sleep(30));
    assert.equal(tracker.isBusy, true);
    await long;
    assert.equal(tracker.isBusy, false);
    assert.deepEqual(changes, [true, false]);
  });

  it('ends busy when the work fails', async () => {
    const tracker = new BusyTracker(() => undefined, 0);
    await assert.rejects(tracker.track(sleep(10).then(() => Promise.reject(new Error('x')))));
    assert.equal(tracker.isBusy, false);
  });
});
