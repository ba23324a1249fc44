#!/usr/bin/env bash
# generate.sh installs the pinned code generators (if missing), then
# regenerates the Go code for proto/ and for the store's named queries
# (store/queries/*.sql into store/internal/dbsqlc) and the clients' code
# (clients/python, clients/ts), and lints the protos.
#
# Usage: scripts/generate.sh [generate|lint|all]   (default: all)
#   generate  install tools, delete old generated code, run buf generate and sqlc generate
#   lint      install tools, run buf lint
#   all       both
#
# sqlc links the PostgreSQL parser (cgo, so it needs a C compiler: installed
# with apt-get when this runs as root, as ensure-postgres.sh does): its build
# takes about 3 minutes on two cores, so it is built once per machine into
# ${FANOUT_TOOLS_CACHE} (default ${XDG_CACHE_HOME:-~/.cache}/fanout-tools, or
# .tmp/tools in the checkout when that cannot be written), outside the
# checkout, and reused by every clone. Only generate needs it; lint does not.
set -euo pipefail

BUF_VERSION=v1.75.0
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.0
SQLC_VERSION=v1.31.1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${ROOT}/.tmp/bin"
cd "${ROOT}"
export PATH="${BIN}:${PATH}"

# install_tool NAME PACKAGE VERSION installs PACKAGE@VERSION into .tmp/bin
# unless NAME is already there at VERSION (tracked by a stamp file, since not
# every tool reports its version the same way).
install_tool() {
  local name="$1" pkg="$2" version="$3"
  local stamp="${BIN}/.${name}.version"
  if [[ -x "${BIN}/${name}" && -f "${stamp}" && "$(cat "${stamp}")" == "${version}" ]]; then
    return
  fi
  if [[ -x "${BIN}/${name}" && ! -f "${stamp}" ]] && tool_reports_version "${name}" "${version}"; then
    echo "${version}" >"${stamp}"
    return
  fi
  echo "installing ${pkg}@${version} into .tmp/bin" >&2
  mkdir -p "${BIN}"
  GOBIN="${BIN}" go install "${pkg}@${version}"
  echo "${version}" >"${stamp}"
}

# tool_reports_version NAME VERSION reports whether the installed NAME prints
# VERSION (with or without the leading v) from --version.
tool_reports_version() {
  local out
  out="$("${BIN}/$1" --version 2>/dev/null || true)"
  [[ "${out}" == *"${2#v}"* ]]
}

# install_sqlc builds sqlc at SQLC_VERSION into the per-machine cache
# unless it is there, and sets SQLC to its path.
install_sqlc() {
  local cache="${FANOUT_TOOLS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/fanout-tools}"
  if ! mkdir -p "${cache}" 2>/dev/null || [[ ! -w "${cache}" ]]; then
    echo "cannot write ${cache} (set FANOUT_TOOLS_CACHE to choose another place): building sqlc into .tmp/tools" >&2
    cache="${ROOT}/.tmp/tools"
  fi
  local dir="${cache}/sqlc-${SQLC_VERSION}"
  SQLC="${dir}/sqlc"
  if [[ -x "${SQLC}" ]]; then
    return
  fi
  local cc
  cc="$(go env CC)"
  if ! command -v "${cc%% *}" >/dev/null; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
      echo "no C compiler (${cc}) for sqlc's cgo build: installing gcc (apt-get install -y gcc)" >&2
      apt-get update -qq && apt-get install -y -qq gcc >/dev/null
      cc=gcc
    else
      echo "sqlc links the PostgreSQL parser with cgo and needs a C compiler (go env CC: ${cc}): sudo apt-get install -y gcc" >&2
      exit 1
    fi
  fi
  echo "building github.com/sqlc-dev/sqlc@${SQLC_VERSION} into ${dir} (once per machine, about 3 minutes)" >&2
  mkdir -p "${dir}"
  CGO_ENABLED=1 GOBIN="${dir}.tmp" go install "github.com/sqlc-dev/sqlc/cmd/sqlc@${SQLC_VERSION}"
  mv "${dir}.tmp/sqlc" "${SQLC}" && rmdir "${dir}.tmp"
}

install_tools() {
  install_tool buf github.com/bufbuild/buf/cmd/buf "${BUF_VERSION}"
  install_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "${PROTOC_GEN_GO_VERSION}"
  install_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "${PROTOC_GEN_GO_GRPC_VERSION}"
}

generate() {
  # Delete old output first so a renamed or removed .proto leaves no stale
  # *.pb.go behind.
  find proto -name '*.pb.go' -type f -delete
  # Only fanout's own protos: the vendored googleapis ones (proto/google)
  # have their Go code in genproto.
  buf generate --path proto/fanout
  # sqlc checks the queries against the migrations in the order the
  # migrator applies them, with the schema name taken off: sqlc resolves
  # unqualified names in public only (store/sqlc.yaml). It does not know
  # ALTER TYPE ... ADD ATTRIBUTE (it looks for a table of that name); no
  # query of its reads a composite type, so those lines are left out.
  mkdir -p .tmp/sqlc
  cat migrations/versioned/*.sql migrations/functions/*.sql migrations/views/*.sql |
    sed -E 's/\bfanout\.//g' | grep -vE '^ALTER TYPE [a-z_]+ ADD ATTRIBUTE' >.tmp/sqlc/schema.sql
  # The old output is kept aside until sqlc succeeds: a query it refuses
  # leaves the committed code in place, not a broken build.
  rm -rf .tmp/sqlc/dbsqlc.old
  mkdir -p .tmp/sqlc/dbsqlc.old
  if [[ -d store/internal/dbsqlc ]]; then
    mv store/internal/dbsqlc/* .tmp/sqlc/dbsqlc.old/
    rmdir store/internal/dbsqlc
  fi
  if ! (cd store && "${SQLC}" generate); then
    rm -rf store/internal/dbsqlc
    mkdir -p store/internal/dbsqlc
    mv .tmp/sqlc/dbsqlc.old/* store/internal/dbsqlc/
    echo "sqlc refused the queries (above); store/internal/dbsqlc is left as it was" >&2
    exit 1
  fi
  rm -rf .tmp/sqlc/dbsqlc.old
  # The clients' generated code (clients/README.md): Python with Debian's
  # protoc and gRPC plugin (installed as root, else the command printed),
  # TypeScript with protoc-gen-es and tsc into clients/ts/dist (npm ci of
  # its pinned packages when they are missing).
  scripts/ensure-python.sh --packages-only
  clients/python/generate.sh
  clients/ts/generate.sh
}

lint() {
  buf lint
}

cmd="${1:-all}"
case "${cmd}" in
  generate) install_tools; install_sqlc; generate ;;
  lint) install_tools; lint ;;
  all) install_tools; install_sqlc; generate; lint ;;
  *) echo "usage: $0 [generate|lint|all]" >&2; exit 2 ;;
esac
