package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
)

// Environment of a re-executed test binary acting as one more ledger client.
const (
	envRaceDB       = "FANOUT_RACE_CHILD_DB"
	envRaceAccounts = "FANOUT_RACE_CHILD_ACCOUNTS"
	envRaceSeed     = "FANOUT_RACE_CHILD_SEED"
	envRaceCoalesce = "FANOUT_RACE_CHILD_COALESCE"
)

type raceStats struct {
	Pairs        int    `json:"pairs"`
	Voids        int    `json:"voids"`
	Refusals     int    `json:"refusals"`
	Overruns     int    `json:"overruns"`
	CheckFired   int    `json:"check_fired"`
	OtherErrors  int    `json:"other_errors"`
	FirstProblem string `json:"first_problem,omitempty"`
}

func (s *raceStats) add(o raceStats) {
	s.Pairs += o.Pairs
	s.Voids += o.Voids
	s.Refusals += o.Refusals
	s.Overruns += o.Overruns
	s.CheckFired += o.CheckFired
	s.OtherErrors += o.OtherErrors
	if s.FirstProblem == "" {
		s.FirstProblem = o.FirstProblem
	}
}

// raceClients runs n goroutines that reserve random amounts on random task
// accounts and settle (sometimes over the grant) or void, until the run
// refuses them.
func raceClients(ctx context.Context, l budget.Ledger, accounts []budget.AccountID, n int, seed uint64, holder string) raceStats {
	var mu sync.Mutex
	var total raceStats
	var wg sync.WaitGroup
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			var st raceStats
			problem := func(err error) {
				if strings.Contains(err.Error(), "23514") || strings.Contains(err.Error(), "invariant refused") {
					st.CheckFired++
				} else {
					st.OtherErrors++
				}
				if st.FirstProblem == "" {
					st.FirstProblem = err.Error()
				}
			}
			for i := 0; i < 10_000 && ctx.Err() == nil; i++ {
				want := 1 + rng.Int64N(2000)
				r, err := l.Reserve(ctx, budget.ReserveParams{
					Account: accounts[rng.IntN(len(accounts))], RunID: "race", TenantID: "tenant-a", Attempt: 1,
					Want: want, Min: 1 + rng.Int64N(want),
					Holder: holder, TTL: time.Minute,
				})
				var ex *budget.ExhaustedError
				if errors.As(err, &ex) {
					st.Refusals++
					if ex.Kind == budget.KindRun {
						break
					}
					continue
				}
				if err != nil {
					problem(err)
					break
				}
				if rng.IntN(5) == 0 {
					if _, err := l.Void(ctx, r.ID, r.Lease.Generation, ""); err != nil {
						problem(err)
					}
					st.Voids++
					continue
				}
				actual := rng.Int64N(r.Amount*13/10 + 1) // up to 30% over the grant
				if actual > r.Amount {
					st.Overruns++
				}
				if _, err := l.Settle(ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation, Actual: actual}); err != nil {
					problem(err)
				}
				st.Pairs++
			}
			mu.Lock()
			total.add(st)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return total
}

// raceChild runs this process as one client of TestBoundaryRace when the
// parent re-executed it so; it reports whether it did.
func raceChild() bool {
	url := os.Getenv(envRaceDB)
	if url == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, err := store.Open(ctx, url+"&pool_max_conns=8")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer pool.Close()
	var accounts []budget.AccountID
	for _, s := range strings.Split(os.Getenv(envRaceAccounts), ",") {
		id, _ := strconv.ParseInt(s, 10, 64)
		accounts = append(accounts, budget.AccountID(id))
	}
	seed, _ := strconv.ParseUint(os.Getenv(envRaceSeed), 10, 64)
	l := store.NewLedger(pool, store.LedgerConfig{Coalesce: os.Getenv(envRaceCoalesce) != ""})
	defer l.Close()
	st := raceClients(ctx, l, accounts, 25, seed, fmt.Sprintf("proc-%d", os.Getpid()))
	json.NewEncoder(os.Stdout).Encode(st) //nolint:errcheck // the parent reports a missing result
	return true
}

// TestBoundaryRace: 200 goroutines here and 4 more OS processes (half of each
// through group commit) spend one run
// budget until it is exhausted. The run is never overspent, every account is
// conserved, entries sum to rows, and the CHECK constraint never fired.
func TestBoundaryRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const limit = 1_000_000
	ra := b.openRun(t, "race", limit, 64, limit/4, limit/4, limit/4, limit/4, limit/4, limit/4)
	var accounts []budget.AccountID
	var ids []string
	for _, id := range ra.Tasks {
		accounts = append(accounts, id)
		ids = append(ids, strconv.FormatInt(int64(id), 10))
	}

	const procs = 4
	outs := make([]strings.Builder, procs)
	cmds := make([]*exec.Cmd, procs)
	for i := range procs {
		cmd := exec.CommandContext(b.ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(),
			envRaceDB+"="+b.url,
			envRaceAccounts+"="+strings.Join(ids, ","),
			envRaceSeed+"="+strconv.Itoa(1000+i))
		if i%2 == 1 {
			cmd.Env = append(cmd.Env, envRaceCoalesce+"=1") // half the processes use group commit
		}
		cmd.Stdout = &outs[i]
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatalf("start client process: %v", err)
		}
		cmds[i] = cmd
	}
	pool, err := store.Open(b.ctx, b.url+"&pool_max_conns=32")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Half the goroutines call directly, half through group commit: mixed
	// traffic must stay exact and deadlock-free.
	coalesced := store.NewLedger(pool, store.LedgerConfig{Coalesce: true})
	defer coalesced.Close()
	var total, other raceStats
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); other = raceClients(b.ctx, coalesced, accounts, 100, 8, "parent-coalesced") }()
	total = raceClients(b.ctx, store.NewLedger(pool), accounts, 100, 7, "parent")
	wg.Wait()
	total.add(other)
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("client process %d: %v", i, err)
		}
		var st raceStats
		if err := json.Unmarshal([]byte(outs[i].String()), &st); err != nil {
			t.Fatalf("client process %d output %q: %v", i, outs[i].String(), err)
		}
		if st.Pairs == 0 {
			t.Errorf("client process %d settled nothing: not part of the race", i)
		}
		total.add(st)
	}
	t.Logf("race: %+v", total)
	if total.CheckFired != 0 || total.OtherErrors != 0 {
		t.Fatalf("%d CHECK violations, %d other errors; first: %s", total.CheckFired, total.OtherErrors, total.FirstProblem)
	}
	if total.Overruns == 0 {
		t.Error("no settle went over its grant: the overrun path was not exercised")
	}

	run, err := b.ledger.RunAccount(b.ctx, "race")
	if err != nil {
		t.Fatal(err)
	}
	if run.State != budget.StateExhausted {
		t.Errorf("run state = %s, want exhausted", run.State)
	}
	if run.Reserved+run.Spent > run.Limit || run.Reserved != 0 {
		t.Errorf("run account = %+v; want reserved 0 and spent <= limit", run)
	}
	var resSpent, granted int64
	if err := b.pool.QueryRow(b.ctx, `SELECT coalesce(sum(spent), 0), coalesce(sum(amount), 0)
		FROM reservation WHERE run_id = 'race'`).Scan(&resSpent, &granted); err != nil {
		t.Fatal(err)
	}
	if resSpent != run.Spent {
		t.Errorf("reservations posted %d spent, run account says %d", resSpent, run.Spent)
	}
	t.Logf("granted %d tokens over the run, spent %d of %d", granted, run.Spent, run.Limit)
	b.checkJournalNeverOverLimit(t, run)

	// The random race reaches the boundary once, and its last grant may
	// happen to fit. This one always asks past it: 900 of 1,000 reserved,
	// then 8 callers at once want 300 each; together they may get 100.
	edge := b.openRun(t, "race-edge", 1000, 1, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000)
	if _, err := b.ledger.Reserve(b.ctx, grant(edge, budget.ReserveParams{Account: edge.Tasks["t8"], Want: 900, Min: 900, Holder: "edge", TTL: ttl})); err != nil {
		t.Fatal(err)
	}
	var edgeWG sync.WaitGroup
	for i := range 8 {
		edgeWG.Add(1)
		go func() {
			defer edgeWG.Done()
			l := budget.Ledger(b.ledger)
			if i%2 == 1 {
				l = coalesced
			}
			_, err := l.Reserve(b.ctx, grant(edge, budget.ReserveParams{Account: edge.Tasks[fmt.Sprint("t", i)], Want: 300, Min: 1, Holder: "edge", TTL: ttl}))
			if err != nil && !errors.Is(err, budget.ErrExhausted) {
				t.Errorf("edge reserve: %v", err)
			}
		}()
	}
	edgeWG.Wait()
	edgeRun, err := b.ledger.RunAccount(b.ctx, "race-edge")
	if err != nil {
		t.Fatal(err)
	}
	b.checkJournalNeverOverLimit(t, edgeRun)
	b.checkConserved(t)
}

// checkJournalNeverOverLimit asserts I1 on the journal itself, not on the
// final balance (which settle caps): in entry_id order — the commit order of
// every change to the run, since each one holds the run's row lock — no
// prefix of the entries whose chain holds the run reserves and spends more
// than its limit. It does not rely on the CHECK constraint.
func (b *testBundle) checkJournalNeverOverLimit(t *testing.T, run budget.Account) {
	t.Helper()
	var entries int
	var peak, peakEntry int64
	err := b.pool.QueryRow(b.ctx, `
		SELECT count(*), coalesce(max(used), 0),
		       coalesce((array_agg(entry_id ORDER BY used DESC, entry_id))[1], 0)
		  FROM (SELECT entry_id, sum(delta_reserved + delta_spent) OVER (ORDER BY entry_id) AS used
		          FROM ledger_entry WHERE $1 = ANY (chain)) j`, int64(run.ID)).Scan(&entries, &peak, &peakEntry)
	if err != nil {
		t.Fatal(err)
	}
	if entries < 2 {
		t.Fatalf("the run's journal has %d entries; the race did not happen", entries)
	}
	if peak > run.Limit {
		t.Errorf("after entry %d the run had %d tokens reserved and spent, over its limit %d (I1)", peakEntry, peak, run.Limit)
	}
	t.Logf("journal: %d entries, peak reserved+spent %d of %d", entries, peak, run.Limit)
}
