#!/usr/bin/env bash
# generate.sh installs the pinned protobuf tools into .tmp/bin (if missing),
# then regenerates the Go code for proto/ and lints the protos.
#
# Usage: scripts/generate.sh [generate|lint|all]   (default: all)
#   generate  install tools, delete old *.pb.go under proto/, run buf generate
#   lint      install tools, run buf lint
#   all       both
set -euo pipefail

BUF_VERSION=v1.75.0
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.0

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

install_tools() {
  install_tool buf github.com/bufbuild/buf/cmd/buf "${BUF_VERSION}"
  install_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "${PROTOC_GEN_GO_VERSION}"
  install_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "${PROTOC_GEN_GO_GRPC_VERSION}"
}

generate() {
  # Delete old output first so a renamed or removed .proto leaves no stale
  # *.pb.go behind.
  find proto -name '*.pb.go' -type f -delete
  buf generate
}

lint() {
  buf lint
}

cmd="${1:-all}"
case "${cmd}" in
  generate) install_tools; generate ;;
  lint) install_tools; lint ;;
  all) install_tools; generate; lint ;;
  *) echo "usage: $0 [generate|lint|all]" >&2; exit 2 ;;
esac
