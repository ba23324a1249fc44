#!/usr/bin/env bash
# ensure-python.sh makes the Python client's test environment, .tmp/py: a
# virtual environment over Debian's python3 that sees Debian's binary
# packages of grpcio, protobuf and pytest (--system-site-packages), with
# clients/python installed into it (editable, no dependency resolved, no
# index asked). PyPI is not reachable from the machines this builds on, and
# grpcio built from source takes 20-40 minutes on two cores: Debian's
# packages are the pinned binaries. It also installs protoc and the gRPC
# Python plugin that make generate uses for clients/python.
#
# The packages are installed with apt-get when this runs as root and
# something is missing; otherwise it prints the command and fails. It does
# nothing when .tmp/py is current (its stamp names the package list and
# clients/python/pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian 12 (bookworm). grpcio 1.51 and protobuf 4.21 (Debian numbers the
# latter by its C++ release, 3.21.12) are what the generated code targets.
PACKAGES=(
  python3-grpcio=1.51.1-3+b1
  python3-protobuf=3.21.12-3
  python3-pytest=7.2.1-2
  protobuf-compiler=3.21.12-3
  protobuf-compiler-grpc=1.51.1-3+b1
  python3-fastapi=0.92.0-1
  python3-uvicorn=0.17.6-1
  python3-httpx=0.23.3-1
  # Whatever bookworm's current release is: venv and the editable install.
  python3-venv
  python3-setuptools
  python3-wheel
)

missing=()
for p in "${PACKAGES[@]}"; do
  name="${p%%=*}"
  want="${p#*=}"
  have="$(dpkg-query -W -f='${Version}' "$name" 2>/dev/null || true)"
  if [[ -z "$have" || ("$want" != "$name" && "$have" != "$want") ]]; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "installing the Python client's packages from Debian: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --allow-downgrades "${missing[@]}" >&2 ||
      { apt-get update -q >&2 && apt-get install -y -q --allow-downgrades "${missing[@]}" >&2; }
  else
    echo "the Python client's tests need Debian's packages: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

[[ "${1:-}" == "--packages-only" ]] && exit 0

stamp=.tmp/py/.fanout-stamp
want="$(printf '%s\n' "${PACKAGES[@]}" | cat - clients/python/pyproject.toml | sha256sum | cut -d' ' -f1)"
if [[ -x .tmp/py/bin/python && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
rm -rf .tmp/py
/usr/bin/python3 -m venv --system-site-packages .tmp/py
.tmp/py/bin/python -m pip install -q --no-deps --no-build-isolation --no-index -e clients/python >&2
echo "$want" >"$stamp"
