#!/usr/bin/env bash
# ensure-postgres.sh makes sure the PostgreSQL server binaries (initdb, pg_ctl,
# postgres) exist, so tests and the demo can start a private cluster. They are
# not needed when TEST_DATABASE_URL names a server. As root on Debian/Ubuntu it
# installs them; otherwise it prints the one command that would.
set -euo pipefail

if [[ -n "${TEST_DATABASE_URL:-}" && "${1:-}" != "--always" ]]; then
  exit 0
fi
if command -v pg_ctl >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null \
  || [[ -n "${FANOUT_PG_BINDIR:-}" && -x "${FANOUT_PG_BINDIR}/pg_ctl" ]]; then
  exit 0
fi
if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  echo "PostgreSQL server binaries not found: installing them (apt-get install -y postgresql)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
  # Debian starts a system cluster on install; fanout runs its own, so leave that one be.
  exit 0
fi
cat >&2 <<'MSG'
PostgreSQL server binaries (initdb, pg_ctl, postgres) are not installed.
Install them with:   sudo apt-get install -y postgresql     (Debian/Ubuntu)
or point the tests at a server:   export TEST_DATABASE_URL=postgres://user:pass@host:5432/postgres
MSG
exit 1
