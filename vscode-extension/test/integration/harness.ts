// Starts a spec-complete server (the real Python one, or the fake fixture) and connects to it
// the way the extension does: vscode-jsonrpc over stdio, or over our WebSocket transport.

import { ChildProcess, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import * as path from 'node:path';
import {
  ProtocolConnection,
  StreamMessageReader,
  StreamMessageWriter,
  createProtocolConnection,
} from 'vscode-languageserver-protocol/node';
import { connectWebSocket } from '../../src/wsTransport';

export type Transport = 'stdio' | 'ws';

export interface ServerUnderTest {
  readonly name: string;
  readonly command: string;
  /** Arguments before the transport flags, e.g. ['serve', '--target', 'tiny-random']. */
  readonly serveArgs: readonly string[];
  /** How long the server may take to load before it answers (a model may load first). */
  readonly startupMs: number;
  /** Canned completions are known only for the fake. */
  readonly isFake: boolean;
}

export interface Running {
  readonly connection: ProtocolConnection;
  readonly process: ChildProcess;
  readonly stderr: () => string;
  readonly port?: number;
  close(): Promise<void>;
}

const EXTENSION_ROOT = path.resolve(__dirname, '..', '..', '..');
export const REPO_ROOT = path.resolve(EXTENSION_ROOT, '..');

export const FAKE_SERVER: ServerUnderTest = {
  name: 'fake server',
  command: process.execPath,
  serveArgs: [path.join(EXTENSION_ROOT, 'out', 'test', 'fixtures', 'fakeServer.js'), 'serve'],
  startupMs: 10_000,
  isFake: true,
};

/**
 * The real server, or why it cannot be tested here. SPEC_COMPLETE_BIN overrides the executable
 * (default: the repo's .venv/bin/spec-complete) and SPEC_COMPLETE_SERVE_ARGS adds arguments
 * after `serve` (default: `--target tiny-random --no-syntax`, those that `serve --help` lists).
 */
export function realServer(): ServerUnderTest | string {
  const command = process.env.SPEC_COMPLETE_BIN ?? path.join(REPO_ROOT, '.venv', 'bin', 'spec-complete');
  if (!existsSync(command)) {
    return `${command} does not exist`;
  }
  const help = spawnSync(command, ['serve', '--help'], { encoding: 'utf8', timeout: 60_000 });
  if (help.status !== 0) {
    const why = (help.stderr || help.stdout || String(help.error ?? '')).trim().split('\n').at(-1);
    return `\`${path.basename(command)} serve --help\` failed: ${why}`;
  }
  const configured = process.env.SPEC_COMPLETE_SERVE_ARGS;
  // The tiny random model loads in seconds; --no-syntax keeps its gibberish from being
  // trimmed away, so the completions carry text.
  const extra = configured !== undefined
    ? configured.split(/\s+/).filter(Boolean)
    : [
      ...(help.stdout.includes('--target') ? ['--target', 'tiny-random'] : []),
      ...(help.stdout.includes('--no-syntax') ? ['--no-syntax'] : []),
    ];
  return {
    name: 'real server',
    command,
    serveArgs: ['serve', ...extra],
    startupMs: 180_000,
    isFake: false,
  };
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}

export async function launch(server: ServerUnderTest, transport: Transport, token?: string): Promise<Running> {
  if (transport === 'stdio') {
    const child = spawn(server.command, [...server.serveArgs, '--stdio'], { cwd: REPO_ROOT, stdio: 'pipe' });
    const stderr = collect(child);
    const connection = createProtocolConnection(new StreamMessageReader(child.stdout!), new StreamMessageWriter(child.stdin!));
    connection.listen();
    return { connection, process: child, stderr, close: () => shutDown(connection, child) };
  }
  const port = await freePort();
  // The real server makes up a token of its own when given none; the harness always chooses one.
  const secret = token ?? `harness-${randomBytes(12).toString('hex')}`;
  const args = [...server.serveArgs, '--ws', '--host', '127.0.0.1', '--port', String(port), '--token', secret];
  const child = spawn(server.command, args, { cwd: REPO_ROOT, stdio: 'pipe' });
  const stderr = collect(child);
  const transportReady = await retryConnect(`ws://127.0.0.1:${port}`, secret, server.startupMs, child, stderr);
  const connection = createProtocolConnection(transportReady.reader, transportReady.writer);
  connection.listen();
  return {
    connection,
    process: child,
    stderr,
    port,
    close: async () => {
      await shutDown(connection, child, () => transportReady.socket.close());
    },
  };
}

/** Connects once the server listens: the port refuses until the model has loaded. */
async function retryConnect(url: string, token: string, budgetMs: number, child: ChildProcess, stderr: () => string) {
  const deadline = Date.now() + budgetMs;
  for (;;) {
    if (child.exitCode !== null) {
      throw new Error(`the server exited with ${child.exitCode} before listening:\n${stderr()}`);
    }
    try {
      return await connectWebSocket(url, token, 5000);
    } catch (error) {
      if (Date.now() > deadline) {
        throw new Error(`no WebSocket server at ${url} after ${budgetMs} ms (${String(error)}):\n${stderr()}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }
}

async function shutDown(connection: ProtocolConnection, child: ChildProcess, closeTransport?: () => void) {
  try {
    await withTimeout(connection.sendRequest('shutdown'), 5000);
    await connection.sendNotification('exit');
  } catch {
    // A server that cannot shut down cleanly is killed below.
  }
  closeTransport?.();
  connection.dispose();
  const exited = new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) {
      resolve();
    } else {
      child.once('exit', () => resolve());
    }
  });
  const killer = setTimeout(() => child.kill('SIGKILL'), 5000);
  await exited;
  clearTimeout(killer);
}

export function withTimeout<T>(work: Promise<T>, ms: number): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
    work.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error) => {
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}

function collect(child: ChildProcess): () => string {
  let text = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => {
    text = (text + chunk).slice(-20_000);
  });
  return () => text;
}
