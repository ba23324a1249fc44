#!/usr/bin/env bash
# ensure-mcp-servers.sh installs the servers nobody here wrote that the
# black-box tests run (.ci/mcp/package.json, pinned with its lock file: the
# MCP servers, and Mockoon's CLI serving model replies with the providers'
# rate-limit headers), with
# npm ci into .ci/mcp/node_modules. It does nothing when they are installed
# from the current lock file. Node.js 18+ and npm (and the npm registry) are
# needed; without them it says so and fails.
set -euo pipefail
cd "$(dirname "$0")/../.ci/mcp"

# The stamp is the digest of the lock file the install was made from.
stamp=node_modules/.fanout-lock-sha256
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  cat >&2 <<'MSG'
npm is not installed: the MCP black-box tests run @modelcontextprotocol/server-memory from npm.
Install Node.js 18 or later with npm (Debian: sudo apt-get install -y nodejs npm), then run make test again.
MSG
  exit 1
fi
echo "installing the pinned MCP servers for the black-box tests (npm ci in .ci/mcp)" >&2
npm ci --no-audit --no-fund --loglevel=error >&2
echo "$want" >"$stamp"
