import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import {
  CONNECTION_KEYS,
  DEFAULT_SETTINGS,
  expandVariables,
  initializationOptions,
  isLanguageEnabled,
  parseSettings,
  serverSettings,
} from '../../src/settings';

describe('parseSettings', () => {
  it('gives the defaults for an empty configuration', () => {
    assert.deepEqual(parseSettings({}), DEFAULT_SETTINGS);
  });

  it('reads every setting a user can write', () => {
    const settings = parseSettings({
      enable: false,
      languages: { '*': false, python: true },
      connection: 'websocket',
      command: '/opt/sc/bin/spec-complete',
      args: ['serve', '--stdio', '--target', 'tiny'],
      url: 'ws://gpu-box:9000',
      token: 't0k',
      draft: 'ngram',
      maxTokens: 32,
      debounceMs: 0,
      statsIntervalS: 0,
    });
    assert.equal(settings.enable, false);
    assert.deepEqual(settings.languages, { '*': false, python: true });
    assert.equal(settings.connection, 'websocket');
    assert.equal(settings.command, '/opt/sc/bin/spec-complete');
    assert.deepEqual(settings.args, ['serve', '--stdio', '--target', 'tiny']);
    assert.equal(settings.url, 'ws://gpu-box:9000');
    assert.equal(settings.token, 't0k');
    assert.equal(settings.draft, 'ngram');
    assert.equal(settings.maxTokens, 32);
    assert.equal(settings.debounceMs, 0); // zero debounce is allowed: request at once
    assert.equal(settings.statsIntervalS, 0);
  });

  it('falls back to defaults for values of the wrong type or range', () => {
    const settings = parseSettings({
      enable: 'yes',
      languages: ['python'],
      connection: 'tcp',
      command: '   ',
      args: ['serve', 3],
      draft: 'eagle',
      maxTokens: -5,
      debounceMs: Number.NaN,
    });
    assert.equal(settings.enable, true);
    assert.deepEqual(settings.languages, DEFAULT_SETTINGS.languages);
    assert.equal(settings.connection, 'stdio');
    assert.equal(settings.command, 'spec-complete');
    assert.deepEqual(settings.args, ['serve', '--stdio']);
    assert.equal(settings.draft, undefined);
    assert.equal(settings.maxTokens, 64);
    assert.equal(settings.debounceMs, 75);
  });

  it('leaves the draft method to the server when the setting says "server"', () => {
    assert.equal(parseSettings({ draft: 'server' }).draft, undefined);
  });

  it('drops per-language entries that are not booleans', () => {
    assert.deepEqual(parseSettings({ languages: { python: true, go: 'no' } }).languages, { python: true });
  });

  it('expands ${workspaceFolder} and ${env:NAME} in command, args, url and token', () => {
    const settings = parseSettings(
      {
        command: '${workspaceFolder}/.venv/bin/spec-complete',
        args: ['serve', '--stdio', '--cache', '${env:HOME}/cache'],
        url: 'ws://${env:GPU_HOST}:8765',
        token: '${env:SPEC_COMPLETE_TOKEN}',
      },
      { workspaceFolder: '/w', env: { HOME: '/home/me', GPU_HOST: 'box', SPEC_COMPLETE_TOKEN: 's3' } },
    );
    assert.equal(settings.command, '/w/.venv/bin/spec-complete');
    assert.deepEqual(settings.args, ['serve', '--stdio', '--cache', '/home/me/cache']);
    assert.equal(settings.url, 'ws://box:8765');
    assert.equal(settings.token, 's3');
  });
});

describe('expandVariables', () => {
  it('keeps ${workspaceFolder} when there is no folder, so the error names it', () => {
    assert.equal(expandVariables('${workspaceFolder}/x', { env: {} }), '${workspaceFolder}/x');
  });

  it('turns an unset environment variable into the empty string', () => {
    assert.equal(expandVariables('a${env:NOPE}b', { env: {} }), 'ab');
  });
});

describe('isLanguageEnabled', () => {
  const settings = parseSettings({ languages: { '*': true, markdown: false } });

  it('follows the language\'s own entry, then "*"', () => {
    assert.equal(isLanguageEnabled(settings, 'python'), true);
    assert.equal(isLanguageEnabled(settings, 'markdown'), false);
  });

  it('allows only listed languages when "*" is false', () => {
    const only = parseSettings({ languages: { '*': false, python: true } });
    assert.equal(isLanguageEnabled(only, 'python'), true);
    assert.equal(isLanguageEnabled(only, 'go'), false);
  });

  it('is false everywhere when completions are toggled off', () => {
    assert.equal(isLanguageEnabled(parseSettings({ enable: false }), 'python'), false);
  });

  it('defaults to enabled when the map has neither the language nor "*"', () => {
    assert.equal(isLanguageEnabled(parseSettings({ languages: {} }), 'rust'), true);
  });
});

describe('initializationOptions', () => {
  it('sends the draft method and token limit in the contract\'s names', () => {
    assert.deepEqual(initializationOptions(parseSettings({ draft: 'hybrid', maxTokens: 16 })), {
      draft: 'hybrid',
      maxNewTokens: 16,
      lines: 'auto',
      maxLines: 0,
      languages: { '*': true, plaintext: false, markdown: false, scminput: false },
    });
  });

  it('leaves out the draft method when the server chooses', () => {
    assert.equal('draft' in initializationOptions(parseSettings({})), false);
  });

  it('sends lines, maxLines and languages, which the server also takes without a reconnect', () => {
    const settings = parseSettings({ lines: 'single', maxLines: 3, languages: { '*': false, python: true } });
    assert.deepEqual(serverSettings(settings), { lines: 'single', maxLines: 3, languages: { '*': false, python: true } });
    assert.ok(!CONNECTION_KEYS.includes('lines') && !CONNECTION_KEYS.includes('maxLines'));
  });
});

describe('debounce, lines and maxLines', () => {
  it('default to adaptive, auto and no line limit', () => {
    const settings = parseSettings({});
    assert.deepEqual([settings.debounce, settings.lines, settings.maxLines], ['adaptive', 'auto', 0]);
  });

  it('take valid values and fall back on nonsense', () => {
    const chosen = parseSettings({ debounce: 'fixed', lines: 'multi', maxLines: 5 });
    assert.deepEqual([chosen.debounce, chosen.lines, chosen.maxLines], ['fixed', 'multi', 5]);
    const nonsense = parseSettings({ debounce: 'sometimes', lines: 2, maxLines: -3 });
    assert.deepEqual([nonsense.debounce, nonsense.lines, nonsense.maxLines], ['adaptive', 'auto', 0]);
  });
});
