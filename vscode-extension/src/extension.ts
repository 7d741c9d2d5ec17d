// The VS Code side: settings in, language client up, ghost text through the client's
// inline-completion middleware, commands and the status bar. The logic each step relies
// on lives in the vscode-free modules beside this one.

import * as vscode from 'vscode';
import {
  CloseAction,
  DynamicFeature,
  ErrorAction,
  LanguageClient,
  LanguageClientOptions,
  RevealOutputChannelOn,
  ServerOptions,
  State,
  StaticFeature,
} from 'vscode-languageclient/node';
import {
  DidChangeConfigurationNotification,
  ErrorCodes,
  InlineCompletionItem as ProtocolInlineItem,
  InlineCompletionList as ProtocolInlineList,
  InlineCompletionRequest,
  ResponseError,
} from 'vscode-languageserver-protocol';
import { AdaptiveDebounce } from './debounce';
import { NotificationThrottle, errorMessage, isCancellation } from './errors';
import { BusyTracker, CompletionGate, debounced } from './requestGate';
import {
  CONNECTION_KEYS,
  DEFAULT_SETTINGS,
  RawSettings,
  Settings,
  initializationOptions,
  isLanguageEnabled,
  parseSettings,
  serverSettings,
} from './settings';
import { ServerStats, StatsRequest, formatStatsReport, parseStats } from './stats';
import { RememberedItem, SuggestionCommand, SuggestionMemory } from './suggestionMemory';
import { RestartBudget } from './restartBudget';
import { Connection, statusView } from './statusView';
import { connectWebSocket } from './wsTransport';
import { buildWsUrl, redactToken, remoteWarning } from './wsUrl';

const SECTION = 'specComplete';
// Copilot's notifications, which the server counts (VS Code reports shows and partial accepts only
// to extensions allowed its `inlineCompletionsAdditions` API proposal; full accepts run the item's command).
const SHOWN = 'textDocument/didShowCompletion';
const PARTIALLY_ACCEPTED = 'textDocument/didPartiallyAcceptCompletion';

/** VS Code's inline-completion provider with the proposal's two callbacks, which @types/vscode lacks. */
interface ReportingProvider extends vscode.InlineCompletionItemProvider {
  handleDidShowCompletionItem(item: vscode.InlineCompletionItem): void;
  handleDidPartiallyAcceptCompletionItem(item: vscode.InlineCompletionItem, info: number | object): void;
}

/**
 * The language client without its own inline-completion provider: ghost text goes through the
 * extension's provider, to which VS Code also reports shows and partial accepts.
 */
class SpecCompleteClient extends LanguageClient {
  registerFeature(feature: StaticFeature | DynamicFeature<unknown>): void {
    if ('registrationType' in feature && feature.registrationType.method === InlineCompletionRequest.method) {
      return;
    }
    super.registerFeature(feature);
  }
}

let active: SpecComplete | undefined;

export function activate(context: vscode.ExtensionContext): void {
  active = new SpecComplete();
  context.subscriptions.push(active);
  void active.start();
}

/** VS Code waits for this, so a server started over stdio gets its shutdown and exit. */
export async function deactivate(): Promise<void> {
  await active?.stop();
  active = undefined;
}

class SpecComplete implements vscode.Disposable {
  private settings: Settings = readSettings();
  private client: LanguageClient | undefined;
  private readonly memory = new SuggestionMemory();
  private readonly debounce = new AdaptiveDebounce();
  private responseMs = 0;
  private connection: Connection = 'stopped';
  private lastError: string | undefined;
  private stats: ServerStats | undefined;
  private statsSupported = true;
  private statsTimer: ReturnType<typeof setInterval> | undefined;
  private readonly gate = new CompletionGate();
  private readonly busy = new BusyTracker(() => this.render());
  private readonly throttle = new NotificationThrottle();
  private readonly restarts = new RestartBudget();
  private readonly output = vscode.window.createOutputChannel('spec-complete', { log: true });
  private readonly statusItem = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  private readonly disposables: vscode.Disposable[] = [];

  constructor() {
    this.statusItem.name = 'spec-complete';
    this.statusItem.command = 'specComplete.showStats';
    this.statusItem.show();
    this.disposables.push(
      this.output,
      this.statusItem,
      vscode.commands.registerCommand('specComplete.toggle', () => this.toggle()),
      vscode.commands.registerCommand('specComplete.showStats', () => this.showStats()),
      vscode.commands.registerCommand('specComplete.restartServer', () => this.restart()),
      vscode.commands.registerCommand('specComplete.trigger', () =>
        vscode.commands.executeCommand('editor.action.inlineSuggest.trigger')),
      vscode.workspace.onDidChangeConfiguration((event) => this.onConfigurationChanged(event)),
      vscode.workspace.onDidCloseTextDocument((document) => this.memory.forget(document.uri.toString())),
      vscode.languages.registerInlineCompletionItemProvider(
        [{ scheme: 'file' }, { scheme: 'untitled' }], this.inlineProvider()),
    );
    this.render();
  }

  async start(): Promise<void> {
    this.settings = readSettings();
    this.lastError = undefined;
    this.stats = undefined;
    this.statsSupported = true;
    this.setConnection('starting');
    const client = new SpecCompleteClient('specComplete', 'spec-complete', this.serverOptions(), this.clientOptions());
    this.client = client;
    client.onDidChangeState((event) => {
      if (this.client !== client) {
        return;
      }
      if (event.newState === State.Running) {
        this.lastError = undefined;
        this.setConnection('ready');
      } else if (event.newState === State.Stopped && this.connection !== 'error') {
        this.setConnection('stopped');
      }
    });
    try {
      await client.start();
      this.output.info(`connected to ${this.serverDescription()}`);
      this.startStatsPolling();
      void this.refreshStats();
    } catch (error) {
      if (this.client === client) {
        this.fail(`cannot start the server (${this.serverDescription()}): ${errorMessage(error)}`);
      }
    }
  }

  async stop(): Promise<void> {
    this.stopStatsPolling();
    this.gate.cancelAll();
    const client = this.client;
    this.client = undefined;
    if (client && client.state !== State.Stopped) {
      try {
        await client.stop(2000);
      } catch (error) {
        this.output.warn(`stopping the client: ${errorMessage(error)}`);
      }
    }
    this.setConnection('stopped');
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  dispose(): void {
    void this.stop();
    for (const disposable of this.disposables) {
      disposable.dispose();
    }
  }

  private serverOptions(): ServerOptions {
    const settings = this.settings;
    if (settings.connection === 'websocket') {
      const warning = remoteWarning(settings.url, settings.token);
      if (warning) {
        void vscode.window.showWarningMessage(warning);
      }
      return () => connectWebSocket(settings.url, settings.token);
    }
    const cwd = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
    return { command: settings.command, args: [...settings.args], options: cwd ? { cwd } : {} };
  }

  private clientOptions(): LanguageClientOptions {
    return {
      documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
      initializationOptions: initializationOptions(this.settings),
      outputChannel: this.output,
      // Failures reach the user through fail()/reportError(), with the server's message.
      revealOutputChannelOn: RevealOutputChannelOn.Never,
      errorHandler: {
        error: (_error, _message, count) =>
          ({ action: count !== undefined && count <= 3 ? ErrorAction.Continue : ErrorAction.Shutdown }),
        closed: () => {
          this.onConnectionClosed();
          return { action: CloseAction.DoNotRestart, handled: true };
        },
      },
      middleware: {
        // Ghost text is the product; the suggest widget would ask the model a second time
        // on every keystroke for the same completion.
        provideCompletionItem: () => undefined,
      },
    };
  }

  private inlineProvider(): ReportingProvider {
    return {
      provideInlineCompletionItems: (document, position, context, token) =>
        this.provideInlineCompletions(document, position, context, token),
      handleDidShowCompletionItem: (item) => this.report(SHOWN, item),
      // VS Code calls this twice per partial accept: with the accepted length, then with an info object.
      handleDidPartiallyAcceptCompletionItem: (item, info) => {
        if (typeof info === 'number') {
          this.report(PARTIALLY_ACCEPTED, item, { acceptedLength: info });
        }
      },
    };
  }

  private async provideInlineCompletions(
    document: vscode.TextDocument,
    position: vscode.Position,
    context: vscode.InlineCompletionContext,
    token: vscode.CancellationToken,
  ): Promise<vscode.InlineCompletionItem[] | null> {
    const client = this.client;
    if (!isLanguageEnabled(this.settings, document.languageId) || this.connection === 'stopped' || !client) {
      return null;
    }
    const uri = document.uri.toString();
    const text = document.getText();
    const offset = document.offsetAt(position);
    const remembered = this.memory.answer(uri, text, offset); // typed through, or back to a known state
    if (remembered) {
      return [asItem(remembered, position)];
    }
    const explicit = context.triggerKind === vscode.InlineCompletionTriggerKind.Invoke;
    const wait = explicit ? 0 : this.settings.debounce === 'fixed' ? this.settings.debounceMs : this.debounce.delay(
      Date.now(),
      { charBefore: text.slice(offset - 1, offset), lineAfter: text.slice(offset).split('\n', 1)[0], textAfter: text.slice(offset) },
      this.responseMs,
    );
    try {
      const result = await debounced(this.gate, token, wait, (linked) =>
        this.busy.track(this.requestInline(client, document, position, context, linked)));
      if (result !== undefined && this.lastError !== undefined && this.connection === 'ready') {
        this.lastError = undefined; // the server answers again
        this.render();
      }
      const first = result?.[0];
      if (first) {
        this.memory.remember(uri, text, offset, first);
      }
      return result === undefined || token.isCancellationRequested ? null : result.map((item) => asItem(item, position));
    } catch (error) {
      if (!isCancellation(error) && !token.isCancellationRequested) {
        this.reportError(error);
      }
      return null;
    }
  }

  private async requestInline(
    client: LanguageClient,
    document: vscode.TextDocument,
    position: vscode.Position,
    context: vscode.InlineCompletionContext,
    token: vscode.CancellationToken,
  ): Promise<RememberedItem[]> {
    const started = Date.now();
    const params = client.code2ProtocolConverter.asInlineCompletionParams(document, position, context);
    const result: ProtocolInlineList | ProtocolInlineItem[] | null = await client.sendRequest(
      InlineCompletionRequest.type, params, token);
    this.responseMs = Date.now() - started;
    const items = Array.isArray(result) ? result : result?.items ?? [];
    return items
      .filter((item) => typeof item.insertText === 'string')
      .map((item) => ({ insertText: item.insertText as string, command: item.command as SuggestionCommand | undefined }));
  }

  /** Tells the server what VS Code did with one of its suggestions (items without its command are not its). */
  private report(method: string, item: vscode.InlineCompletionItem, extra: Record<string, unknown> = {}): void {
    const client = this.client;
    const command = item.command;
    if (!client?.isRunning() || !command || typeof item.insertText !== 'string') {
      return;
    }
    const reported = {
      insertText: item.insertText,
      command: { title: command.title, command: command.command, arguments: command.arguments ?? [] },
    };
    client.sendNotification(method, { item: reported, ...extra }).catch((error) =>
      this.output.warn(`${method}: ${errorMessage(error)}`));
  }

  private async toggle(): Promise<void> {
    const config = vscode.workspace.getConfiguration(SECTION);
    const inspected = config.inspect<boolean>('enable');
    const target = inspected?.workspaceValue !== undefined
      ? vscode.ConfigurationTarget.Workspace
      : vscode.ConfigurationTarget.Global;
    const enable = !this.settings.enable;
    await config.update('enable', enable, target);
    vscode.window.setStatusBarMessage(`spec-complete: completions ${enable ? 'on' : 'off'}`, 3000);
  }

  private async showStats(): Promise<void> {
    await this.refreshStats(true);
    if (!this.stats) {
      const why = this.connection === 'error' ? this.lastError : `the server is ${this.connection}`;
      void vscode.window.showWarningMessage(`spec-complete: no stats (${why ?? 'no answer'}).`);
      return;
    }
    const report = formatStatsReport(this.stats);
    this.output.info(`stats\n${report}`);
    void vscode.window.showInformationMessage('spec-complete stats', { modal: true, detail: report });
  }

  private async refreshStats(userAsked = false): Promise<void> {
    const client = this.client;
    if (!client?.isRunning() || (!this.statsSupported && !userAsked)) {
      return;
    }
    try {
      const stats = parseStats(await client.sendRequest(StatsRequest));
      if (stats) {
        this.stats = stats;
        this.render();
      } else {
        this.output.warn('specComplete/stats returned something that is not stats');
      }
    } catch (error) {
      if (error instanceof ResponseError && error.code === ErrorCodes.MethodNotFound) {
        this.statsSupported = false;
        this.output.warn('the server does not implement specComplete/stats; the status bar shows no numbers');
      } else if (userAsked) {
        this.reportError(error);
      } else {
        this.output.warn(`specComplete/stats: ${errorMessage(error)}`);
      }
    }
  }

  private startStatsPolling(): void {
    this.stopStatsPolling();
    if (this.settings.statsIntervalS > 0) {
      this.statsTimer = setInterval(() => void this.refreshStats(), this.settings.statsIntervalS * 1000);
    }
  }

  private stopStatsPolling(): void {
    if (this.statsTimer !== undefined) {
      clearInterval(this.statsTimer);
      this.statsTimer = undefined;
    }
  }

  private onConfigurationChanged(event: vscode.ConfigurationChangeEvent): void {
    if (!event.affectsConfiguration(SECTION)) {
      return;
    }
    const reconnect = CONNECTION_KEYS.some((key) => event.affectsConfiguration(`${SECTION}.${key}`));
    this.settings = readSettings();
    if (!reconnect && this.client?.isRunning()) {
      // lines, maxLines and languages: the server takes them as they are
      void this.client.sendNotification(DidChangeConfigurationNotification.type, {
        settings: { specComplete: serverSettings(this.settings) },
      });
    }
    if (!this.settings.enable) {
      this.gate.cancelAll();
    }
    if (reconnect) {
      this.output.info('connection settings changed; restarting the server connection');
      void this.restart();
    } else {
      this.startStatsPolling();
      this.render();
    }
  }

  /** The server went away without being asked to: reconnect a few times, then give up. */
  private onConnectionClosed(): void {
    if (this.connection !== 'ready') {
      return; // A failed start is reported by start() itself.
    }
    if (!this.restarts.allow()) {
      this.fail('the connection to the server closed 3 times within 3 minutes; not reconnecting');
      return;
    }
    this.output.warn('the connection to the server closed; reconnecting');
    this.setConnection('starting');
    setTimeout(() => void this.restart(), 1000);
  }

  /** A failure of the connection itself: the status bar turns red and the user is told. */
  private fail(message: string): void {
    this.stopStatsPolling();
    this.lastError = message;
    this.setConnection('error');
    this.output.error(message);
    void this.notify(message);
  }

  /** A failed request: the server's message, shown once per 30 s per distinct message. */
  private reportError(error: unknown): void {
    const message = errorMessage(error);
    this.lastError = message;
    this.output.error(`textDocument/inlineCompletion: ${message}`);
    this.render();
    void this.notify(message);
  }

  private async notify(message: string): Promise<void> {
    if (!this.throttle.shouldShow(message)) {
      return;
    }
    const choice = await vscode.window.showErrorMessage(`spec-complete: ${message}`, 'Restart Server', 'Show Log');
    if (choice === 'Restart Server') {
      await this.restart();
    } else if (choice === 'Show Log') {
      this.output.show(true);
    }
  }

  private setConnection(connection: Connection): void {
    this.connection = connection;
    this.render();
  }

  private serverDescription(): string {
    const settings = this.settings;
    if (settings.connection === 'websocket') {
      try {
        return redactToken(buildWsUrl(settings.url, settings.token));
      } catch {
        return settings.url;
      }
    }
    return [settings.command, ...settings.args].join(' ');
  }

  private render(): void {
    const view = statusView({
      enabled: this.settings.enable,
      connection: this.connection,
      busy: this.busy.isBusy,
      error: this.lastError,
      stats: this.stats,
      draft: this.settings.draft,
      server: this.serverDescription(),
    });
    this.statusItem.text = view.text;
    this.statusItem.tooltip = view.tooltip;
    this.statusItem.backgroundColor = view.isError ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
  }
}

function asItem(item: RememberedItem, position: vscode.Position): vscode.InlineCompletionItem {
  const command = item.command ? { ...item.command, arguments: item.command.arguments ?? [] } : undefined;
  return new vscode.InlineCompletionItem(item.insertText, new vscode.Range(position, position), command);
}

function readSettings(): Settings {
  const config = vscode.workspace.getConfiguration(SECTION);
  const raw: Record<string, unknown> = {};
  for (const key of Object.keys(DEFAULT_SETTINGS)) {
    raw[key] = config.get(key);
  }
  return parseSettings(raw as RawSettings, {
    workspaceFolder: vscode.workspace.workspaceFolders?.[0]?.uri.fsPath,
    env: process.env,
  });
}
