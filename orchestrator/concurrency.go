package orchestrator

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// Concurrency from the rate limits (docs/operations.md#concurrency-from-the-rate-limits):
// a run that leaves limits.max_concurrency unset runs as many tasks at once
// as the rate limits its provider and model call under allow, by Little's
// law, and no more than its share of them.

// RateLimits tells what the fleet knows of the rate limits the providers
// state. A node wires store.ProviderLimits and the run table behind it.
type RateLimits interface {
	// RateLimits returns the limits of provider and model ("" for either:
	// the workers' default) summed over the fleet's keys, and how many
	// RUNNING runs of the fleet name the same provider and model. Nothing
	// known is the zero RateLimit.
	RateLimits(ctx context.Context, provider, model string) (RateLimit, error)
}

// RateLimit is the fleet's view of one provider and model's rate limits.
type RateLimit struct {
	// RPM and TPM are the requests and tokens per minute the providers
	// state, under the workers' configured ceilings, summed over the keys
	// (each key its own limit); 0: none known.
	RPM, TPM int64
	// Throttled counts the 429s the workers have seen for them, in all.
	Throttled int64
	// Runs is how many RUNNING runs of the fleet name the same provider and
	// model (whatever their concurrency).
	Runs int
}

// The starting point of a run's arithmetic, before it has observed a model
// call: a guess on the low side of a hosted model's latency keeps the first
// wave small, and the first calls' figures replace it.
const (
	startSecondsPerCall = 2.0
	startTokensPerCall  = 1000.0
)

// callWindow is how many of a run's latest model calls its averages cover.
const callWindow = 32

// concurrencyInputs is everything a run's concurrency is computed from.
type concurrencyInputs struct {
	provider, model string
	limit           RateLimit
	headroom        float64
	// secondsPerCall and tokensPerCall are the run's averages over its
	// latest calls (observed of them; the starting point when 0);
	// callsPerTask the calls of its ended tasks (0: none ended).
	secondsPerCall, tokensPerCall, callsPerTask float64
	observed                                    int
	// sharing: the runs that share the limit, this one included (>= 1).
	sharing int
	// throttleCap is the AIMD cap 429s set (0: none).
	throttleCap int
	// fallback is the server's default concurrency; most is the server's
	// cap and tasks the run's task count.
	fallback, most, tasks int
}

// arithmetic is the concurrency the limits allow the run, before the
// server's cap, the task count and 429s: by Little's law, the tasks in
// flight that make calls/s allowed = limit × headroom ÷ 60 at s per call
// (each task holds one call at a time, so calls per task cancel out:
// tasks/s = calls/s ÷ calls per task, each task lasting calls per task × s
// per call), and by tokens the same with tokens/s allowed ÷ tokens per call,
// the smaller, each limit the run's even share of it (share). known: some
// limit is.
func (in concurrencyInputs) arithmetic() (n int, why string, known bool) {
	byRPM, byTPM := math.Inf(1), math.Inf(1)
	rpm, tpm := in.share()
	if in.limit.RPM > 0 {
		byRPM = float64(rpm) * in.headroom / 60 * in.secondsPerCall
	}
	if in.limit.TPM > 0 {
		byTPM = float64(tpm) * in.headroom / 60 * in.secondsPerCall / in.tokensPerCall
	}
	if math.IsInf(byRPM, 1) && math.IsInf(byTPM, 1) {
		return in.fallback, fmt.Sprintf("%d: no rate limit is known for provider %q model %q: the server's default",
			in.fallback, in.provider, in.model), false
	}
	start := ""
	if in.observed == 0 {
		start = " (starting point)"
	}
	if byRPM <= byTPM {
		n = floor(byRPM)
		why = fmt.Sprintf("%d = %d RPM × %s ÷ 60 s × %.2f s per call%s, the run's share of the limit",
			n, rpm, decimal(in.headroom), in.secondsPerCall, start)
	} else {
		n = floor(byTPM)
		why = fmt.Sprintf("%d = %d TPM × %s ÷ 60 s × %.2f s per call ÷ %.0f tokens per call%s, the run's share of the limit",
			n, tpm, decimal(in.headroom), in.secondsPerCall, in.tokensPerCall, start)
	}
	return n, why, true
}

// share is the run's even share of the fleet's limits: each divided by the
// runs sharing it, rounded down, at least 1 of a limit that is known. A
// run's event shows its share and never the fleet's figures, which tell of
// other tenants' runs.
func (in concurrencyInputs) share() (rpm, tpm int64) {
	sharing := int64(max(1, in.sharing))
	rpm, tpm = in.limit.RPM/sharing, in.limit.TPM/sharing
	if in.limit.RPM > 0 {
		rpm = max(1, rpm)
	}
	if in.limit.TPM > 0 {
		tpm = max(1, tpm)
	}
	return rpm, tpm
}

// choose is the run's concurrency and why: the arithmetic (or the server's
// default when no limit is known), under the 429s' cap, the server's cap
// and the task count, and never below 1.
func (in concurrencyInputs) choose() (int, string) {
	n, why, _ := in.arithmetic()
	var notes []string
	if in.throttleCap > 0 && in.throttleCap < n {
		n = in.throttleCap
		notes = append(notes, fmt.Sprintf("held to %d after new 429s on the limit (additive increase, multiplicative decrease)", n))
	}
	if in.most > 0 && n > in.most {
		n = in.most
		notes = append(notes, fmt.Sprintf("capped at the server's max_concurrency %d", n))
	}
	if in.tasks > 0 && n > in.tasks {
		n = in.tasks
		notes = append(notes, fmt.Sprintf("capped at the run's %d %s", n, plural(n, "task", "tasks")))
	}
	if n < 1 {
		n = 1
		notes = append(notes, "raised to 1 (never below)")
	}
	if len(notes) > 0 {
		why += "; " + strings.Join(notes, "; ")
	}
	return n, why
}

// floor rounds x down, forgiving the float error of a product that is a
// whole number on paper (600 × 0.7 ÷ 60 × 2 is 14, not 13.999…).
func floor(x float64) int { return int(math.Floor(x + 1e-9)) }

func decimal(f float64) string {
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", f), "0"), ".")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// throttle is a run's additive-increase, multiplicative-decrease cap: when
// the fleet's 429s on its limit grew between two reads, the cap is half the
// concurrency in effect (never below 1); each read after that without a new
// 429 raises it by one, until it no longer binds.
type throttle struct {
	read bool  // a first count was read
	last int64 // the 429s counted at the last read
	cap  int   // 0: none
}

// step takes a read's count of 429s; current is the concurrency in effect,
// arithmetic what the limits allow without the cap.
func (t *throttle) step(throttled int64, current, arithmetic int) {
	switch {
	case !t.read:
		t.read = true
	case throttled > t.last:
		t.cap = max(1, current/2)
	case t.cap > 0:
		t.cap++
		if t.cap >= arithmetic {
			t.cap = 0
		}
	}
	t.last = throttled
}

// callStats are what a run has observed of its model calls: each task's
// iteration is one call, timed from the task's start or its iteration
// before, and costs the tokens its spend grew by.
type callStats struct {
	mu    sync.Mutex
	mark  map[int]callMark // by task index: its start or last iteration
	secs  [callWindow]float64
	toks  [callWindow]float64
	calls int // observed in all; the latest callWindow are kept
	// ended and endedCalls: tasks that ended having made calls, and their calls.
	ended, endedCalls int
}

type callMark struct {
	at     time.Time
	tokens int64
}

func newCallStats() *callStats { return &callStats{mark: map[int]callMark{}} }

// started marks task i's start on a worker (again for a new attempt).
func (s *callStats) started(i int, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mark[i] = callMark{at: now}
}

// iteration records task i's call that ended at now with its spend at
// tokensSpent, after it waited queued (SubagentIteration.waited): the time
// the call held its task is the time since the task's last mark less
// that.
func (s *callStats) iteration(i int, now time.Time, tokensSpent int64, waited time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.mark[i]
	s.mark[i] = callMark{at: now, tokens: tokensSpent}
	if !ok || tokensSpent < m.tokens {
		return // no start seen, or a new attempt's spend
	}
	k := s.calls % callWindow
	s.secs[k], s.toks[k] = max(0, now.Sub(m.at)-waited).Seconds(), float64(tokensSpent-m.tokens)
	s.calls++
}

// taskEnded records that task i ended after iterations calls.
func (s *callStats) taskEnded(i int, iterations int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mark, i)
	if iterations > 0 {
		s.ended++
		s.endedCalls += int(iterations)
	}
}

// averages are the seconds and tokens per call of the latest calls (the
// starting point before any), the calls per ended task, and how many calls
// were observed.
func (s *callStats) averages() (secs, toks, perTask float64, observed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended > 0 {
		perTask = float64(s.endedCalls) / float64(s.ended)
	}
	n := min(s.calls, callWindow)
	if n == 0 {
		return startSecondsPerCall, startTokensPerCall, perTask, 0
	}
	for k := range n {
		secs += s.secs[k]
		toks += s.toks[k]
	}
	secs, toks = secs/float64(n), toks/float64(n)
	// A call of no time or no tokens would divide by zero: a millisecond
	// and a token at least.
	return max(secs, 0.001), max(toks, 1), perTask, s.calls
}

// sizing is a run's concurrency chosen from the rate limits: its state
// between recomputes. The drive goroutine owns it, except stats.
type sizing struct {
	provider, model string
	headroom        float64
	limit           RateLimit // as last read
	gen             uint64    // limit's generation (rateReads): 0 before a read
	throttle        throttle
	stats           *callStats
	chosen          int // in effect; 0 before the first choice
	announced       int // the last ConcurrencyChosen's; 0: none
	// first is the choice Submit made before the run existed, announced by
	// the driver (nil for an adopted run: the driver chooses).
	first *concurrencyInputs
}

// ConcurrencyReader reads the latest ConcurrencyChosen of a run (nil:
// none), for GetRun. store.Runs implements it.
type ConcurrencyReader interface {
	LastConcurrency(ctx context.Context, runID string) (*fanoutv1.ConcurrencyChosen, error)
}

// lastConcurrency sets run's concurrency: its latest ConcurrencyChosen,
// when the run store keeps events it can read so.
func (e *Engine) lastConcurrency(ctx context.Context, run *fanoutv1.Run) error {
	cr, ok := e.store.(ConcurrencyReader)
	if !ok {
		return nil
	}
	c, err := cr.LastConcurrency(ctx, run.GetRunId())
	if err != nil {
		return err
	}
	run.Concurrency = c
	return nil
}

// sizes reports whether the run's concurrency comes from the rate limits:
// it left limits.max_concurrency unset and the engine reads them.
func (e *Engine) sizes(p *plan) bool { return p.autoConcurrency && e.limits != nil }

// sizeFirst chooses a new run's concurrency before it is created (the
// engine's read of the limits, if one is no older than an interval, else a
// new one): its first wave. The run is not RUNNING yet, so it counts itself
// among the runs sharing the limit.
func (e *Engine) sizeFirst(ctx context.Context, p *plan) {
	if !e.sizes(p) {
		return
	}
	m := p.spec.GetModel()
	l, _, ok := e.rates.read(ctx, m.GetProvider(), m.GetModel())
	if !ok {
		return // the driver reads them again
	}
	l.Runs++
	in := e.concurrencyInputs(p, l, newCallStats(), 0)
	p.concurrency, _ = in.choose()
	p.firstSizing = &in
}

// concurrencyInputs gathers the inputs of a choice for run plan p.
func (e *Engine) concurrencyInputs(p *plan, l RateLimit, stats *callStats, throttleCap int) concurrencyInputs {
	secs, toks, perTask, observed := stats.averages()
	m := p.spec.GetModel()
	return concurrencyInputs{provider: m.GetProvider(), model: m.GetModel(), limit: l, headroom: p.headroom,
		secondsPerCall: secs, tokensPerCall: toks, callsPerTask: perTask, observed: observed,
		sharing: max(1, l.Runs), throttleCap: throttleCap,
		fallback: int(e.cfg.DefaultConcurrency), most: int(e.cfg.MaxConcurrency), tasks: len(p.spec.GetTasks())}
}

// startSizing sets up the run's sizing and announces its first choice
// (Submit's, or one made now for an adopted run, from the engine's read of
// its limits). It returns the ticks of its recomputes, nil when the run's
// concurrency is fixed, and their stop.
func (d *driver) startSizing(runCtx context.Context) (<-chan time.Time, func()) {
	if !d.e.sizes(d.p) {
		return nil, func() {}
	}
	m := d.p.spec.GetModel()
	d.sizing = &sizing{provider: m.GetProvider(), model: m.GetModel(), headroom: d.p.headroom,
		stats: newCallStats(), first: d.p.firstSizing}
	release := d.e.rates.use(m.GetProvider(), m.GetModel())
	if in := d.sizing.first; in != nil {
		d.sizing.limit = in.limit // Runs counts the run, as the next read will
		d.sizing.throttle.step(in.limit.Throttled, 0, 0)
		n, why := in.choose()
		d.applyConcurrency(runCtx, n, why, *in)
	} else {
		// Before the drive loop: nothing is dispatched yet.
		ctx, cancel := cleanup(runCtx)
		l, gen, ok := d.e.rates.read(ctx, m.GetProvider(), m.GetModel())
		cancel()
		if ok {
			d.sizing.take(d.e, d.p, l, gen)
		}
		d.resize(runCtx, false)
	}
	t := time.NewTicker(d.e.cfg.ConcurrencyInterval)
	return t.C, func() {
		t.Stop()
		release()
	}
}

// take puts a new read of the limits (generation gen) in effect: a new
// count of 429s moves the throttle.
func (s *sizing) take(e *Engine, p *plan, l RateLimit, gen uint64) {
	s.limit, s.gen = l, gen
	arith, _, _ := e.concurrencyInputs(p, l, s.stats, 0).arithmetic()
	s.throttle.step(l.Throttled, s.chosen, arith)
}

// resize recomputes the run's concurrency: with read (the timer), from the
// engine's last read of the limits, if it is newer than the run's (never
// waiting for one: the engine reads them in the background, rateReads),
// else from what the run observed since (a task ended). A change is
// announced.
func (d *driver) resize(runCtx context.Context, read bool) {
	s := d.sizing
	if s == nil {
		return
	}
	if read {
		l, gen := d.e.rates.last(s.provider, s.model)
		if gen == s.gen {
			return // nothing new read: the tasks' ends recompute the rest
		}
		s.take(d.e, d.p, l, gen)
	}
	in := d.e.concurrencyInputs(d.p, s.limit, s.stats, s.throttle.cap)
	n, why := in.choose()
	d.applyConcurrency(runCtx, n, why, in)
}

// resizeAfter recomputes the run's concurrency after task r ended.
func (d *driver) resizeAfter(runCtx context.Context, r taskResult) {
	if d.sizing == nil {
		return
	}
	d.sizing.stats.taskEnded(r.index, r.outcome.GetSummary().GetIterations())
	d.resize(runCtx, false)
}

// observeStart and observeCall time task i's model calls for the run's
// sizing (called from the task's goroutine).
func (d *driver) observeStart(i int) {
	if d.sizing != nil {
		d.sizing.stats.started(i, time.Now())
	}
}

func (d *driver) observeCall(i int, tokensSpent int64, waited time.Duration) {
	if d.sizing != nil {
		d.sizing.stats.iteration(i, time.Now(), tokensSpent, waited)
	}
}

// applyConcurrency puts n in effect and, when it differs from the last
// one announced, appends a ConcurrencyChosen and records the metric.
func (d *driver) applyConcurrency(runCtx context.Context, n int, why string, in concurrencyInputs) {
	s := d.sizing
	s.chosen, d.p.concurrency = n, n
	if n == s.announced {
		return
	}
	previous := s.announced
	s.announced = n
	concurrencyChosen().Record(context.WithoutCancel(runCtx), int64(n), metric.WithAttributes(
		attribute.String("provider", in.provider), attribute.String("model", in.model)))
	ctx, cancel := cleanup(runCtx)
	defer cancel()
	// The fleet's figures (the summed limits, the runs sharing them, their
	// 429s) tell of other tenants' runs: the event, which the run's tenant
	// reads, has the run's share and its own figures; the operator's log
	// has the rest.
	d.e.cfg.Logger.InfoContext(ctx, "run concurrency chosen from the rate limits", "run_id", d.runID,
		"concurrency", n, "previous", previous, "provider", in.provider, "model", in.model,
		"limit_rpm", in.limit.RPM, "limit_tpm", in.limit.TPM, "runs_sharing", in.sharing, "throttled", in.limit.Throttled)
	rpm, tpm := in.share()
	d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_ConcurrencyChosen{ConcurrencyChosen: &fanoutv1.ConcurrencyChosen{
		Concurrency: int32(n), Previous: int32(previous), Reason: why,
		LimitRequests: rpm, LimitTokens: tpm, Headroom: in.headroom,
		SecondsPerCall: in.secondsPerCall, TokensPerCall: in.tokensPerCall, CallsPerTask: in.callsPerTask,
		ObservedCalls: int32(min(in.observed, math.MaxInt32)), ThrottleCap: int32(in.throttleCap)}}})
}

var (
	concurrencyOnce sync.Once
	concurrencyHist metric.Int64Histogram
)

// concurrencyChosen is the histogram of the concurrencies runs were given
// from the rate limits, by provider and model (no run id: one record per
// choice and change).
func concurrencyChosen() metric.Int64Histogram {
	concurrencyOnce.Do(func() {
		concurrencyHist, _ = otel.Meter(scope).Int64Histogram("fanout.run.concurrency", metric.WithUnit("{task}"),
			metric.WithDescription("Concurrencies chosen for runs from the providers' rate limits (each first choice and change), by provider and model."),
			metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256))
	})
	return concurrencyHist
}
