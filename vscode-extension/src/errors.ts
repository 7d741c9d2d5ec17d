// Turning failures into what the user reads: the server's own message, once, not on every
// keystroke. No `vscode` import.

import { ErrorCodes, LSPErrorCodes, ResponseError } from 'vscode-languageserver-protocol';

/** True for the ways a request ends because someone cancelled it: not an error to show. */
export function isCancellation(error: unknown): boolean {
  if (error instanceof ResponseError) {
    return error.code === LSPErrorCodes.RequestCancelled || error.code === LSPErrorCodes.ServerCancelled ||
      error.code === ErrorCodes.PendingResponseRejected;
  }
  // VS Code's CancellationError.
  return error instanceof Error && error.name === 'Canceled';
}

/** The server's message for a JSON-RPC error, else the error's own text. */
export function errorMessage(error: unknown): string {
  if (error instanceof ResponseError) {
    return error.message || `JSON-RPC error ${error.code}`;
  }
  if (error instanceof Error) {
    return error.message;
  }
  return String(error);
}

/**
 * Lets one notification per distinct message through every `quietMs`: a busy server answers
 * every keystroke with the same error, and the user needs to read it once.
 */
export class NotificationThrottle {
  private readonly lastShown = new Map<string, number>();

  constructor(private readonly quietMs = 30_000, private readonly now: () => number = Date.now) {}

  shouldShow(message: string): boolean {
    const now = this.now();
    const last = this.lastShown.get(message);
    if (last !== undefined && now - last < this.quietMs) {
      return false;
    }
    this.lastShown.set(message, now);
    return true;
  }
}
