// Where a remote server is reached, and how the token travels: as the query parameter
// `ws://host:port/?token=T` (the server also takes `Authorization: Bearer T`, which
// connectWebSocket sends too). No `vscode` import.

export class WsUrlError extends Error {}

/**
 * The URL to open for `url` and `token`: the scheme must be ws or wss, a missing path
 * becomes '/', and a non-empty token replaces any `token` the URL already carries.
 *   buildWsUrl('ws://gpu-box:8765', 's3cret') -> 'ws://gpu-box:8765/?token=s3cret'
 */
export function buildWsUrl(url: string, token: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url.trim());
  } catch {
    throw new WsUrlError(`"${url}" is not a URL; expected ws://host:port`);
  }
  if (parsed.protocol !== 'ws:' && parsed.protocol !== 'wss:') {
    throw new WsUrlError(`"${url}" has scheme ${parsed.protocol.replace(':', '')}; expected ws or wss`);
  }
  if (token) {
    parsed.searchParams.set('token', token);
  }
  return parsed.toString();
}

/** The same URL with its token hidden, for logs and error messages. */
export function redactToken(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.searchParams.has('token')) {
      parsed.searchParams.set('token', '***');
    }
    return parsed.toString();
  } catch {
    return url.replace(/([?&]token=)[^&#]*/g, '$1***');
  }
}

/** 127.0.0.0/8, ::1 and localhost: the addresses a server may bind without a token. */
export function isLoopbackHost(hostname: string): boolean {
  const host = hostname.replace(/^\[|\]$/g, '').toLowerCase();
  return host === 'localhost' || host === '::1' || /^127(\.\d{1,3}){3}$/.test(host);
}

/**
 * A warning to show before connecting, or undefined when the pair looks usable. A token may
 * come from the setting or from the URL itself (`spec-complete serve --ws` prints
 * `ws://127.0.0.1:8765/?token=T`, ready to paste). A loopback server without a token is not
 * warned about: it may have been started with --no-token, and if not, its refusal says how.
 */
export function remoteWarning(url: string, token: string): string | undefined {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return undefined; // buildWsUrl reports the malformed URL itself.
  }
  const host = parsed.hostname;
  if (!token && !parsed.searchParams.get('token') && !isLoopbackHost(host)) {
    return `spec-complete: ${host} is not a loopback address, and a remote server requires a token ` +
      '(setting specComplete.token).';
  }
  return undefined;
}
