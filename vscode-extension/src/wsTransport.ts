// LSP over WebSocket as spec-complete (and pygls) speaks it: each text message is exactly one
// JSON-RPC message, with no Content-Length header. The reader and writer below plug that into
// vscode-jsonrpc, so the language client and the tests share one transport. No `vscode` import.

import WebSocket from 'ws';
import {
  AbstractMessageReader,
  AbstractMessageWriter,
  DataCallback,
  Disposable,
  Message,
  MessageReader,
  MessageWriter,
} from 'vscode-languageserver-protocol';
import { buildWsUrl, redactToken } from './wsUrl';

export class WebSocketMessageReader extends AbstractMessageReader implements MessageReader {
  private callback: DataCallback | undefined;
  // Messages that arrive before listen() is called wait here instead of being dropped.
  private readonly early: Message[] = [];

  constructor(socket: WebSocket) {
    super();
    socket.on('message', (data, isBinary) => this.receive(data, isBinary));
    socket.on('error', (error) => this.fireError(error));
    socket.on('close', () => this.fireClose());
  }

  listen(callback: DataCallback): Disposable {
    this.callback = callback;
    for (const message of this.early.splice(0)) {
      callback(message);
    }
    return Disposable.create(() => {
      this.callback = undefined;
    });
  }

  private receive(data: WebSocket.RawData, isBinary: boolean): void {
    let message: Message;
    try {
      message = JSON.parse(rawDataToText(data, isBinary)) as Message;
    } catch (error) {
      this.fireError(new Error(`a WebSocket message was not JSON: ${String(error)}`));
      return;
    }
    if (this.callback) {
      this.callback(message);
    } else {
      this.early.push(message);
    }
  }
}

export class WebSocketMessageWriter extends AbstractMessageWriter implements MessageWriter {
  private errorCount = 0;

  constructor(private readonly socket: WebSocket) {
    super();
    socket.on('close', () => this.fireClose());
  }

  write(message: Message): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.socket.readyState !== WebSocket.OPEN) {
        const error = new Error('the WebSocket to the spec-complete server is closed');
        this.fireError(error, message, ++this.errorCount);
        reject(error);
        return;
      }
      this.socket.send(JSON.stringify(message), (error) => {
        if (error) {
          this.fireError(error, message, ++this.errorCount);
          reject(error);
        } else {
          this.errorCount = 0;
          resolve();
        }
      });
    });
  }

  end(): void {
    this.socket.close();
  }
}

export interface WebSocketTransport {
  readonly reader: WebSocketMessageReader;
  readonly writer: WebSocketMessageWriter;
  readonly socket: WebSocket;
}

/**
 * Opens `url` with `token` (query parameter and Bearer header) and resolves once the socket
 * is open. A refused handshake rejects with the server's status and message, token hidden.
 */
export function connectWebSocket(url: string, token: string, timeoutMs = 10_000): Promise<WebSocketTransport> {
  const target = buildWsUrl(url, token);
  const shown = redactToken(target);
  return new Promise((resolve, reject) => {
    const socket = new WebSocket(target, {
      headers: token ? { Authorization: `Bearer ${token}` } : {},
      handshakeTimeout: timeoutMs,
    });
    const fail = (reason: string) => {
      socket.removeAllListeners('open');
      reject(new Error(`cannot connect to ${shown}: ${reason}`));
    };
    socket.once('open', () => {
      socket.removeAllListeners('error');
      socket.removeAllListeners('unexpected-response');
      resolve({ reader: new WebSocketMessageReader(socket), writer: new WebSocketMessageWriter(socket), socket });
    });
    socket.once('error', (error) => fail(error.message));
    socket.once('unexpected-response', (request, response) => {
      let body = '';
      response.setEncoding('utf8');
      response.on('data', (chunk: string) => {
        body = (body + chunk).slice(0, 500);
      });
      response.on('end', () => {
        const detail = body.trim() ? ` (${body.trim()})` : '';
        fail(`HTTP ${response.statusCode} ${response.statusMessage ?? ''}`.trim() + detail);
        request.destroy();
      });
    });
  });
}

function rawDataToText(data: WebSocket.RawData, isBinary: boolean): string {
  if (isBinary) {
    throw new Error('binary frame');
  }
  if (Array.isArray(data)) {
    return Buffer.concat(data).toString('utf8');
  }
  if (data instanceof ArrayBuffer) {
    return Buffer.from(data).toString('utf8');
  }
  return data.toString('utf8');
}
