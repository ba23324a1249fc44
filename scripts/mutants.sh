#!/usr/bin/env bash
# mutants.sh breaks each claimed invariant on purpose and checks that a test
# catches it. Every mutants/NN-name.patch is a `git diff` of source (SQL or
# Go, never tests) preceded by header lines:
#
#   # claim: what the named tests say they prove
#   # invariant: I1
#   # test: ./store/ ^TestBoundaryRace$     (package and -run regexp; one or more)
#   # timeout: 3m                           (optional; per test line)
#
# The patches are applied one at a time to ONE temporary copy of the working
# tree (tracked files plus untracked ones that are not ignored, as they are
# now: uncommitted edits included); the real checkout is never written. For
# each mutant the named test packages are compiled first (a mutant that does
# not compile is BROKEN, never "caught"), then each test line runs alone.
#
# Results: CAUGHT <first failing test>, CAUGHT(timeout) <test> for a hang
# that only the -timeout ended, CAUGHT(goleak) for a leak TestMain found,
# SURVIVED (every test passed), NO-TEST (a regexp matched no test), STALE
# (the patch no longer applies), BROKEN (it does not compile, or its
# migrations do not apply), BASELINE-FAIL (the test fails without the
# mutant, so catching proves nothing). Anything but CAUGHT fails the run.
#
# Environment:
#   MUTANTS="03 07"      only these mutants (number or file name prefix)
#   MUTANTS_TIMEOUT=2m   default per-test-line timeout (a patch's "# timeout:" wins)
#   MUTANTS_RACE=1       build the tests with -race (slower)
#   MUTANTS_BASELINE=0   skip running the named tests once without mutants
#   MUTANTS_KEEP=1       keep the temporary copy and the logs, and say where
#   MUTANTS_SQL_PROBE    "PKG REGEXP" of a test that only needs the migrations
#                        to apply; run before the tests of a mutant of
#                        migrations/ (default: ./store/ ^TestMigrateRefusesAChangedMigration$)
#   TEST_DATABASE_URL    use this server; otherwise one throwaway cluster is
#                        started for the whole run and removed at the end
#   GO                   the go command (default: go)
set -euo pipefail

GO=${GO:-go}
root=$(git rev-parse --show-toplevel)
cd "$root"

default_timeout=${MUTANTS_TIMEOUT:-2m}
# A test that only migrates a database and checks nothing a mutant of the
# ledger could change: run first for every mutant of migrations/.
sql_probe=${MUTANTS_SQL_PROBE:-./store/ ^TestMigrateRefusesAChangedMigration\$}
race=()
[[ "${MUTANTS_RACE:-0}" == 1 ]] && race=(-race)
buildflags=("${race[@]}")

scripts/ensure-postgres.sh

# The copy lives at a path fixed per checkout: compiled packages are cached
# by their directory, so a second run reuses the first one's work. A lock
# keeps two runs from sharing it.
tmp=${TMPDIR:-/tmp}/fanout-mutants-$(id -u)-$(printf '%s' "$root" | cksum | cut -d' ' -f1)
exec 9>"$tmp.lock"
flock -n 9 || { echo "mutants: another run for $root holds $tmp.lock" >&2; exit 1; }
if [[ -f "$tmp/pg/data/postmaster.pid" ]]; then
  # The cluster of an earlier run that was killed before it could stop it.
  old_pid=$(head -1 "$tmp/pg/data/postmaster.pid")
  if [[ "$old_pid" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$old_pid/cmdline" 2>/dev/null | grep -q -- "$tmp/pg/data"; then
    kill -QUIT "$old_pid" 2>/dev/null || true
    sleep 1
  fi
fi
rm -rf "$tmp"
src=$tmp/src
bin=$tmp/bin
logs=$tmp/logs
mkdir -p "$src" "$bin" "$logs"
pg_ctl_bin=""
pg_data=""
pg_user=()

cleanup() {
  local rc=$?
  if [[ -n "$pg_data" ]]; then
    "${pg_user[@]}" "$pg_ctl_bin" stop -D "$pg_data" -m immediate -s >/dev/null 2>&1 || true
  fi
  if [[ "${MUTANTS_KEEP:-0}" == 1 ]]; then
    echo "kept the copy and logs in $tmp" >&2
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the copy --------------------------------------------------------------
# Every file git would show, as it is in the working tree (deleted files left
# out), into $src, which gets its own throwaway git repository so that each
# mutant can be applied, checked and undone exactly.
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do if [[ -e "$f" || -L "$f" ]]; then printf '%s\0' "$f"; fi; done |
  tar --null -T - -cf - | tar -xf - -C "$src"
git -C "$src" init -q
git -C "$src" add -A
git -C "$src" -c user.name=mutants -c user.email=mutants@localhost -c commit.gpgsign=false \
  commit -q --no-verify -m "working tree under test"

restore() {
  git -C "$src" checkout -q -- . && git -C "$src" clean -fdq
}

# --- PostgreSQL --------------------------------------------------------------
# One throwaway cluster for every test process of the run, instead of one
# initdb per process; each test still gets a fresh database from the harness.
start_postgres() {
  local bindir="" d
  if [[ -n "${FANOUT_PG_BINDIR:-}" ]]; then
    bindir=$FANOUT_PG_BINDIR
  elif command -v pg_ctl >/dev/null 2>&1; then
    bindir=$(dirname "$(command -v pg_ctl)")
  else
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -V -r) /usr/local/pgsql/bin; do
      if [[ -x "$d/pg_ctl" && -x "$d/initdb" ]]; then bindir=$d; break; fi
    done
  fi
  [[ -n "$bindir" && -x "$bindir/initdb" ]] || { echo "mutants: no PostgreSQL server binaries found" >&2; exit 1; }
  pg_ctl_bin=$bindir/pg_ctl
  local dir=$tmp/pg
  mkdir -p "$dir"
  if [[ "$(id -u)" == 0 ]]; then
    # initdb refuses root: run the cluster as postgres (or nobody), as pglocal does.
    local u=postgres
    id "$u" >/dev/null 2>&1 || u=nobody
    pg_user=(setpriv --reuid="$u" --regid="$(id -g "$u")" --clear-groups --)
    chmod 711 "$tmp"
    chown "$u" "$dir"
  fi
  (cd "$dir" && "${pg_user[@]}" "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-locale \
    --no-sync >"$logs/initdb.log" 2>&1) || { cat "$logs/initdb.log" >&2; exit 1; }
  pg_data=$dir/data
  local port try
  for try in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 30000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue # taken
    if (cd "$dir" && "${pg_user[@]}" "$pg_ctl_bin" start -D "$pg_data" -w -s -l "$pg_data/server.log" \
      -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$pg_data \
          -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"); then
      export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
      return
    fi
  done
  echo "mutants: could not start PostgreSQL:" >&2
  tail -20 "$pg_data/server.log" >&2 || true
  exit 1
}
if [[ -z "${TEST_DATABASE_URL:-}" ]]; then
  start_postgres
fi

# --- the mutants -------------------------------------------------------------
shopt -s nullglob
all=(mutants/*.patch)
[[ ${#all[@]} -gt 0 ]] || { echo "mutants: no mutants/*.patch" >&2; exit 1; }
selected=()
for p in "${all[@]}"; do
  name=$(basename "$p" .patch)
  if [[ -z "${MUTANTS:-}" ]]; then
    selected+=("$p")
    continue
  fi
  for want in $MUTANTS; do
    if [[ "$name" == "$want"* || "$name" == "$want" ]]; then selected+=("$p"); break; fi
  done
done
[[ ${#selected[@]} -gt 0 ]] || { echo "mutants: MUTANTS=\"$MUTANTS\" names none of ${all[*]}" >&2; exit 1; }

header() { # header FILE KEY: the values of "# KEY:" lines, one per line
  sed -n "/^diff --git /q; s/^# $2:[[:space:]]*//p" "$1"
}

# binary PKG: the path of PKG's compiled test binary.
binary() { local s=${1#./}; s=${s%/}; echo "$bin/${s//\//_}.test"; }

# compile PKG LOG: compile PKG's tests in the copy; returns non-zero on error.
compile() {
  local pkg=$1 out
  out=$(binary "$pkg")
  (cd "$src" && "$GO" test -c "${buildflags[@]}" -o "$out" "$pkg") >>"$2" 2>&1
}

# runtest PKG RE TIMEOUT LOG: run one test line; sets verdict and failed.
runtest() {
  local pkg=$1 re=$2 t=$3 log=$4 rc=0 dir=$src/${1#./}
  echo "=== $pkg -run '$re' -timeout $t" >>"$log"
  local secs
  secs=$(to_seconds "$t")
  # The test binary panics at -timeout; the outer timeout is a backstop for
  # a TestMain that hangs after that.
  (cd "$dir" && timeout -k 10 $((secs + 60)) "$(binary "$pkg")" -test.count=1 -test.timeout="$t" \
    -test.run="$re" -test.v) >"$log.run" 2>&1 || rc=$?
  cat "$log.run" >>"$log"
  failed=""
  if [[ $rc == 0 ]]; then
    # A regexp naming a subtest must have run one, not only its parent.
    local ran='^--- PASS: '
    [[ "$re" == */* ]] && ran='^ *--- PASS: [^ ]*/'
    if grep -q '^testing: warning: no tests to run' "$log.run" || ! grep -q "$ran" "$log.run"; then
      verdict=NO-TEST
    else
      verdict=PASS
    fi
    return
  fi
  if grep -q 'create template database\|migrate fanout_tpl_' "$log.run"; then
    verdict=BROKEN
    failed="migrations do not apply: $(grep -m1 -o 'create template database.*' "$log.run" | cut -c1-160)"
  elif grep -q '^panic: test timed out' "$log.run"; then
    verdict="CAUGHT(timeout)"
    # "running tests:" lists what was still running; the last is the deepest.
    failed=$(sed -n '/^[[:space:]]*running tests:/,/^[[:space:]]*$/p' "$log.run" |
      sed -n 's/^[[:space:]][[:space:]]*\(Test[^[:space:]]*\) (.*/\1/p' | tail -1)
  elif grep -q -- '--- FAIL: ' "$log.run"; then
    verdict=CAUGHT
    # The deepest failing test, so a subtest is named rather than its parent.
    failed=$(grep -o -- '--- FAIL: [^ ]*' "$log.run" | sed 's/^--- FAIL: //' |
      awk '{ n = gsub("/", "/"); if (n > best || !seen) { best = n; name = $0; seen = 1 } } END { print name }')
  elif grep -q '^goleak' "$log.run"; then
    verdict="CAUGHT(goleak)"
    failed="TestMain"
  elif grep -q '^panic: ' "$log.run"; then
    verdict="CAUGHT(panic)"
    failed=$(grep -m1 '^panic: ' "$log.run" | cut -c1-80)
  else
    verdict=CAUGHT
    failed="exit status $rc"
  fi
}

to_seconds() { # 90s, 3m, 1h30m -> seconds
  local s=$1 total=0 n
  while [[ $s =~ ^([0-9]+)([hms])(.*)$ ]]; do
    n=${BASH_REMATCH[1]}
    case ${BASH_REMATCH[2]} in h) total=$((total + n * 3600)) ;; m) total=$((total + n * 60)) ;; s) total=$((total + n)) ;; esac
    s=${BASH_REMATCH[3]}
  done
  echo $((total > 0 ? total : 120))
}

start_all=$SECONDS
# baseline_bad[PKG]: the tests of PKG that fail without any mutant ("*": the
# package itself, e.g. a leak TestMain found).
declare -A baseline_bad=()

# top_regexp RE: the part of a -run regexp that selects top-level tests.
top_regexp() { echo "${1%%/*}"; }

# Baseline: the named tests must pass on the tree as it is, or catching a
# mutant with them proves nothing. The lines of one package share one run,
# except those that select subtests.
if [[ "${MUTANTS_BASELINE:-1}" == 1 ]]; then
  declare -A base_re=() base_t=()
  base_lines=()
  for p in "${selected[@]}"; do
    t=$(header "$p" timeout | head -1); t=$(to_seconds "${t:-$default_timeout}")
    while read -r pkg re; do
      [[ -n "$pkg" ]] || continue
      if [[ "$re" == */* ]]; then
        base_lines+=("$pkg $re")
      else
        base_re[$pkg]="${base_re[$pkg]:+${base_re[$pkg]}|}$re"
      fi
      [[ $t -gt ${base_t[$pkg]:-0} ]] && base_t[$pkg]=$t
    done < <(header "$p" test)
  done
  if grep -l '^diff --git a/migrations/' "${selected[@]}" >/dev/null; then
    read -r ppkg pre <<<"$sql_probe"
    base_re[$ppkg]="${base_re[$ppkg]:+${base_re[$ppkg]}|}$pre"
    : "${base_t[$ppkg]:=$(to_seconds "$default_timeout")}" # the probe's package may be named by no selected mutant
  fi
  for pkg in "${!base_re[@]}"; do base_lines+=("$pkg ${base_re[$pkg]}"); done
  echo "baseline: the named tests without any mutant..." >&2
  for pkg in $(printf '%s\n' "${base_lines[@]%% *}" | sort -u); do
    if ! compile "$pkg" "$logs/baseline.log"; then
      echo "mutants: $pkg does not compile without mutants:" >&2
      tail -30 "$logs/baseline.log" >&2
      exit 1
    fi
  done
  for line in "${base_lines[@]}"; do
    pkg=${line%% *} re=${line#* }
    runtest "$pkg" "$re" "${base_t[$pkg]}s" "$logs/baseline.log"
    case $verdict in
      PASS | NO-TEST) continue ;;
    esac
    names=$(grep -o -- '^--- FAIL: [^ /]*' "$logs/baseline.log.run" | sed 's/^--- FAIL: //' | sort -u | tr '\n' ' ')
    [[ $verdict == "CAUGHT(timeout)" && -n "$failed" ]] && names+=" ${failed%%/*}"
    [[ -z "${names// /}" ]] && names="*"
    baseline_bad[$pkg]="${baseline_bad[$pkg]:-} $names"
    echo "baseline: $pkg -run '$re' fails without any mutant: $verdict ${names}" >&2
  done
  echo "baseline: done in $((SECONDS - start_all))s" >&2
fi

# baseline_fails PKG RE: whether a test RE selects failed in the baseline.
baseline_fails() {
  local n top
  top=$(top_regexp "$2")
  for n in ${baseline_bad[$1]:-}; do
    if [[ "$n" == "*" ]] || [[ "$n" =~ $top ]]; then return 0; fi
  done
  return 1
}

rows=()
bad=0
declare -A tally=()
for p in "${selected[@]}"; do
  name=$(basename "$p" .patch)
  inv=$(header "$p" invariant | head -1)
  t=$(header "$p" timeout | head -1); t=${t:-$default_timeout}
  mapfile -t tests < <(header "$p" test)
  log=$logs/$name.log
  : >"$log"
  start=$SECONDS
  result="" detail=""
  testcol=$(printf '%s; ' "${tests[@]}"); testcol=${testcol%; }
  echo "mutant $name..." >&2

  if [[ ${#tests[@]} -eq 0 ]]; then
    result=BROKEN detail="no '# test:' line"
  elif ! git -C "$src" apply --check "$root/$p" >>"$log" 2>&1; then
    result=STALE detail=$(grep -m1 'error:' "$log" | cut -c1-120)
  else
    git -C "$src" apply "$root/$p"
    pkgs=$(printf '%s\n' "${tests[@]}" | awk '{ print $1 }' | sort -u)
    for pkg in $pkgs; do
      if ! compile "$pkg" "$log"; then
        result=BROKEN detail="does not compile: $(grep -m1 -E '\.go:[0-9]+' "$log" | cut -c1-120)"
        break
      fi
    done
    # A mutant of the migrations must still migrate: a schema that does not
    # build fails every test, which is not catching anything.
    if [[ -z "$result" ]] && grep -q '^diff --git a/migrations/' "$root/$p"; then
      read -r ppkg pre <<<"$sql_probe"
      if compile "$ppkg" "$log"; then
        runtest "$ppkg" "$pre" "$default_timeout" "$log"
        case $verdict in
          PASS) ;;
          NO-TEST) echo "mutants: MUTANTS_SQL_PROBE ($sql_probe) matches no test" >&2; exit 1 ;;
          BROKEN) result=BROKEN detail=$failed ;;
          *) result=BROKEN detail="the migrations probe ($sql_probe) fails: $verdict $failed" ;;
        esac
      else
        result=BROKEN detail="does not compile: $(grep -m1 -E '\.go:[0-9]+' "$log" | cut -c1-120)"
      fi
    fi
    if [[ -z "$result" ]]; then
      result=SURVIVED
      notest=""
      for line in "${tests[@]}"; do
        read -r pkg re <<<"$line"
        # A test that fails without the mutant cannot vouch for catching it.
        if baseline_fails "$pkg" "$re"; then
          result=BASELINE-FAIL detail="$pkg $re fails without the mutant"
          break
        fi
        runtest "$pkg" "$re" "$t" "$log"
        case $verdict in
          PASS) ;;
          NO-TEST) notest+="${notest:+, }$pkg '$re'" ;;
          *) result=$verdict detail=$failed; break ;;
        esac
      done
      # A test line that names no test is a header to fix, whatever the others did.
      if [[ -n "$notest" && ( $result == SURVIVED || $result == CAUGHT* ) ]]; then
        [[ $result == SURVIVED ]] && detail="" || detail=" (the other lines: $result $detail)"
        result=NO-TEST detail="$notest matches no test$detail"
      fi
    fi
    restore
  fi
  secs=$((SECONDS - start))
  tally[$result]=$((${tally[$result]:-0} + 1))
  case $result in CAUGHT*) ;; *) bad=1 ;; esac
  cell="$result${detail:+ $detail}"
  rows+=("| $name | ${inv:-?} | ${testcol//|/\\|} | ${cell//|/\\|} | $secs |")
  echo "mutant $name: $cell (${secs}s)" >&2
  if [[ $result == BROKEN || $result == STALE ]]; then
    tail -15 "$log" | sed 's/^/    /' >&2
  fi
done

echo
echo "| mutant | invariant | test | result | seconds |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
summary=""
for k in "${!tally[@]}"; do summary+="${tally[$k]} $k, "; done
echo "${#selected[@]} mutants in $((SECONDS - start_all))s: ${summary%, }"
if [[ $bad != 0 ]]; then
  echo "FAIL: every mutant must be CAUGHT (a SURVIVED or NO-TEST mutant is a test to write or fix; STALE or BROKEN is a patch to fix)"
  exit 1
fi
