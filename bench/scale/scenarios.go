package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fanout/fanout/bench/internal/fleet"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// capacityFor is each worker's --capacity for n subagents at once over
// workers: a share and some room, in hundreds (3,400 for 10,000 over 3).
func capacityFor(n, workers int) int {
	share := (n + workers - 1) / workers
	return max(100, (share+99)/100*100)
}

// stage bounds one stage of a scenario by -run-timeout.
func (h *harness) stage(ctx context.Context, what string) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, h.cfg.runLimit, fmt.Errorf("%s ran past -run-timeout %v", what, h.cfg.runLimit))
}

// wide: 10,000 subagents at once over the workers, as one run of 10,000
// tasks and as 100 runs of 100, each task a few sim calls with a tool call
// between two.
func (h *harness) wide(ctx context.Context) ([]*report, error) {
	c := h.cfg
	tool := "search"
	if c.tool == "memory" {
		tool = "memory__search_nodes"
	}
	var out []*report
	for _, sub := range []struct {
		runs, tasks int
		title       string
	}{{1, c.wideTasks, "wide (a): one run of %d tasks"}, {c.wideRuns, c.wideRunTasks, "wide (b): %d runs of %d tasks at once"}} {
		if sub.runs < 1 || sub.tasks < 1 {
			continue
		}
		n := sub.runs * sub.tasks
		title := fmt.Sprintf(sub.title, sub.runs, sub.tasks)
		if sub.runs == 1 {
			title = fmt.Sprintf(sub.title, sub.tasks)
		}
		dc := deployConfig{orchestrators: 1, capacity: capacityFor(n, c.workers), maxTasks: max(sub.tasks, n),
			latency: c.wideLatency, finishAfter: c.wideCalls, mcp: c.tool == "memory"}
		shapeLine := fmt.Sprintf("%d subagents at once over %d workers (--capacity %d each, the run's maxConcurrency its task count); "+
			"each task %d sim calls of %v with a tool call (%s) between two; ideal wall time %v.",
			n, c.workers, dc.capacity, c.wideCalls, c.wideLatency, tool, time.Duration(c.wideCalls)*c.wideLatency)
		r, err := h.loadRuns(ctx, dc, "wide", title, shapeLine, sub.runs, shape{tasks: sub.tasks, tool: tool, iterations: c.wideCalls})
		if r != nil {
			out = append(out, r)
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// memory: one run of n one-call tasks, for each n: memory per running
// subagent at the peak.
func (h *harness) memory(ctx context.Context) ([]*report, error) {
	c := h.cfg
	var out []*report
	for _, n := range c.memoryTasks {
		dc := deployConfig{orchestrators: 1, capacity: capacityFor(n, c.workers), maxTasks: n, latency: c.memoryLatency, finishAfter: 1}
		shapeLine := fmt.Sprintf("one run of %d tasks, each one sim call of %v, no tool (the simplest load); %d workers of --capacity %d. "+
			"Memory per running subagent = (RSS of orchestrator + workers at the sample with the most subagents in flight − idle) / those in flight.",
			n, c.memoryLatency, c.workers, dc.capacity)
		r, err := h.loadRuns(ctx, dc, fmt.Sprintf("memory-%d", n), fmt.Sprintf("memory: one run of %d one-call tasks", n), shapeLine, 1,
			shape{tasks: n, iterations: 1})
		if r != nil {
			out = append(out, r)
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// loadRuns deploys dc and runs runs runs of s at once as one tenant, each
// started with StartRun and followed with WatchRun to its end; it checks
// every run, the ledger, and reports.
func (h *harness) loadRuns(ctx context.Context, dc deployConfig, tenantID, title, shapeLine string, runs int, s shape) (*report, error) {
	d, err := h.deploy(ctx, dc)
	if err != nil {
		return nil, err
	}
	defer d.stop()
	t, err := h.newTenant(ctx, tenantID)
	if err != nil {
		return nil, err
	}
	specs := make([]*fanoutv1.RunSpec, runs)
	for i := range specs {
		specs[i] = h.spec(t, s)
	}
	sctx, cancel := h.stage(ctx, title)
	defer cancel()
	w := h.begin(sctx, d)
	fs := make([]*followed, runs)
	g, gctx := errgroup.WithContext(sctx)
	for i := range runs {
		g.Go(func() error {
			f, err := startAndFollow(gctx, d.client(i), t, specs[i])
			fs[i] = f
			return err
		})
	}
	err = g.Wait()
	r := w.end(ctx, title, shapeLine)
	if err != nil {
		if dead := d.alive(); dead != nil {
			return r, fmt.Errorf("%s: %w (%w)", title, err, dead)
		}
		return r, fmt.Errorf("%s: %w", title, err)
	}
	var ids []string
	var starts, firsts []time.Duration
	var last time.Time
	for _, f := range fs {
		if err := checkSucceeded(f, s.tasks, s.iterations); err != nil {
			var accounts, bad int
			if qerr := h.owner.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE NOT conserved) FROM conservation_check`).Scan(&accounts, &bad); qerr == nil {
				r.notes = append(r.notes, fmt.Sprintf("after the failure: %d of %d accounts not conserved (conservation_check)", bad, accounts))
			}
			var stored, storedStarted, tasksStarted int
			if qerr := h.owner.QueryRow(ctx, `SELECT (SELECT count(*) FROM run_event WHERE run_id = $1),
					(SELECT count(*) FROM run_event WHERE run_id = $1 AND event ? 'task_started'),
					(SELECT count(*) FROM task WHERE run_id = $1 AND started_at IS NOT NULL)`,
				f.id).Scan(&stored, &storedStarted, &tasksStarted); qerr == nil {
				started := 0
				for _, c := range f.started {
					started += c
				}
				r.notes = append(r.notes, fmt.Sprintf("run %s: its WatchRun stream delivered %d events, %d of them TaskStarted; "+
					"the database holds %d events, %d of them TaskStarted, and %d tasks with a started_at", f.id, f.events, started, stored, storedStarted, tasksStarted))
			}
			r.notes = append(r.notes, "FAILED: "+err.Error())
			return r, err
		}
		ids = append(ids, f.id)
		starts, firsts = append(starts, f.startRun), append(firsts, f.firstStarted)
		if f.finished.After(last) {
			last = f.finished
		}
	}
	ledger, err := h.checkLedger(ctx, ids, runs*s.tasks*s.iterations)
	if err != nil {
		return r, err
	}
	r.check = append(r.check, fmt.Sprintf("%d run(s) SUCCEEDED with every task started once (one TaskStarted each) and SUCCEEDED after %d iteration(s), "+
		"the joined result holding all %d outcomes (read by page with gRPC's default receive limit)", runs, s.iterations, runs*s.tasks), ledger)
	ideal := time.Duration(s.iterations) * dc.latency
	wall := last.Sub(w.start)
	r.extra = append(r.extra, [2]string{"StartRun sent → last RunFinished; overhead over the ideal",
		fmt.Sprintf("%v; %v over %v", wall.Round(time.Millisecond), (wall - ideal).Round(time.Millisecond), ideal)})
	r.lat = append(r.lat, latencyRow{"StartRun (client side)", starts}, latencyRow{"first dispatch (StartRun sent → first TaskStarted)", firsts})
	return r, nil
}

// cancel: cancelRuns runs in flight over the orchestrators, a WatchRun
// stream on each (on another orchestrator than the one that took it), then
// CancelRun on every run at once: how long until every stream has its
// RunFinished.
func (h *harness) cancel(ctx context.Context) ([]*report, error) {
	c := h.cfg
	n := c.cancelRuns * c.cancelRunTasks
	dc := deployConfig{orchestrators: c.orchestrators, capacity: capacityFor(n, c.workers), maxTasks: c.cancelRunTasks,
		latency: c.cancelLatency, finishAfter: 1}
	title := fmt.Sprintf("cancel: %d runs in flight over %d orchestrators, each watched, then all cancelled at once", c.cancelRuns, c.orchestrators)
	shapeLine := fmt.Sprintf("%d runs of %d tasks (sim calls of %v: all in flight when cancelled), run i started on orchestrator i mod %d "+
		"and watched (WatchRun from its start) on orchestrator i+1 mod %d; CancelRun of every run sent at once, each to the orchestrator that took it. "+
		"Latency of a cancel: its CancelRun sent → its stream's RunFinished.", c.cancelRuns, c.cancelRunTasks, c.cancelLatency, c.orchestrators, c.orchestrators)
	d, err := h.deploy(ctx, dc)
	if err != nil {
		return nil, err
	}
	defer d.stop()
	t, err := h.newTenant(ctx, "cancel")
	if err != nil {
		return nil, err
	}
	sctx, cancel := h.stage(ctx, title)
	defer cancel()
	w := h.begin(sctx, d)
	type runState struct {
		id       string
		sent     time.Time
		startRun time.Duration
		ready    chan struct{}
		done     chan struct{}
		f        *followed
		err      error
	}
	rs := make([]*runState, c.cancelRuns)
	// Start the runs, at most 64 StartRuns at a time, each followed from
	// its start by a stream on the next orchestrator.
	g, gctx := errgroup.WithContext(sctx)
	g.SetLimit(64)
	for i := range rs {
		rs[i] = &runState{ready: make(chan struct{}), done: make(chan struct{})}
		g.Go(func() error {
			st := rs[i]
			id, sent, took, err := startRun(gctx, d.client(i), t, h.spec(t, shape{tasks: c.cancelRunTasks, iterations: 1}))
			if err != nil {
				return err
			}
			st.id, st.sent, st.startRun = id, sent, took
			go func() {
				defer close(st.done)
				st.f, st.err = watch(sctx, d.client(i+1), t, id, sent, st.ready)
			}()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return []*report{w.end(ctx, title, shapeLine)}, err
	}
	// Every stream open and every task running.
	running := func() (int, error) {
		var k int
		err := h.owner.QueryRow(sctx, `SELECT count(*) FROM task WHERE run_id = ANY($1) AND status = 'RUNNING'`, ids(rs, func(s *runState) string { return s.id })).Scan(&k)
		return k, err
	}
	for _, st := range rs {
		select {
		case <-st.ready:
		case <-st.done:
			return []*report{w.end(ctx, title, shapeLine)}, fmt.Errorf("the stream of run %s ended before the cancel: %w", st.id, st.err)
		case <-sctx.Done():
			return []*report{w.end(ctx, title, shapeLine)}, context.Cause(sctx)
		}
	}
	for {
		k, err := running()
		if err != nil {
			return []*report{w.end(ctx, title, shapeLine)}, err
		}
		if k == n {
			break
		}
		if err := fleet.Sleep(sctx, 250*time.Millisecond); err != nil {
			return []*report{w.end(ctx, title, shapeLine)}, fmt.Errorf("waiting for all %d tasks to run (%d are): %w", n, k, err)
		}
	}
	fmt.Fprintf(os.Stderr, "bench-scale: cancel: %d runs in flight, %d tasks running, %d streams open; cancelling\n", len(rs), n, len(rs))
	cancelSent := make([]time.Time, len(rs))
	wave := time.Now()
	cg, cctx := errgroup.WithContext(sctx)
	for i, st := range rs {
		cg.Go(func() error {
			cancelSent[i] = time.Now()
			_, err := d.client(i).CancelRun(cctx, &fanoutv1.CancelRunRequest{RunId: st.id, Reason: "bench-scale cancel"}, t.creds())
			return err
		})
	}
	if err := cg.Wait(); err != nil {
		return []*report{w.end(ctx, title, shapeLine)}, fmt.Errorf("CancelRun: %w", err)
	}
	calls := time.Since(wave)
	var reach []time.Duration
	var all time.Duration
	for i, st := range rs {
		select {
		case <-st.done:
		case <-sctx.Done():
			return []*report{w.end(ctx, title, shapeLine)}, fmt.Errorf("the stream of run %s had no RunFinished: %w", st.id, context.Cause(sctx))
		}
		if st.err != nil {
			return []*report{w.end(ctx, title, shapeLine)}, st.err
		}
		if s := st.f.fin.GetState(); s != fanoutv1.RunState_RUN_STATE_CANCELLED {
			return []*report{w.end(ctx, title, shapeLine)}, fmt.Errorf("run %s ended %s, want CANCELLED", st.id, s)
		}
		reach = append(reach, st.f.finished.Sub(cancelSent[i]))
		all = max(all, st.f.finished.Sub(wave))
	}
	r := w.end(ctx, title, shapeLine)
	var starts, firsts []time.Duration
	for _, st := range rs {
		starts, firsts = append(starts, st.startRun), append(firsts, st.f.firstStarted)
	}
	r.lat = append(r.lat, latencyRow{"StartRun (client side)", starts}, latencyRow{"first dispatch (StartRun sent → first TaskStarted)", firsts},
		latencyRow{"cancel: CancelRun sent → RunFinished on the stream", reach})
	r.extra = append(r.extra, [2]string{"cancel wave: all CancelRuns answered; every stream finished",
		fmt.Sprintf("%v; %v after the first was sent", calls.Round(time.Millisecond), all.Round(time.Millisecond))})
	var held, accounts, bad int
	if err := h.owner.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'held') FROM reservation WHERE run_id = ANY($1)`,
		ids(rs, func(s *runState) string { return s.id })).Scan(&held); err != nil {
		return []*report{r}, err
	}
	if err := h.owner.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE NOT conserved) FROM conservation_check`).Scan(&accounts, &bad); err != nil {
		return []*report{r}, err
	}
	if held != 0 || bad != 0 {
		return []*report{r}, fmt.Errorf("after the cancels: %d reservations still held, %d of %d accounts not conserved", held, bad, accounts)
	}
	r.check = append(r.check, fmt.Sprintf("every run ended CANCELLED and every stream got its RunFinished; no reservation left held; all %d accounts conserved", accounts))
	return []*report{r}, nil
}

func ids[T any](s []T, id func(T) string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = id(v)
	}
	return out
}

// noisy: the small tenants' fan-outs on the idle fleet, then again while
// one tenant has noisyHot subagents in flight.
func (h *harness) noisy(ctx context.Context) ([]*report, error) {
	c := h.cfg
	small := c.noisyTenants * c.noisySmallTasks
	dc := deployConfig{orchestrators: 1, capacity: capacityFor(c.noisyHot+small, c.workers), maxTasks: max(c.noisyHot, c.noisySmallTasks),
		latency: c.noisyLatency, finishAfter: c.noisyHotCalls}
	title := fmt.Sprintf("noisy: one tenant with %d subagents in flight, %d small tenants' fan-outs", c.noisyHot, c.noisyTenants)
	shapeLine := fmt.Sprintf("%d small tenants at once, each %d fan-outs one after another of %d tasks of one sim call of %v (ideal %v): "+
		"first on the idle fleet, then while tenant busy has one run of %d tasks in flight (%d calls each, the built-in search between two). "+
		"Overhead = StartRun sent → RunFinished − the ideal. The window measured is the second phase.",
		c.noisyTenants, c.noisySmallRuns, c.noisySmallTasks, c.noisyLatency, c.noisyLatency, c.noisyHot, c.noisyHotCalls)
	d, err := h.deploy(ctx, dc)
	if err != nil {
		return nil, err
	}
	defer d.stop()
	busy, err := h.newTenant(ctx, "busy")
	if err != nil {
		return nil, err
	}
	tenants := make([]tenant, c.noisyTenants)
	for i := range tenants {
		if tenants[i], err = h.newTenant(ctx, fmt.Sprintf("small-%02d", i+1)); err != nil {
			return nil, err
		}
	}
	sctx, cancel := h.stage(ctx, title)
	defer cancel()
	idle, err := h.smallFanouts(sctx, d, tenants)
	if err != nil {
		return nil, fmt.Errorf("the small fan-outs on the idle fleet: %w", err)
	}
	w := h.begin(sctx, d)
	spec := h.spec(busy, shape{tasks: c.noisyHot, tool: "search", iterations: c.noisyHotCalls})
	id, sent, took, err := startRun(sctx, d.client(0), busy, spec)
	if err != nil {
		return []*report{w.end(ctx, title, shapeLine)}, err
	}
	hot := make(chan *followed, 1)
	hotErr := make(chan error, 1)
	go func() {
		f, err := watch(sctx, d.client(0), busy, id, sent, nil)
		hotErr <- err
		hot <- f
	}()
	// All of the busy tenant's tasks running.
	for {
		var k int
		if err := h.owner.QueryRow(sctx, `SELECT count(*) FROM task WHERE run_id = $1 AND status = 'RUNNING'`, id).Scan(&k); err != nil {
			return []*report{w.end(ctx, title, shapeLine)}, err
		}
		if k == c.noisyHot {
			break
		}
		if err := fleet.Sleep(sctx, 250*time.Millisecond); err != nil {
			return []*report{w.end(ctx, title, shapeLine)}, fmt.Errorf("waiting for the busy tenant's %d tasks to run (%d are): %w", c.noisyHot, k, err)
		}
	}
	busyAt := time.Since(sent)
	loaded, err := h.smallFanouts(sctx, d, tenants)
	if err != nil {
		return []*report{w.end(ctx, title, shapeLine)}, fmt.Errorf("the small fan-outs beside the busy tenant: %w", err)
	}
	var stillBusy int
	_ = h.owner.QueryRow(sctx, `SELECT count(*) FROM task WHERE run_id = $1 AND status = 'RUNNING'`, id).Scan(&stillBusy)
	r := w.end(ctx, title, shapeLine)
	if _, err := d.client(0).CancelRun(sctx, &fanoutv1.CancelRunRequest{RunId: id, Reason: "bench-scale: noisy done"}, busy.creds()); err != nil {
		return []*report{r}, fmt.Errorf("cancel the busy tenant's run: %w", err)
	}
	if err := <-hotErr; err != nil {
		return []*report{r}, err
	}
	<-hot
	med := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	ratio := float64(med(loaded.overheads)) / float64(max(time.Millisecond, med(idle.overheads)))
	r.lat = append(r.lat, latencyRow{"small fan-outs' overhead, idle fleet", idle.overheads},
		latencyRow{"small fan-outs' overhead, beside the busy tenant", loaded.overheads},
		latencyRow{"small fan-outs' StartRun (client side), beside the busy tenant", loaded.startRuns},
		latencyRow{"small fan-outs' first dispatch, beside the busy tenant", loaded.firsts})
	r.extra = append(r.extra, [2]string{"small fan-outs' overhead, median beside the busy tenant / median on the idle fleet", fmt.Sprintf("%.2fx", ratio)},
		[2]string{"the busy tenant: all tasks running after; still running when the small ones were done",
			fmt.Sprintf("%v (StartRun %v); %d of %d", busyAt.Round(time.Millisecond), took.Round(time.Millisecond), stillBusy, c.noisyHot)})
	r.check = append(r.check, fmt.Sprintf("every small fan-out (%d in each phase) SUCCEEDED, every task started once and SUCCEEDED after 1 call", len(idle.overheads)))
	if stillBusy < c.noisyHot {
		r.notes = append(r.notes, fmt.Sprintf("only %d of the busy tenant's %d tasks were still running when the small fan-outs were done: raise -noisy-hot-calls", stillBusy, c.noisyHot))
	}
	return []*report{r}, nil
}

// smallRuns is what the small tenants' fan-outs measured.
type smallRuns struct {
	overheads, startRuns, firsts []time.Duration
}

// smallFanouts runs every small tenant's fan-outs, the tenants at once,
// each tenant's one after another, and checks each.
func (h *harness) smallFanouts(ctx context.Context, d *deployment, tenants []tenant) (smallRuns, error) {
	c := h.cfg
	var mu sync.Mutex
	var out smallRuns
	g, gctx := errgroup.WithContext(ctx)
	for i, t := range tenants {
		g.Go(func() error {
			for range c.noisySmallRuns {
				f, err := startAndFollow(gctx, d.client(i), t, h.spec(t, shape{tasks: c.noisySmallTasks, iterations: 1}))
				if err != nil {
					return err
				}
				if err := checkSucceeded(f, c.noisySmallTasks, 1); err != nil {
					return err
				}
				mu.Lock()
				out.overheads = append(out.overheads, f.finished.Sub(f.sent)-c.noisyLatency)
				out.startRuns, out.firsts = append(out.startRuns, f.startRun), append(out.firsts, f.firstStarted)
				mu.Unlock()
			}
			return nil
		})
	}
	return out, g.Wait()
}
