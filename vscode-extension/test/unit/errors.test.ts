import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import { ErrorCodes, LSPErrorCodes, ResponseError } from 'vscode-languageserver-protocol';
import { NotificationThrottle, errorMessage, isCancellation } from '../../src/errors';
import { RestartBudget } from '../../src/restartBudget';

describe('isCancellation', () => {
  it('recognises the JSON-RPC cancellation codes and VS Code\'s CancellationError', () => {
    assert.equal(isCancellation(new ResponseError(LSPErrorCodes.RequestCancelled, 'cancelled')), true);
    assert.equal(isCancellation(new ResponseError(LSPErrorCodes.ServerCancelled, 'x')), true);
    assert.equal(isCancellation(new ResponseError(ErrorCodes.PendingResponseRejected, 'x')), true);
    const canceled = new Error('Canceled');
    canceled.name = 'Canceled';
    assert.equal(isCancellation(canceled), true);
  });

  it('is false for real failures', () => {
    assert.equal(isCancellation(new ResponseError(LSPErrorCodes.RequestFailed, 'server busy')), false);
    assert.equal(isCancellation(new Error('boom')), false);
  });
});

describe('errorMessage', () => {
  it('gives the server\'s message verbatim', () => {
    assert.equal(errorMessage(new ResponseError(-32803, 'server busy: 2 in flight')), 'server busy: 2 in flight');
    assert.equal(errorMessage(new ResponseError(-32603, '')), 'JSON-RPC error -32603');
    assert.equal(errorMessage('plain'), 'plain');
  });
});

describe('NotificationThrottle', () => {
  it('shows each message once per quiet period', () => {
    let now = 0;
    const throttle = new NotificationThrottle(1000, () => now);
    assert.equal(throttle.shouldShow('server busy'), true);
    now = 500;
    assert.equal(throttle.shouldShow('server busy'), false);
    assert.equal(throttle.shouldShow('model failed to load'), true);
    now = 1001;
    assert.equal(throttle.shouldShow('server busy'), true);
  });
});

describe('RestartBudget', () => {
  it('allows maxRestarts within the window, then refuses until they age out', () => {
    let now = 0;
    const budget = new RestartBudget(2, 1000, () => now);
    assert.equal(budget.allow(), true);
    assert.equal(budget.allow(), true);
    assert.equal(budget.allow(), false);
    now = 1001;
    assert.equal(budget.allow(), true);
  });
});
