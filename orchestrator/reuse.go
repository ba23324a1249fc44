package orchestrator

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"go.opentelemetry.io/otel/metric"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// RecordedTasks reads the tasks of a tenant's earlier runs whose facts a new
// run may reuse instead of running them (docs/budget.md#fork,
// docs/budget.md#the-result-cache). Package store implements it
// (store.Runs).
type RecordedTasks interface {
	// CachedTasks returns, of each of keys, the tenant's newest task that
	// SUCCEEDED with that content key no longer than maxAge ago, with its
	// sent writes. Never another tenant's.
	CachedTasks(ctx context.Context, tenantID string, keys []string, maxAge time.Duration) ([]runs.Recorded, error)
	// SentWrites returns how many writes each task of the tenant's run
	// sent (or may have: unknown), by task id.
	SentWrites(ctx context.Context, tenantID, runID string) (map[string]int32, error)
}

// errNoRecordedTasks: the engine was built without RecordedTasks; ForkRun
// and RunSpec.cache are UNIMPLEMENTED.
var errNoRecordedTasks = errors.New("this orchestrator cannot read recorded tasks (no RecordedTasks)")

// Reuse's ways (ReusedFrom.via).
const (
	viaFork  = "fork"
	viaCache = "cache"
)

// maxTaskMaxAge bounds RunSpec.cache.task_max_age.
const maxTaskMaxAge = 30 * 24 * time.Hour

// contentKeys returns the content key of each task of spec, by dispatch
// index (docs/budget.md#the-result-cache): the SHA-256 of what the task is
// asked — its instruction, its tools (as a set), the run's goal and model —
// and of its dependencies' keys (as a set), so that a task whose
// dependency's content changed has another key. Its id, budget, limits,
// timeout and hedge are not content: they bound how it runs, not what it
// answers. spec's dependencies must name its tasks without a cycle (plan
// checked).
func contentKeys(spec *fanoutv1.RunSpec) []string {
	tasks := spec.GetTasks()
	index := make(map[string]int, len(tasks))
	for i, t := range tasks {
		index[t.GetId()] = i
	}
	keys := make([]string, len(tasks))
	var key func(i int) string
	key = func(i int) string {
		if keys[i] != "" {
			return keys[i]
		}
		t := tasks[i]
		h := sha256.New()
		field := func(s string) {
			_ = binary.Write(h, binary.BigEndian, uint64(len(s)))
			h.Write([]byte(s))
		}
		m := spec.GetModel()
		field("fanout.task.content.v1")
		field(spec.GetGoal())
		field(m.GetProvider())
		field(m.GetModel())
		_ = binary.Write(h, binary.BigEndian, math.Float64bits(m.GetTemperature()))
		_ = binary.Write(h, binary.BigEndian, int64(m.GetMaxOutputTokens()))
		_ = binary.Write(h, binary.BigEndian, m.GetSeed())
		field(t.GetInstruction())
		tools := slices.Compact(slices.Sorted(slices.Values(t.GetAllowedTools())))
		_ = binary.Write(h, binary.BigEndian, uint64(len(tools)))
		for _, name := range tools {
			field(name)
		}
		var deps []string
		for _, d := range t.GetDependsOn() {
			deps = append(deps, key(index[d]))
		}
		deps = slices.Sorted(slices.Values(deps)) // a multiset: two inputs of the same content are two
		_ = binary.Write(h, binary.BigEndian, uint64(len(deps)))
		for _, d := range deps {
			field(d)
		}
		keys[i] = hex.EncodeToString(h.Sum(nil))
		return keys[i]
	}
	for i := range tasks {
		key(i)
	}
	return keys
}

// forkSource is the recorded run a fork reuses: its id, and its tasks that
// SUCCEEDED (so far, if it is still running) by content key, with the
// writes each sent.
type forkSource struct {
	runID  string
	byKey  map[string]*fanoutv1.TaskOutcome
	writes map[string]int32
	// wrote: the source's tasks that sent writes and did not succeed, by
	// content key: a fork that ran such a task unchanged would send them
	// again.
	wrote map[string]*fanoutv1.TaskOutcome
}

// newForkSource indexes run's tasks that SUCCEEDED by content key.
func newForkSource(run *fanoutv1.Run, writes map[string]int32) *forkSource {
	src := &forkSource{runID: run.GetRunId(), byKey: map[string]*fanoutv1.TaskOutcome{}, writes: writes,
		wrote: map[string]*fanoutv1.TaskOutcome{}}
	keys := contentKeys(run.GetSpec())
	for _, o := range run.GetTasks() {
		i := int(o.GetDispatchIndex())
		if i < len(keys) && o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED && writes[o.GetTaskId()] > 0 {
			src.wrote[keys[i]] = o
		}
		if i < len(keys) && o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			if _, dup := src.byKey[keys[i]]; !dup {
				src.byKey[keys[i]] = o
			}
		}
	}
	return src
}

// reusedFrom is how a new task reuses recorded task o of run runID, which
// sent writes writes: by its ReusedFrom, the task that ran, when o had
// itself reused another's facts.
func reusedFrom(runID string, o *fanoutv1.TaskOutcome, writes int32, via string) *fanoutv1.ReusedFrom {
	r := &fanoutv1.ReusedFrom{RunId: runID, TaskId: o.GetTaskId(), Via: via, FinishedAt: o.GetFinishedAt(),
		TokensSaved: o.GetTokensSpent(), Writes: writes}
	if prev := o.GetReused(); prev != nil {
		r.TokensSaved, r.Writes = prev.GetTokensSaved(), prev.GetWrites()
	}
	return r
}

// reuse decides which tasks of plan p take recorded facts instead of
// running: by fork (src, when set: the source's task with the same content
// key that SUCCEEDED) or by the tenant's result cache (spec.cache). A task
// is reused only if every task it depends on is: one whose dependency runs
// runs too. It returns the reused tasks' outcomes by dispatch index
// (SUCCEEDED, spend 0, the source named), the content keys to store (""
// for a reused task: the cache's sources are tasks that ran), and the
// reasons of the tasks that run, for a quote.
func (e *Engine) reuse(ctx context.Context, p *plan, src *forkSource) (reused map[int]*fanoutv1.TaskOutcome,
	keys []string, why map[int]string, err error) {
	spec := p.spec
	keys = contentKeys(spec)
	why = map[int]string{}
	candidates := map[int]*fanoutv1.ReusedFrom{}
	summaries := map[int]*fanoutv1.FactSummary{}
	for i := range keys {
		if src == nil {
			break
		}
		if o := src.byKey[keys[i]]; o != nil {
			candidates[i] = reusedFrom(src.runID, o, src.writes[o.GetTaskId()], viaFork)
			summaries[i] = o.GetSummary()
		}
	}
	if maxAge := spec.GetCache().GetTaskMaxAge().AsDuration(); maxAge > 0 {
		var missing []string
		for i, k := range keys {
			if candidates[i] == nil {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			if e.records == nil {
				return nil, nil, nil, errNoRecordedTasks
			}
			hits, err := e.records.CachedTasks(ctx, p.tenantID, missing, maxAge)
			if err != nil {
				return nil, nil, nil, err
			}
			byKey := map[string]runs.Recorded{}
			for _, h := range hits {
				byKey[h.ContentKey] = h
			}
			for i, k := range keys {
				// A task that wrote is never taken from the cache: a run of
				// its own makes its writes (a fork shows them instead).
				if h, ok := byKey[k]; ok && candidates[i] == nil && h.Writes == 0 {
					candidates[i] = reusedFrom(h.RunID, h.Outcome, h.Writes, viaCache)
					summaries[i] = h.Outcome.GetSummary()
				}
			}
		}
	}
	// A task is reused if it may be and so is every task it depends on.
	ok := make([]int8, len(keys)) // 0 unknown, 1 reused, -1 runs
	var decide func(i int) bool
	decide = func(i int) bool {
		if ok[i] != 0 {
			return ok[i] > 0
		}
		r, depRuns, apart := candidates[i] != nil, false, false
		for _, d := range p.deps[i] {
			depRuns = !decide(d) || depRuns
			// Its facts were drawn from its dependency's in its source run:
			// a dependency reused from another run gave other facts.
			apart = apart || r && candidates[d] != nil && candidates[d].GetRunId() != candidates[i].GetRunId()
		}
		switch {
		case depRuns:
			// Its key changed with its dependency's, if it did not change.
			r, why[i] = false, "depends on a task that runs"
		case apart:
			r, why[i] = false, "a task it depends on is reused from another run"
		case !r && src != nil:
			why[i] = "changed or new task"
		case !r:
			why[i] = "no recorded task with its content"
		}
		ok[i] = -1
		if r {
			ok[i] = 1
		}
		return r
	}
	reused = map[int]*fanoutv1.TaskOutcome{}
	var v validator
	for i, t := range spec.GetTasks() {
		if !decide(i) {
			if o := src.sentAndFailed(keys[i]); o != nil {
				v.add(fmt.Sprintf("tasks[%s]", t.GetId()),
					"the source's task %s sent %d writes and ended %s: run again unchanged it would send them again; change it or remove it (remove_task_ids)",
					o.GetTaskId(), src.writes[o.GetTaskId()], runs.Text(o.GetStatus()))
			}
			continue
		}
		reused[i] = &fanoutv1.TaskOutcome{TaskId: t.GetId(), DispatchIndex: int32(i),
			Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, Summary: summaries[i], Reused: candidates[i]}
		keys[i] = ""
	}
	if err := v.err(); err != nil {
		return nil, nil, nil, err // nothing is written: a fork never re-sends a write
	}
	return reused, keys, why, nil
}

// sentAndFailed is the source's task of content key that sent writes and
// did not succeed, nil if none (or no source).
func (src *forkSource) sentAndFailed(key string) *fanoutv1.TaskOutcome {
	if src == nil {
		return nil
	}
	return src.wrote[key]
}

// withReused is draft (a new run, every task PENDING) with the reused
// tasks ended as reused says.
func withReused(draft *fanoutv1.Run, reused map[int]*fanoutv1.TaskOutcome) *fanoutv1.Run {
	for i, o := range reused {
		draft.Tasks[i] = o
	}
	return draft
}

// replayReused takes the tasks of run that reused recorded facts out of
// sched as SUCCEEDED, each once it is ready, so that what is ready after
// them is what the run dispatches first; it returns their indexes.
func replayReused(sched *scheduler, tasks []*fanoutv1.TaskOutcome) (done []int) {
	for replayed := true; replayed; {
		replayed = false
		for _, i := range slices.Clone(sched.Ready()) {
			if tasks[i].GetReused() == nil {
				continue
			}
			sched.take(i)
			sched.Succeeded(i)
			done, replayed = append(done, i), true
		}
	}
	return done
}

// restoreReused gives a new run's driver the tasks it reused (stored ended
// with the run): they are SUCCEEDED for the scheduler and the join, and
// counted as reuse hits.
func (d *driver) restoreReused(ctx context.Context, tasks []*fanoutv1.TaskOutcome) {
	for _, i := range replayReused(d.sched, tasks) {
		d.outcomes[i] = tasks[i]
		metrics().tasksReused.Add(context.WithoutCancel(ctx), 1,
			metric.WithAttributes(attrReusedVia.String(tasks[i].GetReused().GetVia())))
		countTask(ctx, tasks[i])
	}
}

// checkCache checks RunSpec.cache.
func checkCache(v *validator, c *fanoutv1.CacheSettings) {
	if c.GetTaskMaxAge() == nil {
		return
	}
	if err := c.GetTaskMaxAge().CheckValid(); err != nil {
		v.add("spec.cache.task_max_age", "%v", err)
		return
	}
	if a := c.GetTaskMaxAge().AsDuration(); a < 0 || a > maxTaskMaxAge {
		v.add("spec.cache.task_max_age", "must be between 0 and %v, got %v", maxTaskMaxAge, a)
	}
}

// quoteLines are the quote lines of the tasks reuse keeps from running.
func quoteLines(reused map[int]*fanoutv1.TaskOutcome) map[int]*fanoutv1.TaskQuote {
	lines := make(map[int]*fanoutv1.TaskQuote, len(reused))
	for i, o := range reused {
		lines[i] = &fanoutv1.TaskQuote{Reused: o.GetReused(),
			Reason: fmt.Sprintf("unchanged: reuses %s of run %s (%s)", o.GetReused().GetTaskId(),
				o.GetReused().GetRunId(), o.GetReused().GetVia())}
	}
	return lines
}

// draftReusing is the draft of run runID of plan p (draftRun) with the
// tasks that reuse recorded facts ended (reuse), forked from src when set,
// and the content keys to store with it.
func (e *Engine) draftReusing(ctx context.Context, runID string, p *plan, src *forkSource) (*fanoutv1.Run, []string, error) {
	draft := draftRun(runID, p)
	if src == nil && p.spec.GetCache().GetTaskMaxAge().AsDuration() <= 0 {
		return draft, contentKeys(p.spec), nil
	}
	reused, keys, _, err := e.reuse(ctx, p, src)
	if err != nil {
		return nil, nil, err
	}
	if src != nil {
		draft.ForkedFrom = src.runID
	}
	return withReused(draft, reused), keys, nil
}
