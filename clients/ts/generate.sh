#!/usr/bin/env bash
# generate.sh makes @fanout/client's committed code: protoc-gen-es's
# TypeScript in src/gen (from proto/ and clients/ts/proto), then tsc's
# JavaScript and declarations in dist/. dist/ is committed so that the
# package installs from the repository without a build step.
#
# Deterministic: both directories are deleted first, the tools are the
# exact versions of package-lock.json (npm ci when node_modules is missing
# or stale) and buf is the repository's pinned .tmp/bin/buf (scripts/
# generate.sh installs it). A second run writes byte-identical files.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
buf="${root}/.tmp/bin/buf"

if [[ ! -x "${buf}" ]]; then
  echo "generate.sh: ${buf} is missing; run scripts/generate.sh lint to install buf" >&2
  exit 1
fi

cd "${here}"
# npm ci when node_modules is missing or older than package-lock.json (npm
# writes node_modules/.package-lock.json as it installs).
if [[ ! -f node_modules/.package-lock.json || package-lock.json -nt node_modules/.package-lock.json ]]; then
  npm ci --ignore-scripts --no-audit --no-fund >/dev/null
fi

rm -rf src/gen dist
cd "${root}"
"${buf}" generate --template clients/ts/buf.gen.yaml \
  --path proto/fanout/v1/orchestrator.proto --path proto/fanout/v1/run.proto --path proto/google/api
"${buf}" generate --template clients/ts/buf.gen.yaml clients/ts/proto

cd "${here}"
node_modules/.bin/tsc -p tsconfig.json
