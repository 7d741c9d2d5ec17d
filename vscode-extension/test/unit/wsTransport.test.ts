import { strict as assert } from 'node:assert';
import { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { WebSocket, WebSocketServer } from 'ws';
import { RequestType, createProtocolConnection } from 'vscode-languageserver-protocol/node';
import { WebSocketMessageReader, WebSocketMessageWriter, connectWebSocket } from '../../src/wsTransport';

const Echo = new RequestType<{ text: string }, { text: string }, void>('test/echo');

describe('WebSocket transport', () => {
  let server: WebSocketServer;
  let port: number;
  const received: string[] = [];

  before(async () => {
    server = new WebSocketServer({
      host: '127.0.0.1',
      port: 0,
      verifyClient: (info, reply) => {
        const query = new URL(info.req.url ?? '/', 'ws://x').searchParams.get('token');
        if (query === 'right' && info.req.headers.authorization === 'Bearer right') {
          reply(true);
        } else {
          reply(false, 401, 'missing or wrong token');
        }
      },
    });
    await new Promise((resolve) => server.once('listening', resolve));
    port = (server.address() as AddressInfo).port;
    server.on('connection', (socket) => {
      socket.on('message', (data) => received.push(data.toString()));
      const connection = createProtocolConnection(new WebSocketMessageReader(socket), new WebSocketMessageWriter(socket));
      connection.onRequest(Echo, ({ text }) => ({ text: text.toUpperCase() }));
      connection.listen();
    });
  });

  after(() => {
    for (const client of server.clients) {
      client.terminate();
    }
    server.close();
  });

  it('carries JSON-RPC requests both ways, one message per frame, no Content-Length', async () => {
    const transport = await connectWebSocket(`ws://127.0.0.1:${port}`, 'right');
    const connection = createProtocolConnection(transport.reader, transport.writer);
    connection.listen();
    assert.deepEqual(await connection.sendRequest(Echo, { text: 'ghost' }), { text: 'GHOST' });
    const frame = JSON.parse(received.at(-1)!);
    assert.equal(frame.method, 'test/echo');
    assert.equal(received.at(-1)!.includes('Content-Length'), false);
    connection.dispose();
    transport.socket.close();
  });

  it('reports a refused token with the HTTP status and the server\'s reason, token hidden', async () => {
    await assert.rejects(connectWebSocket(`ws://127.0.0.1:${port}`, 'b4d-t0k3n'), (error: Error) => {
      assert.match(error.message, /HTTP 401/);
      assert.match(error.message, /token=\*\*\*/);
      assert.equal(error.message.includes('b4d-t0k3n'), false);
      return true;
    });
  });

  it('reports an unreachable server', async () => {
    const closed = new WebSocketServer({ host: '127.0.0.1', port: 0 });
    await new Promise((resolve) => closed.once('listening', resolve));
    const freePort = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    await assert.rejects(connectWebSocket(`ws://127.0.0.1:${freePort}`, ''), /cannot connect to ws:\/\/127\.0\.0\.1:\d+\/: .*ECONNREFUSED/);
  });

  it('keeps messages that arrive before listen()', async () => {
    const transport = await connectWebSocket(`ws://127.0.0.1:${port}`, 'right');
    const serverSide = [...server.clients].at(-1) as WebSocket;
    serverSide.send(JSON.stringify({ jsonrpc: '2.0', method: 'early/one' }));
    await new Promise((resolve) => setTimeout(resolve, 50));
    const methods: string[] = [];
    transport.reader.listen((message) => methods.push((message as unknown as { method: string }).method));
    assert.deepEqual(methods, ['early/one']);
    transport.socket.close();
  });

  it('fires close on the reader when the server goes away', async () => {
    const transport = await connectWebSocket(`ws://127.0.0.1:${port}`, 'right');
    const closed = new Promise<void>((resolve) => transport.reader.onClose(() => resolve()));
    ([...server.clients].at(-1) as WebSocket).close();
    await closed;
    await assert.rejects(transport.writer.write({ jsonrpc: '2.0' }), /closed/);
  });
});
