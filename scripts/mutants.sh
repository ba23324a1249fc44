#!/usr/bin/env bash
# mutants.sh breaks each claimed invariant on purpose and checks that a test
# catches it. Every mutants/NN-name.mutant changes source (SQL or Go, never
# tests) at a snippet anchored to a declaration (scripts/mutate applies it;
# docs/mutants.md "How it works"), after header lines:
#
#   # claim: what the named tests say they prove
#   # invariant: I1
#   # test: ./store/ ^TestBoundaryRace$     (package and -run regexp; one or more)
#   # timeout: 3m                           (optional; per test line)
#
# A mutants/NN-name.patch (the same header, then a `git diff`) still runs,
# applied with git.
#
# Every mutant that changes only the bodies of Go functions is compiled,
# with all the others, into one copy of the tree behind a switch on
# FANOUT_MUTANT (scripts/mutate/schemata.go): the test binaries are built
# once, and such a mutant costs its tests only.
#
# MUTANTS_JOBS workers run the mutants in parallel, each on its own copy of
# the tree (tracked files plus untracked ones that are not ignored, as they
# are now: uncommitted edits included); the real checkout is never written.
# A worker applies one patch at a time to its copy and restores it after.
# The named test packages are built once without mutants (the baseline
# runs those binaries). For each mutant of Go they are compiled again (a
# mutant that does not compile is BROKEN, never "caught"); a mutant that
# changes only SQL under migrations/ runs the binaries built once, which
# read its copy's migrations from FANOUT_TEST_MIGRATIONS_DIR instead of
# those embedded in them. Then each test line runs alone. Progress lines come in the order mutants finish; the table lists
# them in file order.
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
#   MUTANTS_CHANGED=1    only the mutants a change touches: a file one of them
#                        changes (a Go declaration's whole package, where it may
#                        have moved), a package a test line names, or the mutant;
#                        the change is what differs from MUTANTS_BASE (default
#                        HEAD: the uncommitted edits), untracked files included
#   MUTANTS_SCHEMATA=0   build every Go mutant on its own (slow; to check one)
#   MUTANTS_JOBS=2       mutants run at once (default: the number of CPUs + 1:
#                        3 on 2 cores, where a worker waits on the database a third of its time); 1 runs them one after another
#   MUTANTS_TIMEOUT=2m   default per-test-line timeout (a patch's "# timeout:" wins)
#   MUTANTS_RACE=1       build the tests with -race (slower)
#   MUTANTS_BASELINE=0   skip running the named tests once without mutants
#   MUTANTS_KEEP=1       keep the copies and the logs, and say where
#   MUTANTS_SQL_PROBE    "PKG REGEXP" of a test that only needs the migrations
#                        to apply; run before the tests of a mutant of
#                        migrations/ (default: ./store/ ^TestMigrateRefusesAChangedMigration$)
#   TEST_DATABASE_URL    use this server; otherwise one throwaway cluster is
#                        started for the whole run and removed at the end
#   GO                   the go command (default: go)

# Each worker sets src and bin (its copy) in its own subshell, on purpose.
# shellcheck disable=SC2030,SC2031
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
# Compiling and linking are most of a mutant's cost (docs/mutants.md
# "Cost"). -trimpath leaves each copy's directory out of what the build
# cache keys a package by, so the workers' copies share one cache (and a
# package a mutant does not touch is compiled once per run, not once per
# copy); link without the symbol table and DWARF, as `go test` does for
# the binaries it runs itself (stack traces keep their files and lines).
buildflags=(-trimpath "${race[@]}" "-ldflags=-s -w")

# --- the mutants -------------------------------------------------------------
shopt -s nullglob
all=(mutants/*.mutant mutants/*.patch)
[[ ${#all[@]} -gt 0 ]] || { echo "mutants: no mutants/*.mutant" >&2; exit 1; }

# The mutants' tool, built once per run.
mutate_dir=$(mktemp -d)
mutate=$mutate_dir/mutate
"$GO" build -o "$mutate" ./scripts/mutate || { echo "mutants: scripts/mutate does not build" >&2; exit 1; }
if [[ "${MUTANTS_CHANGED:-0}" == 1 ]]; then
  mapfile -t all < <({ git diff --name-only "${MUTANTS_BASE:-HEAD}" --; git ls-files --others --exclude-standard; } |
    "$mutate" changed . "${all[@]}")
  if [[ ${#all[@]} -eq 0 ]]; then
    echo "mutants: no mutant touches what differs from ${MUTANTS_BASE:-HEAD}"
    rm -rf "$mutate_dir"
    exit 0
  fi
  echo "mutants: ${#all[@]} touched by what differs from ${MUTANTS_BASE:-HEAD}" >&2
fi
# mname FILE: a mutant's name (its file name without .mutant or .patch).
mname() { local b; b=$(basename "$1"); echo "${b%.*}"; }
selected=()
for p in "${all[@]}"; do
  name=$(mname "$p")
  if [[ -z "${MUTANTS:-}" ]]; then
    selected+=("$p")
    continue
  fi
  for want in $MUTANTS; do
    if [[ "$name" == "$want"* || "$name" == "$want" ]]; then selected+=("$p"); break; fi
  done
done
[[ ${#selected[@]} -gt 0 ]] || { echo "mutants: MUTANTS=\"$MUTANTS\" names none of ${all[*]}" >&2; exit 1; }

# Workers: one more than CPUs (a test mostly waits on PostgreSQL,
# its own processes and timers; `go test ./...` also runs a test binary per
# CPU), no more than there are mutants.
ncpu=$(nproc 2>/dev/null || echo 2)
njobs=${MUTANTS_JOBS:-$((ncpu + 1))}
[[ "$njobs" =~ ^[1-9][0-9]*$ ]] || { echo "mutants: MUTANTS_JOBS=$njobs is not a number of workers" >&2; exit 1; }
[[ $njobs -gt ${#selected[@]} ]] && njobs=${#selected[@]}

scripts/ensure-postgres.sh

# The copies live at paths fixed per checkout (and worker): compiled
# packages are cached by their directory, so a second run reuses the first
# one's work. A lock keeps two runs from sharing them. Only this script and
# its workers (and the tests they run) hold it: the cluster is started
# without it, so that a cluster a killed run left behind does not lock the
# next run out, which stops it instead.
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
logs=$tmp/logs
mkdir -p "$logs" "$tmp/results" "$tmp/baseline"
src="" bin="" # the copy and the test binaries of the worker running
main_pid=$$
worker_pids=()
pg_ctl_bin=""
pg_data=""
pg_user=()

# descendants PID: every process below PID, parents first.
descendants() {
  ps -e -o pid= -o ppid= | awk -v root="$1" '
    { kids[$2] = kids[$2] " " $1 }
    END { n = 1; q[1] = root
          for (i = 1; i <= n; i++) { c = split(kids[q[i]], k, " "); for (j = 1; j <= c; j++) { q[++n] = k[j]; print k[j] } } }'
}

# alive PID: whether PID runs (a zombie has ended).
alive() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [[ ${s%% *} != Z ]]
}

# stop_workers: end the workers and everything they started (go, timeout,
# test binaries and their processes). A worker ignores SIGINT (it runs in
# the background), so Ctrl-C reaches only this script, which ends them here.
stop_workers() {
  [[ ${#worker_pids[@]} -gt 0 ]] || return 0
  local procs p i
  procs=$(descendants "$main_pid" | tr '\n' ' ') || true
  # shellcheck disable=SC2086 # a list of process ids
  kill -TERM $procs 2>/dev/null || true
  wait "${worker_pids[@]}" 2>/dev/null || true
  worker_pids=()
  # A test binary gets 5 seconds to end its own processes.
  for ((i = 0; i < 50; i++)); do
    for p in $procs; do alive "$p" && break; p=""; done
    [[ -z "$p" ]] && return 0
    sleep 0.1
  done
  for p in $procs; do alive "$p" && kill -KILL "$p" 2>/dev/null; done
  return 0
}

cleanup() {
  local rc=$?
  stop_workers
  if [[ -n "$pg_data" ]]; then
    "${pg_user[@]}" "$pg_ctl_bin" stop -D "$pg_data" -m immediate -s >/dev/null 2>&1 || true
  fi
  rm -rf "$mutate_dir"
  if [[ "${MUTANTS_KEEP:-0}" == 1 ]]; then
    echo "kept the copies and logs in $tmp" >&2
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the copies ----------------------------------------------------------------
# Every file git would show, as it is in the working tree (deleted files left
# out), into w1/src, which gets its own throwaway git repository so that
# each mutant can be applied, checked and undone exactly; the other workers'
# copies are copies of that one.
copy=$tmp/w1/src
mkdir -p "$copy"
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do if [[ -e "$f" || -L "$f" ]]; then printf '%s\0' "$f"; fi; done |
  tar --null -T - -cf - | tar -xf - -C "$copy"
# The npm packages the tests run and the Python client's venv (pinned,
# installed by make's targets) are ignored files: link them in (unless a link to them was copied: in a git
# worktree the link itself is an untracked file).
for d in .ci/mcp/node_modules clients/ts/node_modules .tmp/py; do
  if [[ -d "$d" && ! -e "$copy/$d" && ! -L "$copy/$d" ]]; then mkdir -p "$(dirname "$copy/$d")" && ln -s "$root/$d" "$copy/$d"; fi
done
git -C "$copy" init -q
git -C "$copy" add -A
git -C "$copy" -c user.name=mutants -c user.email=mutants@localhost -c commit.gpgsign=false \
  commit -q --no-verify -m "working tree under test"
for ((w = 1; w <= njobs; w++)); do
  mkdir -p "$tmp/w$w/bin"
  [[ $w == 1 ]] || cp -a "$copy" "$tmp/w$w/src"
done

restore() {
  git -C "$src" checkout -q -- . && git -C "$src" clean -fdq
}

# --- PostgreSQL --------------------------------------------------------------
# One throwaway cluster for every test process of the run, instead of one
# initdb per process; each test still gets a fresh database from the harness
# (so the workers' tests never share one), and may open many connections.
start_postgres() {
  local bindir="" d
  if [[ -n "${FANOUT_PG_BINDIR:-}" ]]; then
    bindir=$FANOUT_PG_BINDIR
  elif command -v pg_ctl >/dev/null 2>&1; then
    bindir=$(dirname "$(command -v pg_ctl)")
  else
    # shellcheck disable=SC2012 # version directories: plain names
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
    --no-sync >"$logs/initdb.log" 2>&1 9>&-) || { cat "$logs/initdb.log" >&2; exit 1; }
  pg_data=$dir/data
  local port
  for _ in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 30000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue # taken
    if (cd "$dir" && "${pg_user[@]}" "$pg_ctl_bin" start -D "$pg_data" -w -s -l "$pg_data/server.log" \
      -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$pg_data \
          -c max_connections=$((300 * njobs)) -c fsync=off -c synchronous_commit=off -c full_page_writes=off" 9>&-); then
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

header() { # header FILE KEY: the values of "# KEY:" lines, one per line
  sed -n "/^diff --git /q; /^@@ /q; s/^# $2:[[:space:]]*//p" "$1"
}

# mfiles FILE: the files a mutant changes, one per line.
mfiles() { "$mutate" files "$1"; }

# binary PKG: the path of PKG's compiled test binary.
binary() { local s=${1#./}; s=${s%/}; echo "$bin/${s//\//_}.test"; }

# compile PKG LOG: compile PKG's tests in the copy; returns non-zero on error.
# At a lower priority than the tests another worker may be running: a
# compile only takes longer, a test may fail for want of the CPU.
compile() {
  local pkg=$1 out
  out=$(binary "$pkg")
  (cd "$src" && nice -n 10 "$GO" test -c "${buildflags[@]}" -o "$out" "$pkg") >>"$2" 2>&1
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

# --- the workers ---------------------------------------------------------------
# take QUEUE COUNT: the next item (0 to COUNT-1) of QUEUE, a counter file
# the workers share; fails once every item is taken, after a fatal error, or
# when this script is gone.
take() {
  local q=$1 n=$2 i fd
  [[ ! -e "$tmp/abort" ]] && alive "$main_pid" || return 1
  exec {fd}>>"$q.lock"
  flock "$fd"
  i=$(cat "$q" 2>/dev/null || echo 0)
  echo $((i + 1)) >"$q"
  exec {fd}>&-
  [[ $i -lt $n ]] || return 1
  echo "$i"
}

# fatal MESSAGE: in a worker, end the run: this script stops the others.
fatal() {
  printf '%s\n' "$1" >&2
  : >"$tmp/abort"
  exit 1
}

# run_workers FUNC COUNT: FUNC ITEM for each of COUNT items, taken in order
# by the workers, each in its copy; fails if a worker failed. A worker that
# fails makes the others stop after the item they are on.
run_workers() {
  local fn=$1 n=$2 w pid rc=0
  rm -f "$tmp/queue" "$tmp/queue.lock"
  worker_pids=()
  for ((w = 1; w <= njobs; w++)); do
    (
      trap '[[ $? == 0 ]] || : >"$tmp/abort"' EXIT
      src=$tmp/w$w/src bin=$tmp/w$w/bin
      while i=$(take "$tmp/queue" "$n"); do "$fn" "$i"; done
    ) &
    worker_pids+=($!)
  done
  # (Not wait -n: bash 5.2 loses a job that ended before it is called.)
  for pid in "${worker_pids[@]}"; do wait "$pid" || rc=$?; done
  worker_pids=()
  if [[ $rc != 0 || -e "$tmp/abort" ]]; then
    [[ -e "$tmp/abort" ]] || echo "mutants: a worker failed (exit status $rc)" >&2
    exit 1
  fi
}

start_all=$SECONDS
# baseline_bad[PKG]: the tests of PKG that fail without any mutant ("*": the
# package itself, e.g. a leak TestMain found).
declare -A baseline_bad=()

# top_regexp RE: the part of a -run regexp that selects top-level tests.
top_regexp() { echo "${1%%/*}"; }

# baseline_package I: run the lines of the I-th package of the baseline
# (its clean binary); writes the tests that failed to $tmp/baseline/I.
baseline_package() {
  local pkg=${base_pkgs[$1]} line re names log bin=$clean
  log=$logs/baseline.$(basename "$(binary "$pkg")" .test).log
  : >"$tmp/baseline/$1"
  # One package's baseline runs at a time (the others' compiles go on): a
  # baseline run is every named test of a package at once, and one that
  # fails for want of the CPU would make its mutants BASELINE-FAIL.
  exec 8>>"$tmp/baseline.lock"
  flock 8
  for line in "${base_lines[@]}"; do
    [[ "${line%% *}" == "$pkg" ]] || continue
    re=${line#* }
    runtest "$pkg" "$re" "${base_t[$pkg]}s" "$log"
    case $verdict in
      PASS | NO-TEST) continue ;;
    esac
    names=$(grep -o -- '^--- FAIL: [^ /]*' "$log.run" | sed 's/^--- FAIL: //' | sort -u | tr '\n' ' ')
    [[ $verdict == "CAUGHT(timeout)" && -n "$failed" ]] && names+=" ${failed%%/*}"
    [[ -z "${names// /}" ]] && names="*"
    echo "$pkg $names" >>"$tmp/baseline/$1"
    echo "baseline: $pkg -run '$re' fails without any mutant: $verdict ${names}" >&2
  done
  flock -u 8 # the tests it ran inherited fd 8: unlock it for them too
  exec 8>&-
}

# Two go commands compiling one package at once both compile it: build what
# every copy shares (the packages from outside the module) once, before the
# workers compile their copies. A second of checks on a warm cache; its
# errors, if any, are the compiles' to report.
mapfile -t test_pkgs < <(for p in "${selected[@]}"; do header "$p" test; done | awk '{ print $1 }' | sort -u)
(cd "$tmp/w1/src" && "$GO" list -deps -test -f \
  '{{if and (not .ForTest) (not .Standard) .Module (not .Module.Main)}}{{.ImportPath}}{{end}}' "${test_pkgs[@]}" |
  xargs -r "$GO" build -trimpath "${race[@]}") >"$logs/dependencies.log" 2>&1 || true

# The test binaries, built once: the baseline runs them, and so does every
# mutant that changes only SQL under migrations/, with
# FANOUT_TEST_MIGRATIONS_DIR naming its copy's migrations (a test binary
# reads them from there instead of the ones embedded in it), and every
# mutant of Go function bodies, with FANOUT_MUTANT naming it: they are
# built from a copy with those mutants compiled in behind a switch
# (schemata; unset, the switch leaves the code as it is).
clean=$tmp/clean
mkdir -p "$clean"
read -r probe_pkg _ <<<"$sql_probe"
mapfile -t clean_pkgs < <(printf '%s\n' "${test_pkgs[@]}" "$probe_pkg" | sort -u)
declare -A schem=() # mutant number -> 1: compiled into the clean binaries
schem_src=$tmp/schemata/src
# build_clean DIR: build the clean binaries from the tree at DIR.
build_clean() {
  rm -f "$clean"/*.test
  # One go command for them all links them in parallel; it names each
  # binary for the last element of its path.
  (cd "$1" && "$GO" test -c "${buildflags[@]}" -o "$clean/" "${clean_pkgs[@]}") >"$logs/clean.log" 2>&1
}
built_clean=""
if [[ "${MUTANTS_SCHEMATA:-1}" == 1 ]]; then
  exclude=" "
  for attempt in 1 2 3; do
    rm -rf "$schem_src" && mkdir -p "$tmp/schemata" && cp -a "$tmp/w1/src" "$schem_src"
    mapfile -t in < <(for p in "${selected[@]}"; do
      n=$(mname "$p"); n=$((10#${n%%-*}))
      [[ "$exclude" == *" $n "* ]] || echo "$p"
    done)
    mapfile -t nums < <("$mutate" schemata "$schem_src" "${in[@]}") || { echo "mutants: scripts/mutate schemata failed" >&2; exit 1; }
    if build_clean "$schem_src"; then
      built_clean=1
      for n in "${nums[@]}"; do schem[$n]=1; done
      break
    fi
    # A mutant whose copy does not compile is built on its own (and
    # reported BROKEN); anything else: no schemata.
    blamed=$("$mutate" blame "$schem_src" "$logs/clean.log") || { echo "mutants: the schemata build failed outside a mutant's code; building every mutant on its own:" >&2; tail -5 "$logs/clean.log" >&2; break; }
    echo "mutants: left out of the schemata, as their copies do not compile:" $blamed >&2
    exclude+="$(echo $blamed) "
  done
fi
if [[ -z "$built_clean" ]] && ! build_clean "$tmp/w1/src"; then
  echo "mutants: the named test packages do not compile without mutants:" >&2
  tail -30 "$logs/clean.log" >&2
  exit 1
fi
for pkg in "${clean_pkgs[@]}"; do
  b=${pkg%/}
  [[ -e "$clean/${b##*/}.test" ]] || { echo "mutants: no test binary for $pkg in $clean" >&2; exit 1; }
  [[ "$clean/${b##*/}.test" == "$(bin=$clean binary "$pkg")" ]] || mv "$clean/${b##*/}.test" "$(bin=$clean binary "$pkg")"
done
echo "mutants: ${#schem[@]} mutants of Go compiled into the test binaries (schemata)" >&2
echo "mutants: the test binaries without mutants built in $((SECONDS - start_all))s" >&2

# Baseline: the named tests must pass on the tree as it is, or catching a
# mutant with them proves nothing. The lines of one package share one run,
# except those that select subtests; the workers take a package each.
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
  if for p in "${selected[@]}"; do mfiles "$p"; done | grep -q '^migrations/'; then
    read -r ppkg pre <<<"$sql_probe"
    base_re[$ppkg]="${base_re[$ppkg]:+${base_re[$ppkg]}|}$pre"
    : "${base_t[$ppkg]:=$(to_seconds "$default_timeout")}" # the probe's package may be named by no selected mutant
  fi
  for pkg in "${!base_re[@]}"; do base_lines+=("$pkg ${base_re[$pkg]}"); done
  mapfile -t base_pkgs < <(printf '%s\n' "${base_lines[@]%% *}" | sort -u)
  echo "baseline: the named tests without any mutant..." >&2
  run_workers baseline_package "${#base_pkgs[@]}"
  for ((i = 0; i < ${#base_pkgs[@]}; i++)); do
    while read -r pkg names; do
      baseline_bad[$pkg]="${baseline_bad[$pkg]:-} $names"
    done <"$tmp/baseline/$i"
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

# mutant I: apply the I-th selected mutant to the worker's copy, compile,
# run its tests, restore; writes its result and its table row to
# $tmp/results/I.
mutant() {
  local p=${selected[$1]} name inv t tests log start result detail testcol pkgs pkg re line notest
  local ppkg pre cell secs msg sqlonly="" built=0 num files
  name=$(mname "$p")
  num=$((10#${name%%-*}))
  files=$(mfiles "$p")
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
  elif [[ -n "${schem[$num]:-}" ]]; then
    # Compiled into the clean binaries: switched on, nothing to apply.
    :
  elif [[ "$p" == *.patch ]] && ! git -C "$src" apply --check "$root/$p" >>"$log" 2>&1; then
    result=STALE detail=$(grep -m1 'error:' "$log" | cut -c1-120)
  elif [[ "$p" == *.mutant ]] && ! "$mutate" apply "$src" "$root/$p" >>"$log" 2>&1; then
    result=STALE detail=$(grep -m1 'mutate:' "$log" | cut -c1-160)
  fi
  if [[ -z "$result" ]]; then
    [[ "$p" == *.patch ]] && git -C "$src" apply "$root/$p"
    pkgs=$(printf '%s\n' "${tests[@]}" | awk '{ print $1 }' | sort -u)
    if [[ -n "${schem[$num]:-}" ]]; then
      sqlonly=1 # built already
      local bin=$clean
      local -x FANOUT_MUTANT=$num
    elif ! grep -qv '^migrations/.*\.sql$' <<<"$files"; then
      # Only SQL of migrations/ changed: the clean binaries, reading the
      # copy's migrations (the clean build above).
      sqlonly=1
      local bin=$clean
      local -x FANOUT_TEST_MIGRATIONS_DIR=$src/migrations
    fi
    built=$SECONDS
    for pkg in $pkgs; do
      [[ -n "$sqlonly" ]] && break
      if ! compile "$pkg" "$log"; then
        result=BROKEN detail="does not compile: $(grep -m1 -E '\.go:[0-9]+' "$log" | cut -c1-120)"
        break
      fi
    done
    built=$((SECONDS - built))
    # A mutant of the migrations must still migrate: a schema that does not
    # build fails every test, which is not catching anything.
    if [[ -z "$result" ]] && grep -q '^migrations/' <<<"$files"; then
      read -r ppkg pre <<<"$sql_probe"
      # The probe's package is compiled already when a test line names it.
      if [[ -n "$sqlonly" ]] || grep -qxF -- "$ppkg" <<<"$pkgs" || compile "$ppkg" "$log"; then
        runtest "$ppkg" "$pre" "$default_timeout" "$log"
        case $verdict in
          PASS) ;;
          NO-TEST) fatal "mutants: MUTANTS_SQL_PROBE ($sql_probe) matches no test" ;;
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
  cell="$result${detail:+ $detail}"
  printf '%s\n' "$result" "| $name | ${inv:-?} | ${testcol//|/\\|} | ${cell//|/\\|} | $secs |" "$built" "$secs" >"$tmp/results/$1"
  msg="mutant $name: $cell (${secs}s, ${built}s of it building)"
  if [[ $result == BROKEN || $result == STALE ]]; then
    msg+=$'\n'$(tail -15 "$log" | sed 's/^/    /')
  fi
  printf '%s\n' "$msg" >&2 # one write, so that another worker's lines do not split it
}

run_workers mutant "${#selected[@]}"

rows=()
bad=0 build_secs=0 all_secs=0
declare -A tally=()
for ((i = 0; i < ${#selected[@]}; i++)); do
  { IFS= read -r result && IFS= read -r row && read -r b && read -r s; } <"$tmp/results/$i"
  build_secs=$((build_secs + b)) all_secs=$((all_secs + s))
  tally[$result]=$((${tally[$result]:-0} + 1))
  case $result in CAUGHT*) ;; *) bad=1 ;; esac
  rows+=("$row")
done

echo
echo "| mutant | invariant | test | result | seconds |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
summary=""
for k in "${!tally[@]}"; do summary+="${tally[$k]} $k, "; done
echo "${#selected[@]} mutants in $((SECONDS - start_all))s with $njobs workers: ${summary%, }"
echo "the workers' time: ${all_secs}s, ${build_secs}s of it compiling and linking the mutants"
if [[ $bad != 0 ]]; then
  echo "FAIL: every mutant must be CAUGHT (a SURVIVED or NO-TEST mutant is a test to write or fix; STALE or BROKEN is a patch to fix)"
  exit 1
fi
