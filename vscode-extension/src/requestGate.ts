// Debounce and supersede: a completion request waits `debounceMs` of quiet before it goes to
// the server, and starting a newer one cancels the older, whether it is still waiting or
// already in flight. Cancelling a token handed to vscode-jsonrpc's sendRequest sends
// `$/cancelRequest`, so a user who keeps typing never queues work on the server.
// No `vscode` import: VS Code's CancellationToken has the same shape as vscode-jsonrpc's.

import { CancellationToken, CancellationTokenSource, Disposable } from 'vscode-languageserver-protocol';

/** Resolves true after `ms`, or false as soon as `token` is cancelled. */
export function quietFor(ms: number, token: CancellationToken): Promise<boolean> {
  if (token.isCancellationRequested) {
    return Promise.resolve(false);
  }
  if (ms <= 0) {
    return Promise.resolve(true);
  }
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      listener.dispose();
      resolve(true);
    }, ms);
    const listener = token.onCancellationRequested(() => {
      clearTimeout(timer);
      listener.dispose();
      resolve(false);
    });
  });
}

export interface Ticket {
  /** Cancelled when the caller's token is, or when a newer request begins. */
  readonly token: CancellationToken;
  done(): void;
}

export class CompletionGate {
  private latest: CancellationTokenSource | undefined;

  begin(outer: CancellationToken): Ticket {
    this.latest?.cancel();
    const source = new CancellationTokenSource();
    this.latest = source;
    const link: Disposable = outer.onCancellationRequested(() => source.cancel());
    if (outer.isCancellationRequested) {
      source.cancel();
    }
    return {
      token: source.token,
      done: () => {
        link.dispose();
        if (this.latest === source) {
          this.latest = undefined;
        }
        source.dispose();
      },
    };
  }

  /** Cancels whatever is waiting or in flight (used when completions are switched off). */
  cancelAll(): void {
    this.latest?.cancel();
  }
}

/**
 * Runs `send` for the newest request only: undefined when the request was superseded or
 * cancelled before it was sent; otherwise what `send` resolves to or throws.
 */
export async function debounced<T>(
  gate: CompletionGate,
  outer: CancellationToken,
  debounceMs: number,
  send: (token: CancellationToken) => Promise<T>,
): Promise<T | undefined> {
  const ticket = gate.begin(outer);
  try {
    if (!(await quietFor(debounceMs, ticket.token))) {
      return undefined;
    }
    return await send(ticket.token);
  } finally {
    ticket.done();
  }
}

/**
 * Counts requests in flight and reports busy only when one has been outstanding for
 * `showAfterMs`, so fast completions do not make the status bar flicker.
 */
export class BusyTracker {
  private inFlight = 0;
  private busy = false;
  private timer: ReturnType<typeof setTimeout> | undefined;

  constructor(private readonly onChange: (busy: boolean) => void, private readonly showAfterMs = 250) {}

  async track<T>(work: Promise<T>): Promise<T> {
    this.started();
    try {
      return await work;
    } finally {
      this.finished();
    }
  }

  get isBusy(): boolean {
    return this.busy;
  }

  private started(): void {
    this.inFlight += 1;
    if (this.inFlight === 1 && this.timer === undefined) {
      this.timer = setTimeout(() => {
        this.timer = undefined;
        this.set(this.inFlight > 0);
      }, this.showAfterMs);
    }
  }

  private finished(): void {
    this.inFlight -= 1;
    if (this.inFlight === 0) {
      if (this.timer !== undefined) {
        clearTimeout(this.timer);
        this.timer = undefined;
      }
      this.set(false);
    }
  }

  private set(busy: boolean): void {
    if (busy !== this.busy) {
      this.busy = busy;
      this.onChange(busy);
    }
  }
}
