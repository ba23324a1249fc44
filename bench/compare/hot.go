package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/fanout/fanout/bench/internal/fleet"
	"github.com/fanout/fanout/subagent/llm"
)

// The hot-tenant case: one tenant with a token budget, N subagents in flight
// at once across the workers, each an agent loop of a few sim calls. It
// measures how many model calls a second the ledger grants and settles
// against the arithmetic limit (N in flight / the call's latency) and how
// many PostgreSQL transactions each model call costs (bench/README.md).

// defaultHotN is -hot's default.
const defaultHotN = 5000

// hotTenant is the tenant of the hot-tenant case's runs: it has a token
// budget (benchTenant has none), so every call's chain goes through it.
const hotTenant = "bench-hot"

// hotCases are the hot-tenant case's runs, one per -hot size.
func (c config) hotCases() []benchCase {
	var out []benchCase
	for i, n := range c.hotSizes {
		out = append(out, benchCase{n: n, calls: c.hotCalls, latency: c.hotLatency, reps: c.hotReps[i], hot: true})
	}
	return out
}

// hotRun is what one run of the hot-tenant case measured.
type hotRun struct {
	overhead time.Duration // wall - calls x latency
	calls    int           // model calls (sim calls of the run)
	peak     int           // sim calls in flight at once, at the most
	// span: from the run's first grant to its last settle (the ledger's
	// reservation.created_at and resolved_at).
	span time.Duration
	// The middle: from the moment the last task's first call started to
	// the moment the first task's last call ended (from Run sent), when
	// every task is in its loop; inFlight is the mean of the calls in
	// flight over it. from >= to: there is none (the first task was done
	// before the last one started).
	from, to time.Duration
	inFlight float64
	xids     int64  // write transactions on the server, Run sent -> RunFinished
	phases   string // where the time went (fanoutRun.phases)
	cpu      cpuTimes
	// ledger: when the run's grants were made (first to last, from Run
	// sent), how many were on a slice (chain [task]), its ledger entries
	// by kind.
	ledger string
}

// perSecond is the run's model calls a second, granted and settled, over
// its span.
func (h hotRun) perSecond() float64 { return float64(h.calls) / h.span.Seconds() }

// middlePerSecond is the model calls a second in the middle, by Little's
// law: each call is in flight exactly the sim's latency.
func (h hotRun) middlePerSecond(latency time.Duration) float64 { return h.inFlight / latency.Seconds() }

// measureHot makes tenant hotTenant with a budget that none of the runs
// can exhaust, then runs each case of hot on a deployment of its own (base,
// with the tenant's key, a capacity of the case's N on every worker, and
// the sim's call logs) and prints its report unless cfg.smoke.
func measureHot(ctx context.Context, cfg config, base fanoutConfig, tmp string, hot []benchCase, began time.Time) error {
	var budget int64
	for _, c := range hot {
		budget += 2 * int64(cfg.warmup+c.reps) * int64(c.n) * c.budgetPerTask()
	}
	token, err := fleet.CreateKey(ctx, base.Bin, base.OwnerURL, hotTenant, "bench-compare", "run,read", budget)
	if err != nil {
		return err
	}
	// A run of N tasks in flight takes longer to start and end than the
	// other cases' runs.
	limit := max(cfg.runLimit, 5*time.Minute)
	for _, c := range hot {
		fc := base
		fc.Token, fc.Tenant = token, hotTenant
		fc.Capacity, fc.Latency, fc.Calls = c.n, c.latency, c.calls
		fc.SimLogs = filepath.Join(tmp, "sim-hot-"+strconv.Itoa(c.n))
		loadBefore := fleet.LoadAverage()
		runs, err := measureHotCase(ctx, cfg, fc, c, limit, filepath.Join(tmp, "pg", "postmaster.pid"))
		if err != nil {
			return fmt.Errorf("fanout, %s: %w", c.label(), err)
		}
		fmt.Fprintf(os.Stderr, "bench-compare: %s done (%v so far)\n", c.label(), time.Since(began).Round(time.Second))
		if !cfg.smoke {
			printHot(os.Stdout, cfg, c, runs, budget)
			fmt.Fprintf(os.Stdout, "\nload average (1, 5, 15 min) on %d CPUs: %s before, %s after: the higher, the noisier\n",
				runtime.NumCPU(), loadBefore, fleet.LoadAverage())
		}
	}
	return nil
}

// measureHotCase starts the deployment fc and runs case c on it, the
// warm-ups and then c.reps measured runs, each checked as every fanout run
// is and then under the tenant's account.
func measureHotCase(ctx context.Context, cfg config, fc fanoutConfig, c benchCase, limit time.Duration, pgPIDFile string) ([]hotRun, error) {
	fo, err := startFanout(ctx, fc)
	if err != nil {
		return nil, err
	}
	defer fo.stop()
	var out []hotRun
	for rep := -cfg.warmup; rep < c.reps; rep++ { // reps below 0 are the warm-ups
		before := fo.cpu(pgPIDFile)
		fr, err := fo.run(ctx, c, limit)
		if err != nil {
			return nil, err
		}
		used := fo.cpu(pgPIDFile).minus(before)
		hr, err := fo.hot(ctx, c, fr)
		if err != nil {
			return nil, err
		}
		hr.cpu = used
		if rep >= 0 {
			out = append(out, hr)
		}
		if err := fleet.Sleep(ctx, cfg.pause); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// hot checks that run fr of case c was opened under the tenant's account
// and measures it: its sim calls from the workers' call logs, its grants and
// settles from the ledger.
func (f *fanoutSide) hot(ctx context.Context, c benchCase, fr fanoutRun) (hotRun, error) {
	var underTenant bool
	if err := f.queryRow(ctx, `SELECT r.chain[1] = t.account_id
		FROM account r JOIN account t ON t.kind = 'tenant' AND t.tenant_id = r.tenant_id
		WHERE r.kind = 'run' AND r.run_id = $1`, fr.runID).Scan(&underTenant); err != nil {
		return hotRun{}, fmt.Errorf("read the accounts of run %s: %w", fr.runID, err)
	}
	if !underTenant {
		return hotRun{}, fmt.Errorf("run %s is not under its tenant's account: the hot-tenant case measures a tenant with a budget", fr.runID)
	}
	var calls []llm.CallRecord
	for _, path := range f.simLogs {
		recs, err := llm.ReadCallLog(path)
		if err != nil {
			return hotRun{}, err
		}
		for _, r := range recs {
			if r.RunID == fr.runID {
				calls = append(calls, r)
			}
		}
	}
	if want := c.n * c.calls; len(calls) != want {
		return hotRun{}, fmt.Errorf("run %s: the sim logged %d calls, want %d", fr.runID, len(calls), want)
	}
	h := hotRun{overhead: fr.wall - c.ideal(), calls: len(calls), xids: fr.xids, phases: fr.phases}
	from, to := middle(calls)
	h.peak, h.inFlight = inFlight(calls, from, to)
	h.from, h.to = from.Sub(fr.start), to.Sub(fr.start)
	var first, last time.Time
	if err := f.queryRow(ctx, `SELECT min(created_at), max(resolved_at) FROM reservation WHERE run_id = $1`,
		fr.runID).Scan(&first, &last); err != nil {
		return hotRun{}, fmt.Errorf("read the first grant and the last settle of run %s: %w", fr.runID, err)
	}
	h.span = last.Sub(first)
	var lastGrant time.Time
	var sliced int
	if err := f.queryRow(ctx, `SELECT max(created_at), count(*) FILTER (WHERE cardinality(chain) = 1)
		FROM reservation WHERE run_id = $1`, fr.runID).Scan(&lastGrant, &sliced); err != nil {
		return hotRun{}, fmt.Errorf("read the grants of run %s: %w", fr.runID, err)
	}
	var entries string
	if err := f.queryRow(ctx, `SELECT string_agg(kind || ' ' || n, ', ' ORDER BY kind)
		FROM (SELECT kind, count(*) AS n FROM ledger_entry WHERE run_id = $1 GROUP BY kind) e`, fr.runID).Scan(&entries); err != nil {
		return hotRun{}, fmt.Errorf("count the ledger entries of run %s: %w", fr.runID, err)
	}
	h.ledger = fmt.Sprintf("grants %.2f..%.2f s, last settle %.2f s; %d of %d calls on a slice (chain [task]); ledger entries: %s",
		first.Sub(fr.start).Seconds(), lastGrant.Sub(fr.start).Seconds(), last.Sub(fr.start).Seconds(), sliced, len(calls), entries)
	return h, nil
}

// middle returns the span when every task is in its loop: from the moment
// the last task's first call started to the moment the first task's last
// call ended.
func middle(calls []llm.CallRecord) (from, to time.Time) {
	first, last := map[string]time.Time{}, map[string]time.Time{}
	for _, c := range calls {
		if t, ok := first[c.TaskID]; !ok || c.Start.Before(t) {
			first[c.TaskID] = c.Start
		}
		if t, ok := last[c.TaskID]; !ok || c.End.After(t) {
			last[c.TaskID] = c.End
		}
	}
	for _, t := range first {
		if t.After(from) {
			from = t
		}
	}
	for _, t := range last {
		if to.IsZero() || t.Before(to) {
			to = t
		}
	}
	return from, to
}

// inFlight returns the most calls in flight at once, and the mean of the
// calls in flight from from to to (0 if from is not before to).
func inFlight(calls []llm.CallRecord, from, to time.Time) (peak int, mean float64) {
	type edge struct {
		at    time.Time
		delta int
	}
	edges := make([]edge, 0, 2*len(calls))
	for _, c := range calls {
		edges = append(edges, edge{c.Start, 1}, edge{c.End, -1})
	}
	// At one instant, ends before starts: a call that ends as another
	// starts is not two in flight.
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	level := 0
	var area float64 // calls x seconds in flight in [from, to]
	for i, e := range edges {
		level += e.delta
		peak = max(peak, level)
		if i+1 < len(edges) {
			// level holds from e.at to the next edge: count its part in [from, to].
			lo, hi := maxTime(e.at, from), minTime(edges[i+1].at, to)
			if hi.After(lo) {
				area += float64(level) * hi.Sub(lo).Seconds()
			}
		}
	}
	if to.After(from) {
		mean = area / to.Sub(from).Seconds()
	}
	return peak, mean
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// printHot prints the hot-tenant case's report: one row per repetition
// and their medians.
func printHot(w io.Writer, cfg config, c benchCase, runs []hotRun, budget int64) {
	limit := float64(c.n) / c.latency.Seconds()
	fmt.Fprintf(w, "\nbench-compare, hot tenant: one tenant with a budget (%d tokens, no period), one run of N = %d tasks, maxConcurrency %d,\n",
		budget, c.n, c.n)
	fmt.Fprintf(w, "  each an agent loop of %d sim calls of %v (a tool call between two); %d workers of capacity %d; fanout alone;\n",
		c.calls, c.latency, cfg.workers, c.n)
	fmt.Fprintf(w, "  %s; overhead = wall - %v; the limit = N in flight / latency = %.0f model calls/s.\n", warmups(cfg.warmup), c.ideal(), limit)
	fmt.Fprintf(w, "  in flight: sim calls at once (the workers' --sim-log). middle: from the last task's first call to the first task's last\n")
	fmt.Fprintf(w, "  call's end (every task in its loop), its calls/s = mean in flight / latency (Little's law: a call lasts the latency).\n")
	fmt.Fprintf(w, "  granted+settled/s: the run's calls / (its last settle - its first grant), by the ledger's times (reservation.created_at,\n")
	fmt.Fprintf(w, "  resolved_at). txn/call: write transactions on the whole server (xid delta, Run sent -> RunFinished) per model call.\n\n")
	rows := [][]string{{"rep", "overhead", "peak in flight", "middle (s from Run)", "middle calls/s", "of the limit",
		"granted+settled/s", "of the limit", "txn/call"}}
	var overheads []time.Duration
	var peaks, middles, middleShares, rates, shares, txn []float64
	medianCol := func(v []float64, format string) string {
		if len(v) == 0 {
			return "-"
		}
		return fmt.Sprintf(format, medianOf(v))
	}
	for i, r := range runs {
		m := r.middlePerSecond(c.latency)
		middleCol, middleRate, middleShare := "none", "-", "-"
		if r.to > r.from {
			middleCol = fmt.Sprintf("%.2f..%.2f", r.from.Seconds(), r.to.Seconds())
			middleRate, middleShare = fmt.Sprintf("%.0f", m), fmt.Sprintf("%.2f", m/limit)
			middles, middleShares = append(middles, m), append(middleShares, m/limit)
		}
		perCall := float64(r.xids) / float64(r.calls)
		rows = append(rows, []string{strconv.Itoa(i + 1), overhead(r.overhead), strconv.Itoa(r.peak), middleCol, middleRate, middleShare,
			fmt.Sprintf("%.0f", r.perSecond()), fmt.Sprintf("%.2f", r.perSecond()/limit), fmt.Sprintf("%.2f", perCall)})
		overheads, peaks = append(overheads, r.overhead), append(peaks, float64(r.peak))
		rates, shares, txn = append(rates, r.perSecond()), append(shares, r.perSecond()/limit), append(txn, perCall)
	}
	rows = append(rows, []string{"median", overhead(median(overheads)), fmt.Sprintf("%.0f", medianOf(peaks)), "",
		medianCol(middles, "%.0f"), medianCol(middleShares, "%.2f"),
		fmt.Sprintf("%.0f", medianOf(rates)), fmt.Sprintf("%.2f", medianOf(shares)), fmt.Sprintf("%.2f", medianOf(txn))})
	printTable(w, rows)
	fmt.Fprintf(w, "\nCPU seconds per repetition (from /proc, Run sent -> checks done; %d CPUs): orchestrator, workers, PostgreSQL, this driver:\n", runtime.NumCPU())
	for i, r := range runs {
		fmt.Fprintf(w, "  %d: %s\n", i+1, r.cpu)
	}
	if len(runs) > 0 {
		last := runs[len(runs)-1]
		fmt.Fprintf(w, "\nwhere the last repetition's time went (event times recorded by PostgreSQL, from Run sent):\n  %s\n  %s\n", last.phases, last.ledger)
	}
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cpuTimes is CPU time used (user + system), in seconds, by the deployment's
// processes: the orchestrator, the workers together, PostgreSQL (the
// postmaster, its children and the children it reaped) and the driver.
type cpuTimes struct{ orch, workers, pg, driver float64 }

func (c cpuTimes) minus(o cpuTimes) cpuTimes {
	return cpuTimes{c.orch - o.orch, c.workers - o.workers, c.pg - o.pg, c.driver - o.driver}
}

func (c cpuTimes) String() string {
	return fmt.Sprintf("%.1f, %.1f, %.1f, %.1f s (%.1f in all)", c.orch, c.workers, c.pg, c.driver, c.orch+c.workers+c.pg+c.driver)
}

// cpu reads the deployment's CPU times now; PostgreSQL's postmaster is the
// pid in pgPIDFile. A process it cannot read counts 0.
func (f *fanoutSide) cpu(pgPIDFile string) cpuTimes {
	var c cpuTimes
	c.orch, _ = fleet.ProcCPU(f.fleet.Orchestrators[0].Pid(), false)
	for _, w := range f.fleet.Workers {
		t, _ := fleet.ProcCPU(w.Pid(), false)
		c.workers += t
	}
	c.driver, _ = fleet.ProcCPU(os.Getpid(), false)
	if postmaster, err := fleet.PIDFromFile(pgPIDFile); err == nil {
		c.pg = fleet.TreeCPU(postmaster)
	}
	return c
}
