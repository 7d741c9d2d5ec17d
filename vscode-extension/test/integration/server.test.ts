// Drives a spec-complete server through vscode-jsonrpc, the protocol layer the extension's
// language client uses, over stdio and over WebSocket. The fake server always runs; the real
// Python server runs when the repo's .venv has a working `spec-complete serve`, and the suite
// says plainly that it skipped otherwise.

import { strict as assert } from 'node:assert';
import { after, before, describe, it } from 'node:test';
import {
  CancellationTokenSource,
  DidChangeTextDocumentNotification,
  DidOpenTextDocumentNotification,
  ExecuteCommandRequest,
  InitializeRequest,
  InitializeResult,
  InitializedNotification,
  InlineCompletionParams,
  InlineCompletionRequest,
  InlineCompletionTriggerKind,
  LSPErrorCodes,
  RequestType0,
  ResponseError,
} from 'vscode-languageserver-protocol/node';
import { parseStats } from '../../src/stats';
import { connectWebSocket } from '../../src/wsTransport';
import { FAKE_SERVER, Running, ServerUnderTest, Transport, launch, realServer, withTimeout } from './harness';

const TOKEN = 'integration-t0ken';
const URI = 'file:///tmp/spec-complete-integration/example.py';
const StatsRequest = new RequestType0<Record<string, unknown>, void>('specComplete/stats');
const FakeStateRequest = new RequestType0<{ initializationOptions: unknown; documents: Record<string, string> }, void>(
  'fake/state',
);
const ACCEPT_COMMAND = 'specComplete.didAcceptCompletion';

const real = realServer();
const targets: Array<{ server: ServerUnderTest | undefined; name: string; skip: string | false }> = [
  { server: FAKE_SERVER, name: FAKE_SERVER.name, skip: false },
  typeof real === 'string'
    ? { server: undefined, name: 'real server', skip: `SKIPPED: real server unavailable: ${real}` }
    : { server: real, name: real.name, skip: false },
];
if (typeof real === 'string') {
  console.log(`# integration: SKIPPED the real Python server: ${real}`);
}

/** The items of an inline-completion result, in either shape the contract allows. */
function itemsOf(result: unknown): Array<{ insertText: unknown; command?: { command: string; arguments?: unknown[] } }> {
  if (result === null || result === undefined) {
    return [];
  }
  if (Array.isArray(result)) {
    return result;
  }
  return (result as { items: Array<{ insertText: unknown }> }).items;
}

function inlineParams(line: number, character: number): InlineCompletionParams {
  return {
    textDocument: { uri: URI },
    position: { line, character },
    context: { triggerKind: InlineCompletionTriggerKind.Automatic },
  };
}

for (const target of targets) {
  for (const transport of ['stdio', 'ws'] as Transport[]) {
    describe(`${target.name} over ${transport}`, { skip: target.skip }, () => {
      const server = target.server!;
      const completionMs = server.isFake ? 5000 : 120_000;
      let running: Running;
      let initialize: InitializeResult;
      let version = 1;

      before(async () => {
        running = await launch(server, transport, transport === 'ws' ? TOKEN : undefined);
        initialize = await withTimeout(
          running.connection.sendRequest(InitializeRequest.type, {
            processId: process.pid,
            rootUri: null,
            capabilities: { textDocument: { inlineCompletion: { dynamicRegistration: false } } },
            initializationOptions: { draft: 'ngram', maxNewTokens: 16 },
          }),
          server.startupMs,
        );
        await running.connection.sendNotification(InitializedNotification.type, {});
        await running.connection.sendNotification(DidOpenTextDocumentNotification.type, {
          textDocument: { uri: URI, languageId: 'python', version, text: 'import math\n\ndef add(a, b):' },
        });
      });

      after(async () => {
        await running?.close();
      });

      it('advertises inline completions and incremental sync', () => {
        assert.ok(initialize.capabilities.inlineCompletionProvider, 'inlineCompletionProvider is missing');
        const sync = initialize.capabilities.textDocumentSync;
        const change = typeof sync === 'number' ? sync : sync?.change;
        assert.equal(change, 2, 'expected TextDocumentSyncKind.Incremental');
      });

      it('answers textDocument/inlineCompletion with string insertTexts', async (t) => {
        const result = await withTimeout(
          running.connection.sendRequest(InlineCompletionRequest.type, inlineParams(2, 14)),
          completionMs,
        );
        const items = itemsOf(result);
        for (const item of items) {
          assert.equal(typeof item.insertText, 'string');
        }
        if (server.isFake) {
          assert.deepEqual(items.map((item) => item.insertText), ['\n    return a + b']);
        } else {
          t.diagnostic(`real server completed 'def add(a, b):' with ${JSON.stringify(items)}`);
          if (server.serveArgs.includes('--no-syntax')) {
            assert.ok(items.length > 0 && items.every((item) => item.insertText !== ''), 'no completion text');
          }
        }
      });

      it('completes against the document as edited by incremental changes', async () => {
        // 'def add(a, b):' -> 'def greet(name):' in two edits.
        await running.connection.sendNotification(DidChangeTextDocumentNotification.type, {
          textDocument: { uri: URI, version: ++version },
          contentChanges: [
            { range: { start: { line: 2, character: 4 }, end: { line: 2, character: 7 } }, text: 'greet' },
            { range: { start: { line: 2, character: 10 }, end: { line: 2, character: 14 } }, text: 'name' },
          ],
        });
        const result = await withTimeout(
          running.connection.sendRequest(InlineCompletionRequest.type, inlineParams(2, 16)),
          completionMs,
        );
        if (server.isFake) {
          const state = await running.connection.sendRequest(FakeStateRequest);
          assert.equal(state.documents[URI], 'import math\n\ndef greet(name):');
          assert.deepEqual(state.initializationOptions, { draft: 'ngram', maxNewTokens: 16 });
          assert.deepEqual(itemsOf(result).map((item) => item.insertText), ['\n    return f"Hello, {name}!"']);
        } else {
          assert.ok(Array.isArray(itemsOf(result)));
        }
      });

      it('turns a cancelled token into $/cancelRequest and keeps serving', async (t) => {
        const slowLine = '# slow: ';
        await running.connection.sendNotification(DidChangeTextDocumentNotification.type, {
          textDocument: { uri: URI, version: ++version },
          contentChanges: [{ range: { start: { line: 2, character: 16 }, end: { line: 2, character: 16 } }, text: `\n${slowLine}` }],
        });
        const source = new CancellationTokenSource();
        const started = Date.now();
        const pending = running.connection.sendRequest(InlineCompletionRequest.type, inlineParams(3, slowLine.length), source.token);
        // The fake's `slow` completion is surely in flight after 50 ms; the real server may
        // answer within that, so its request is cancelled straight after it is sent.
        if (server.isFake) {
          setTimeout(() => source.cancel(), 50);
        } else {
          source.cancel();
        }
        let outcome: string;
        try {
          await withTimeout(pending, completionMs);
          outcome = 'answered'; // the server may finish before the cancel arrives
        } catch (error) {
          assert.ok(error instanceof ResponseError, String(error));
          assert.equal(error.code, LSPErrorCodes.RequestCancelled);
          outcome = 'cancelled';
        }
        t.diagnostic(`the cancelled request was ${outcome} after ${Date.now() - started} ms`);
        if (server.isFake) {
          assert.equal(outcome, 'cancelled');
          assert.ok(Date.now() - started < 2000, 'the fake should stop its 5 s completion at once');
        }
        const stats = parseStats(await withTimeout(running.connection.sendRequest(StatsRequest), completionMs));
        assert.ok(stats, 'stats after a cancel');
        if (server.isFake) {
          assert.equal(stats.cancelled, 1);
        }
        const after = await withTimeout(
          running.connection.sendRequest(InlineCompletionRequest.type, inlineParams(2, 16)),
          completionMs,
        );
        assert.ok(Array.isArray(itemsOf(after)), 'the server answers after a cancel');
      });

      it('counts a shown and accepted suggestion, and the accept rate, in specComplete/stats', async () => {
        const uri = `${URI}.accept.py`;
        await running.connection.sendNotification(DidOpenTextDocumentNotification.type, {
          textDocument: { uri, languageId: 'python', version: 1, text: 'def add(a, b):' },
        });
        const before = parseStats(await withTimeout(running.connection.sendRequest(StatsRequest), completionMs))!;
        const result = await withTimeout(
          running.connection.sendRequest(InlineCompletionRequest.type, { ...inlineParams(0, 14), textDocument: { uri } }),
          completionMs,
        );
        const [item] = itemsOf(result);
        assert.ok(item, 'no completion to accept');
        assert.equal(item.command?.command, ACCEPT_COMMAND);
        await running.connection.sendNotification('textDocument/didShowCompletion', { item });
        await running.connection.sendNotification(DidChangeTextDocumentNotification.type, {
          textDocument: { uri, version: 2 },
          contentChanges: [{ range: { start: { line: 0, character: 14 }, end: { line: 0, character: 14 } }, text: item.insertText as string }],
        });
        await withTimeout(running.connection.sendRequest(ExecuteCommandRequest.type, {
          command: ACCEPT_COMMAND, arguments: item.command?.arguments,
        }), completionMs);
        const after = parseStats(await withTimeout(running.connection.sendRequest(StatsRequest), completionMs))!;
        assert.equal(after.suggestions.shown, before.suggestions.shown + 1);
        assert.equal(after.suggestions.accepted, before.suggestions.accepted + 1);
        assert.equal(after.suggestions.acceptRate, after.suggestions.accepted / after.suggestions.shown);
      });

      it('takes lines and maxLines at initialize and in workspace/didChangeConfiguration', async () => {
        await running.connection.sendNotification('workspace/didChangeConfiguration', {
          settings: { specComplete: { lines: 'single', maxLines: 2, languages: { '*': true } } },
        });
        const result = await withTimeout(running.connection.sendRequest(InlineCompletionRequest.type, inlineParams(2, 16)), completionMs);
        for (const item of server.isFake ? [] : itemsOf(result)) { // the fake's canned texts ignore it
          assert.ok(!(item.insertText as string).includes('\n'), `single-line, yet: ${JSON.stringify(item)}`);
        }
        if (server.isFake) {
          const state = await running.connection.sendRequest(FakeStateRequest) as unknown as { configurations: unknown[] };
          assert.deepEqual(state.configurations.at(-1), { specComplete: { lines: 'single', maxLines: 2, languages: { '*': true } } });
        }
        await running.connection.sendNotification('workspace/didChangeConfiguration', {
          settings: { specComplete: { lines: 'multi', maxLines: 0 } },
        });
      });

      it('returns specComplete/stats in the contract\'s shape', async () => {
        const raw = await withTimeout(running.connection.sendRequest(StatsRequest), completionMs);
        for (const key of ['requests', 'cancelled', 'tokens', 'target_forwards', 'acceptance', 'ttft_p50_s', 'ttft_p95_s', 'tokens_per_s', 'suggestions', 'cache_hits']) {
          assert.ok(key in raw, `stats lack ${key}: ${JSON.stringify(raw)}`);
        }
        const acceptance = raw.acceptance as Record<string, unknown>;
        assert.ok('ngram' in acceptance && 'model' in acceptance, `acceptance: ${JSON.stringify(acceptance)}`);
        const stats = parseStats(raw);
        assert.ok(stats && stats.requests >= 3, `requests: ${JSON.stringify(raw)}`);
      });

      if (server.isFake) {
        it('passes a server error on with its message', async () => {
          await running.connection.sendNotification(DidChangeTextDocumentNotification.type, {
            textDocument: { uri: URI, version: ++version },
            contentChanges: [{ range: { start: { line: 3, character: 0 }, end: { line: 3, character: 0 } }, text: 'busy ' }],
          });
          await assert.rejects(
            running.connection.sendRequest(InlineCompletionRequest.type, inlineParams(3, 5)),
            (error: unknown) => error instanceof ResponseError && /server busy/.test(error.message),
          );
        });
      }

      if (transport === 'ws') {
        it('refuses a WebSocket client without the right token', async () => {
          const url = `ws://127.0.0.1:${running.port}`;
          await assert.rejects(connectWebSocket(url, 'not-the-token', 5000), /HTTP 40[13]/);
          await assert.rejects(connectWebSocket(url, '', 5000), /HTTP 40[13]/);
        });
      }
    });
  }
}
