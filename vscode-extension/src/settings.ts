// The extension's settings as one plain value, parsed from whatever VS Code's
// configuration returns. No `vscode` import: the parsing is unit-tested under node.

export type ConnectionMode = 'stdio' | 'websocket';
export type DraftMethod = 'none' | 'ngram' | 'model' | 'hybrid';
export type DebounceMode = 'adaptive' | 'fixed';
/** auto: multi-line at an empty line or after a block opener, else the rest of the line. */
export type LinesMode = 'auto' | 'single' | 'multi';

export interface Settings {
  readonly enable: boolean;
  /** languageId -> enabled; the key '*' is the default for languages not listed. */
  readonly languages: Readonly<Record<string, boolean>>;
  readonly connection: ConnectionMode;
  readonly command: string;
  readonly args: readonly string[];
  readonly url: string;
  readonly token: string;
  /** undefined: let the server choose. */
  readonly draft: DraftMethod | undefined;
  readonly maxTokens: number;
  /** adaptive: from the user's typing rhythm and the server's response time (see debounce.ts). */
  readonly debounce: DebounceMode;
  /** The wait in the fixed mode. */
  readonly debounceMs: number;
  readonly lines: LinesMode;
  /** Most lines of a multi-line completion; 0: no limit. */
  readonly maxLines: number;
  readonly statsIntervalS: number;
}

export const DEFAULT_SETTINGS: Settings = {
  enable: true,
  languages: { '*': true, plaintext: false, markdown: false, scminput: false },
  connection: 'stdio',
  command: 'spec-complete',
  args: ['serve', '--stdio'],
  url: 'ws://127.0.0.1:8765',
  token: '',
  draft: undefined,
  maxTokens: 64,
  debounce: 'adaptive',
  debounceMs: 75,
  lines: 'auto',
  maxLines: 0,
  statsIntervalS: 5,
};

const DRAFT_METHODS: readonly string[] = ['none', 'ngram', 'model', 'hybrid'];

/** What `initializationOptions` the server gets; unset fields are left out. */
export interface InitializationOptions extends ServerSettings {
  draft?: DraftMethod;
  maxNewTokens?: number;
}

/** What the server also takes in `workspace/didChangeConfiguration`, so changing it needs no reconnect. */
export interface ServerSettings {
  lines: LinesMode;
  maxLines: number;
  languages: Record<string, boolean>;
}

/** Values a settings lookup may return; each key is the part after `specComplete.`. */
export type RawSettings = Readonly<Record<string, unknown>>;

/** Variables that `${...}` in command, args, url and token may name. */
export interface Expansion {
  readonly workspaceFolder?: string;
  readonly env: Readonly<Record<string, string | undefined>>;
}

export function parseSettings(raw: RawSettings, expansion: Expansion = { env: {} }): Settings {
  const d = DEFAULT_SETTINGS;
  const expand = (text: string) => expandVariables(text, expansion);
  const draft = raw.draft;
  return {
    enable: asBoolean(raw.enable, d.enable),
    languages: asLanguageMap(raw.languages, d.languages),
    connection: raw.connection === 'websocket' ? 'websocket' : 'stdio',
    command: expand(asString(raw.command, d.command).trim() || d.command),
    args: asStringList(raw.args, d.args).map(expand),
    url: expand(asString(raw.url, d.url).trim() || d.url),
    token: expand(asString(raw.token, d.token).trim()),
    draft: typeof draft === 'string' && DRAFT_METHODS.includes(draft) ? (draft as DraftMethod) : undefined,
    maxTokens: asPositiveInt(raw.maxTokens) ?? d.maxTokens,
    debounce: raw.debounce === 'fixed' ? 'fixed' : 'adaptive',
    debounceMs: asPositiveInt(raw.debounceMs, true) ?? d.debounceMs,
    lines: raw.lines === 'single' || raw.lines === 'multi' ? raw.lines : 'auto',
    maxLines: asPositiveInt(raw.maxLines, true) ?? d.maxLines,
    statsIntervalS: asPositiveInt(raw.statsIntervalS, true) ?? d.statsIntervalS,
  };
}

/** Whether ghost text is wanted in a document of this language. */
export function isLanguageEnabled(settings: Settings, languageId: string): boolean {
  if (!settings.enable) {
    return false;
  }
  const own = settings.languages[languageId];
  if (own !== undefined) {
    return own;
  }
  return settings.languages['*'] ?? true;
}

export function initializationOptions(settings: Settings): InitializationOptions {
  const options: InitializationOptions = serverSettings(settings);
  if (settings.draft !== undefined) {
    options.draft = settings.draft;
  }
  options.maxNewTokens = settings.maxTokens;
  return options;
}

export function serverSettings(settings: Settings): ServerSettings {
  return { lines: settings.lines, maxLines: settings.maxLines, languages: { ...settings.languages } };
}

/** Settings whose change needs a new server connection (the rest apply at once). */
export const CONNECTION_KEYS: readonly string[] = [
  'connection', 'command', 'args', 'url', 'token', 'draft', 'maxTokens',
];

/**
 * Replaces `${workspaceFolder}` and `${env:NAME}`; an unknown variable is left as written
 * so that the resulting error names it.
 *   expandVariables('${workspaceFolder}/.venv/bin/spec-complete', {workspaceFolder: '/w', env: {}})
 *     -> '/w/.venv/bin/spec-complete'
 */
export function expandVariables(text: string, expansion: Expansion): string {
  return text.replace(/\$\{(workspaceFolder|env:([A-Za-z_][A-Za-z0-9_]*))\}/g, (whole, name, envName) => {
    if (name === 'workspaceFolder') {
      return expansion.workspaceFolder ?? whole;
    }
    return expansion.env[envName] ?? '';
  });
}

function asBoolean(value: unknown, fallback: boolean): boolean {
  return typeof value === 'boolean' ? value : fallback;
}

function asString(value: unknown, fallback: string): string {
  return typeof value === 'string' ? value : fallback;
}

function asStringList(value: unknown, fallback: readonly string[]): string[] {
  if (Array.isArray(value) && value.every((item) => typeof item === 'string')) {
    return [...value];
  }
  return [...fallback];
}

function asPositiveInt(value: unknown, allowZero = false): number | undefined {
  if (typeof value !== 'number' || !Number.isFinite(value)) {
    return undefined;
  }
  const whole = Math.floor(value);
  return whole > 0 || (allowZero && whole === 0) ? whole : undefined;
}

function asLanguageMap(value: unknown, fallback: Readonly<Record<string, boolean>>): Record<string, boolean> {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return { ...fallback };
  }
  const languages: Record<string, boolean> = {};
  for (const [languageId, enabled] of Object.entries(value)) {
    if (typeof enabled === 'boolean') {
      languages[languageId] = enabled;
    }
  }
  return languages;
}
