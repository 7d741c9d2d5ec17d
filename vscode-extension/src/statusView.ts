// What the status bar item says in each state. No `vscode` import: icons are the
// `$(name)` codicon syntax, which is plain text until VS Code renders it.

import { DraftMethod } from './settings';
import { ServerStats, formatStatusText } from './stats';

export type Connection = 'stopped' | 'starting' | 'ready' | 'error';

export interface StatusState {
  readonly enabled: boolean;
  readonly connection: Connection;
  readonly busy: boolean;
  /** Why the connection failed, or the last request's error until a request succeeds. */
  readonly error: string | undefined;
  readonly stats: ServerStats | undefined;
  readonly draft: DraftMethod | undefined;
  /** Where the server is: the command or the redacted URL. */
  readonly server: string;
}

export interface StatusView {
  readonly text: string;
  readonly tooltip: string;
  readonly isError: boolean;
}

export function statusView(state: StatusState): StatusView {
  const numbers = state.stats ? formatStatusText(state.stats, state.draft) : 'spec-complete';
  const where = `Server: ${state.server}`;
  const failed = {
    text: '$(error) spec-complete',
    tooltip: `spec-complete: ${state.error ?? 'error'}\n${where}\nClick for stats; run "spec-complete: Restart Server" to retry.`,
    isError: true,
  };
  if (state.connection === 'error') {
    return failed;
  }
  if (!state.enabled) {
    // A request's error no longer matters once the user has switched completions off.
    return { text: '$(circle-slash) spec-complete', tooltip: `spec-complete: completions off\n${where}`, isError: false };
  }
  if (state.connection === 'ready' && state.error !== undefined) {
    return failed;
  }
  if (state.connection === 'starting' || state.connection === 'stopped') {
    const verb = state.connection === 'starting' ? 'starting' : 'stopped';
    const icon = state.connection === 'starting' ? '$(sync~spin)' : '$(debug-disconnect)';
    return { text: `${icon} spec-complete`, tooltip: `spec-complete: server ${verb}\n${where}`, isError: false };
  }
  const icon = state.busy ? '$(sync~spin)' : '$(sparkle)';
  const activity = state.busy ? 'completing…' : 'ready';
  const detail = state.stats
    ? '\nacc: share of drafted tokens the model accepted (n-gram/model); tok/s: generation speed;' +
      ' taken: share of shown suggestions you accepted'
    : '';
  return { text: `${icon} ${numbers}`, tooltip: `spec-complete: ${activity}${detail}\n${where}`, isError: false };
}
