package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fanout/fanout/bench/internal/fleet"
)

// cpuTimes is CPU seconds (user + system) of the orchestrators, the
// workers and PostgreSQL (the postmaster, its backends and those it
// reaped).
type cpuTimes struct{ orch, workers, pg float64 }

func (h *harness) cpu(d *deployment) cpuTimes {
	var c cpuTimes
	for _, n := range d.fl.Orchestrators {
		t, _ := fleet.ProcCPU(n.Pid(), true) // with the children it reaped
		c.orch += t
	}
	for _, n := range d.fl.Workers {
		c.workers += fleet.TreeCPU(n.Pid()) // with the MCP servers it runs
	}
	if pm, err := h.db.Postmaster(); err == nil {
		c.pg = fleet.TreeCPU(pm)
	}
	return c
}

// window is what a scenario measures between begin and end.
type window struct {
	h       *harness
	d       *deployment
	start   time.Time
	cpu0    cpuTimes
	busy0   machineCPU
	xacts0  int64
	wal0    string // pg_current_wal_lsn() at the start
	size0   int64  // pg_database_size at the start
	starts0 int64
	hist0   map[string]fleet.Histogram
	sampler *sampler
}

// histograms are the /metrics histograms a report reads, over every node:
// a ledger reserve's duration, a cancel's reach.
var histogramsRead = map[string]struct {
	name  string
	match map[string]string
}{
	"reserve": {"fanout_ledger_operation_duration_seconds", map[string]string{"fanout_ledger_operation": "reserve"}},
	"cancel":  {"fanout_cancel_latency_seconds", nil},
}

func (w *window) histograms(ctx context.Context) map[string]fleet.Histogram {
	out := map[string]fleet.Histogram{}
	for _, n := range append(append([]*fleet.Node(nil), w.d.fl.Orchestrators...), w.d.fl.Workers...) {
		m, err := fleet.Scrape(ctx, n.Metrics)
		if err != nil {
			continue
		}
		for k, hh := range histogramsRead {
			out[k] = out[k].Add(m.Histogram(hh.name, hh.match))
		}
	}
	return out
}

func (h *harness) xacts(ctx context.Context) int64 {
	var n int64
	// pg_stat_database is flushed by each backend about once a second.
	_ = h.owner.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n
}

// begin takes the idle sample and starts measuring.
func (h *harness) begin(ctx context.Context, d *deployment) *window {
	w := &window{h: h, d: d}
	w.hist0 = w.histograms(ctx)
	w.xacts0 = h.xacts(ctx)
	_ = h.owner.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, pg_database_size(current_database())`).Scan(&w.wal0, &w.size0)
	w.cpu0 = h.cpu(d)
	w.busy0 = readMachineCPU()
	w.starts0 = startRetries.Load()
	w.sampler = h.startSampler(ctx, d)
	w.start = time.Now()
	return w
}

// report is one scenario's table.
type report struct {
	title, shape string
	wall         time.Duration
	calls        int64 // model calls (reservations made in the window)
	samples      []sample
	cpu          cpuTimes
	busy         float64 // the machine's CPUs busy, all processes, 0..1
	xacts        int64
	walBytes     int64 // WAL written in the window
	growth       int64 // the database's growth in the window, bytes
	retries      int64 // StartRuns sent again after RESOURCE_EXHAUSTED
	hist         map[string]fleet.Histogram
	waits        string
	// latencies measured by the harness, by row name.
	lat   []latencyRow
	extra [][2]string // scenario rows
	check []string    // what was checked, and held
	notes []string
}

type latencyRow struct {
	name string
	ds   []time.Duration
}

// end stops measuring and makes the report's common part.
func (w *window) end(ctx context.Context, title, shape string) *report {
	wall := time.Since(w.start)
	r := &report{title: title, shape: shape, wall: wall}
	r.samples = w.sampler.stop(ctx)
	c := w.h.cpu(w.d)
	r.cpu = cpuTimes{c.orch - w.cpu0.orch, c.workers - w.cpu0.workers, c.pg - w.cpu0.pg}
	r.busy = readMachineCPU().busySince(w.busy0)
	r.retries = startRetries.Load() - w.starts0
	_ = fleet.Sleep(ctx, 1100*time.Millisecond) // let pg_stat_database catch up with the last transactions
	r.xacts = w.h.xacts(ctx) - w.xacts0
	_ = w.h.owner.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint,
		pg_database_size(current_database()) - $2`, w.wal0, w.size0).Scan(&r.walBytes, &r.growth)
	_ = w.h.owner.QueryRow(ctx, `SELECT count(*) FROM reservation WHERE created_at >= $1`, w.start.Add(-time.Second)).Scan(&r.calls)
	r.hist = map[string]fleet.Histogram{}
	for k, v := range w.histograms(ctx) {
		r.hist[k] = v.Minus(w.hist0[k])
	}
	r.waits = w.sampler.topWaits(3)
	r.notes = append(r.notes, w.sampler.errs...)
	return r
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/1024) }

// peakOf is the largest of f over the samples, and its sample.
func peakOf[T cmp.Ordered](ss []sample, f func(sample) T) (T, sample) {
	var best T
	var at sample
	for i, s := range ss {
		if v := f(s); i == 0 || v > best {
			best, at = v, s
		}
	}
	return best, at
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "\n## %s\n\n%s\n\n", r.title, r.shape)
	rows := [][2]string{{"wall time of the load", r.wall.Round(time.Millisecond).String()}}
	rows = append(rows, r.extra...)
	if len(r.samples) > 0 {
		idle := r.samples[0]
		pick := func(f func(sample) int64) string {
			p, _ := peakOf(r.samples, f)
			return fmt.Sprintf("%s idle, %s peak", mib(f(idle)), mib(p))
		}
		rows = append(rows,
			[2]string{"orchestrator RSS (all)", pick(func(s sample) int64 { return s.orchRSS })},
			[2]string{"orchestrator Go heap live (gctrace, all)", pick(func(s sample) int64 { return s.orchHeap })},
			[2]string{"orchestrator goroutine stacks (gctrace)", pick(func(s sample) int64 { return s.orchStacks })},
			[2]string{"worker RSS (all)", pick(func(s sample) int64 { return s.workerRSS })},
			[2]string{"worker Go heap live (gctrace, all)", pick(func(s sample) int64 { return s.workerHeap })},
			[2]string{"worker goroutine stacks (gctrace)", pick(func(s sample) int64 { return s.workerStacks })})
		gor := func(f func(sample) float64) string {
			p, _ := peakOf(r.samples, f)
			if p < 0 {
				return "n/a (no go_goroutines on /metrics)"
			}
			return fmt.Sprintf("%.0f idle, %.0f peak", f(idle), p)
		}
		rows = append(rows, [2]string{"goroutines, orchestrators", gor(func(s sample) float64 { return s.orchGoroutines })},
			[2]string{"goroutines, workers", gor(func(s sample) float64 { return s.workerGoroutines })})
		peak, at := peakOf(r.samples, func(s sample) float64 { return s.inFlight })
		if peak > 0 {
			per := float64(at.rss()-idle.rss()) / peak
			heap := float64(at.orchHeap+at.workerHeap-idle.orchHeap-idle.workerHeap) / peak
			rows = append(rows, [2]string{"subagents in flight, peak (workers' /metrics)", fmt.Sprintf("%.0f", peak)},
				[2]string{"memory per running subagent: RSS (orch + workers, at the peak − idle) / in flight", kib(per)},
				[2]string{"  of it Go heap live (gctrace), orch + workers", kib(heap)},
				[2]string{"  orchestrator heap alone", kib(float64(at.orchHeap-idle.orchHeap) / peak)},
				[2]string{"  worker RSS alone", kib(float64(at.workerRSS-idle.workerRSS) / peak)})
		}
		pc, pat := peakOf(r.samples, func(s sample) int { return s.pgConns })
		rows = append(rows, [2]string{"PostgreSQL connections", fmt.Sprintf("%d idle, %d peak (%s)", idle.pgConns, pc, byApp(pat.pgByApp))})
	}
	rows = append(rows, [2]string{"PostgreSQL transactions/s (pg_stat_database)", fmt.Sprintf("%.0f (%d in %v)", float64(r.xacts)/r.wall.Seconds(), r.xacts, r.wall.Round(time.Second))})
	rows = append(rows, [2]string{"model calls (reservations made)", fmt.Sprintf("%d (%.0f/s)", r.calls, float64(r.calls)/r.wall.Seconds())})
	if r.calls > 0 {
		rows = append(rows, [2]string{"PostgreSQL WAL written; database growth (per model call)", fmt.Sprintf("%.1f MiB, %.1f KiB a call; %.1f MiB, %.1f KiB a call",
			float64(r.walBytes)/(1<<20), float64(r.walBytes)/float64(r.calls)/1024, float64(r.growth)/(1<<20), float64(r.growth)/float64(r.calls)/1024)})
	}
	if r.calls > 0 {
		k := float64(r.calls) / 1000
		rows = append(rows, [2]string{"CPU s per 1,000 model calls: orchestrators, workers, PostgreSQL",
			fmt.Sprintf("%.2f, %.2f, %.2f", r.cpu.orch/k, r.cpu.workers/k, r.cpu.pg/k)})
	}
	machine := r.wall.Seconds() * float64(runtime.NumCPU())
	rows = append(rows, [2]string{"CPU share of the machine: orchestrators, workers, PostgreSQL",
		fmt.Sprintf("%.0f%%, %.0f%%, %.0f%% (%d CPUs)", 100*r.cpu.orch/machine, 100*r.cpu.workers/machine, 100*r.cpu.pg/machine, runtime.NumCPU())})
	rows = append(rows, [2]string{"the machine's CPUs busy (/proc/stat, every process: others' tests too)", fmt.Sprintf("%.0f%%", 100*r.busy)})
	rows = append(rows, [2]string{"StartRuns answered RESOURCE_EXHAUSTED (\"retry later\") and sent again", fmt.Sprintf("%d", r.retries)})
	for _, l := range r.lat {
		rows = append(rows, [2]string{l.name + " p50 / p99 / max", percentiles(l.ds)})
	}
	for _, k := range []string{"reserve", "cancel"} {
		name := map[string]string{"reserve": "reserve (ledger, /metrics fanout_ledger_operation_duration)",
			"cancel": "cancel's reach (/metrics fanout_cancel_latency)"}[k]
		rows = append(rows, [2]string{name + " p50 / p99", histQuantiles(r.hist[k])})
	}
	rows = append(rows, [2]string{"PostgreSQL waits of active backends", r.waits})
	rows = append(rows, [2]string{"what saturated first", r.saturated()})
	fmt.Fprintf(w, "| %s | value |\n|---|---|\n", "measure")
	for _, row := range rows {
		fmt.Fprintf(w, "| %s | %s |\n", row[0], strings.ReplaceAll(row[1], "|", "/"))
	}
	for _, c := range r.check {
		fmt.Fprintf(w, "\n- checked: %s", c)
	}
	for _, n := range r.notes {
		fmt.Fprintf(w, "\n- note: %s", n)
	}
	fmt.Fprintln(w)
}

// saturated says which resource ran hottest: the machine's CPU and who
// used it, and PostgreSQL's commonest wait.
func (r *report) saturated() string {
	machine := r.wall.Seconds() * float64(runtime.NumCPU())
	type use struct {
		who string
		s   float64
	}
	uses := []use{{"orchestrator CPU", r.cpu.orch}, {"worker CPU", r.cpu.workers}, {"PostgreSQL CPU", r.cpu.pg}}
	sortDesc(uses, func(u use) float64 { return u.s })
	all := (r.cpu.orch + r.cpu.workers + r.cpu.pg) / machine
	s := fmt.Sprintf("busiest: %s (%.0f%% of the machine; the fleet and PostgreSQL %.0f%% together, every process %.0f%%)",
		uses[0].who, 100*uses[0].s/machine, 100*all, 100*r.busy)
	if r.busy >= 0.9 {
		s = "the machine's CPU; " + s
	}
	return s + "; top PostgreSQL wait: " + strings.SplitN(r.waits, ",", 2)[0]
}

func byApp(m map[string]int) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	var out []string
	for _, k := range ks {
		out = append(out, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(out, ", ")
}

func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d.Microseconds())/1000) }
	return fmt.Sprintf("%s / %s / %s ms (n=%d)", ms(fleet.Quantile(ds, 0.5)), ms(fleet.Quantile(ds, 0.99)), ms(fleet.Quantile(ds, 1)), len(ds))
}

func histQuantiles(h fleet.Histogram) string {
	if h.Count() == 0 {
		return "- (none on /metrics)"
	}
	f := func(v float64) string {
		if math.IsInf(v, 1) {
			return fmt.Sprintf("> %.0f ms", 1000*h.Bounds[len(h.Bounds)-2])
		}
		return fmt.Sprintf("≤ %g ms", 1000*v)
	}
	return fmt.Sprintf("%s / %s (n=%.0f, mean %.1f ms; bucket bounds)", f(h.Quantile(0.5)), f(h.Quantile(0.99)), h.Count(), 1000*h.Sum/h.Count())
}

func sortDesc[T any, K cmp.Ordered](s []T, key func(T) K) {
	slices.SortStableFunc(s, func(a, b T) int { return cmp.Compare(key(b), key(a)) })
}

// machineCPU is /proc/stat's first line: the machine's CPU time, all of it
// and idle (idle + iowait), in ticks.
type machineCPU struct{ total, idle int64 }

func readMachineCPU() machineCPU {
	var m machineCPU
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return m
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i >= 7 { // steal, guest and guest_nice: guest time is in user already
			break
		}
		m.total += n
		if i == 3 || i == 4 {
			m.idle += n
		}
	}
	return m
}

// busySince is the share of the machine's CPU time busy since o.
func (m machineCPU) busySince(o machineCPU) float64 {
	total := m.total - o.total
	if total <= 0 {
		return 0
	}
	return 1 - float64(m.idle-o.idle)/float64(total)
}
