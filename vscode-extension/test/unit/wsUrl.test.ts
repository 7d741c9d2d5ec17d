import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import { WsUrlError, buildWsUrl, isLoopbackHost, redactToken, remoteWarning } from '../../src/wsUrl';

describe('buildWsUrl', () => {
  it('adds the token as a query parameter', () => {
    assert.equal(buildWsUrl('ws://gpu-box:8765', 's3cret'), 'ws://gpu-box:8765/?token=s3cret');
  });

  it('leaves the URL alone without a token', () => {
    assert.equal(buildWsUrl('ws://127.0.0.1:8765', ''), 'ws://127.0.0.1:8765/');
  });

  it('replaces a token already in the URL and keeps other parameters', () => {
    assert.equal(buildWsUrl('wss://box:443/lsp?token=old&x=1', 'new'), 'wss://box/lsp?token=new&x=1');
  });

  it('percent-encodes a token with reserved characters', () => {
    assert.equal(buildWsUrl('ws://box:1', 'a&b=c d'), 'ws://box:1/?token=a%26b%3Dc+d');
  });

  it('keeps IPv6 hosts bracketed', () => {
    assert.equal(buildWsUrl('ws://[::1]:8765', 't'), 'ws://[::1]:8765/?token=t');
  });

  it('rejects other schemes and non-URLs with a message naming the input', () => {
    assert.throws(() => buildWsUrl('http://box:8765', 't'), (e: unknown) =>
      e instanceof WsUrlError && /scheme http/.test(e.message));
    assert.throws(() => buildWsUrl('box:8765', 't'), WsUrlError);
    assert.throws(() => buildWsUrl('not a url', 't'), /"not a url" is not a URL/);
  });
});

describe('redactToken', () => {
  it('hides the token and nothing else', () => {
    assert.equal(redactToken('ws://box:1/?token=s3cret&x=1'), 'ws://box:1/?token=***&x=1');
    assert.equal(redactToken('ws://box:1/'), 'ws://box:1/');
  });
});

describe('isLoopbackHost', () => {
  it('accepts 127.0.0.0/8, ::1 and localhost only', () => {
    for (const host of ['127.0.0.1', '127.1.2.3', 'localhost', '::1', '[::1]', 'LOCALHOST']) {
      assert.equal(isLoopbackHost(host), true, host);
    }
    for (const host of ['10.0.0.1', '0.0.0.0', 'gpu-box', '128.0.0.1', '127.example.com']) {
      assert.equal(isLoopbackHost(host), false, host);
    }
  });
});

describe('remoteWarning', () => {
  it('warns about a remote server without a token', () => {
    assert.match(remoteWarning('ws://gpu-box:8765', '') ?? '', /gpu-box is not a loopback address/);
  });

  it('is quiet for loopback, or with a token', () => {
    assert.equal(remoteWarning('ws://127.0.0.1:8765', ''), undefined);
    assert.equal(remoteWarning('ws://gpu-box:8765', 't'), undefined);
  });

  it('takes a token pasted in the URL, as the server prints it', () => {
    assert.equal(remoteWarning('ws://gpu-box:8765/?token=abc', ''), undefined);
    assert.equal(buildWsUrl('ws://127.0.0.1:8765/?token=abc', ''), 'ws://127.0.0.1:8765/?token=abc');
  });
});
