#!/usr/bin/env bash
# idle-xact.sh URL [SECONDS]: transactions committed (and rolled back) per
# second in URL's database over SECONDS (default 10), from pg_stat_database.
# The probe's own two psql sessions add ~3 commits to the count.
set -euo pipefail
url=$1
secs=${2:-10}
q="SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"
read -r c0 r0 < <(psql -XAtF' ' "$url" -c "$q")
sleep "$secs"
read -r c1 r1 < <(psql -XAtF' ' "$url" -c "$q")
awk -v c=$((c1 - c0)) -v r=$((r1 - r0)) -v s="$secs" \
	'BEGIN { printf "commits: %d, rollbacks: %d over %ss: %.1f/s (the probe adds ~3)\n", c, r, s, c / s }'
