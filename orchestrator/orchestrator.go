// Package orchestrator is the fan-out engine — validate, plan, dispatch to
// subagent workers, cancel, join — and its gRPC adapter, fanout.v1.OrchestratorService.
package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// RunStore persists runs, their tasks and their event history, so that any
// replica can answer for any run. Package store implements it on PostgreSQL
// (store.Runs). Every read on behalf of a caller names the caller's tenant
// (an empty one is runs.ErrNoTenant); ReadRun is the engine's own.
//
// Unknown runs and tasks are reported as runs.ErrNotFound.
type RunStore interface {
	RunOpener
	RunContinuer
	RunReader
	TaskWriter
	RunEnder
	Leases
	EventAppender
	EventReader
}

// RunOpener opens runs.
type RunOpener interface {
	// OpenRun stores run (id, tenant, idempotency key, spec, labels and
	// tasks in dispatch order) as RUNNING with every task PENDING, driven by
	// owner, and returns it with created true; in the same write it opens
	// the run's ledger accounts as open says (budget.Ledger.OpenRun) and
	// appends its first events: RunStarted (the run as stored, with its
	// account's budget), then queued. If the tenant already has a run with
	// the same idempotency key it writes nothing and returns that run,
	// created false, without accounts. A refusal of the ledger writes
	// nothing. It also begins (budget.Ledger.BeginAttempt) the first attempt
	// of each task named in begin, returned in accounts.Attempts (which
	// may lack some: their dispatch begins its own), and records tools,
	// the run's tool policy, where no worker can change it, and keys, its
	// tasks' content keys by dispatch index (reuse.go). A task of run
	// that has ended already (one that reuses recorded facts) is stored
	// ended, its TaskFinished after the RunStarted; run.forked_from is
	// stored with the run.
	OpenRun(ctx context.Context, run *fanoutv1.Run, owner string, open budget.OpenRunParams, tools []runs.ToolPolicy,
		keys, begin []string, queued []*fanoutv1.RunEvent) (
		stored *fanoutv1.Run, accounts budget.RunAccounts, created bool, err error)
}

// ChildCalls are the store's side of nested fan-out (fanout.go); a store
// without it runs no child runs' ends (store.Runs has it).
type ChildCalls interface {
	// ChildLink returns the parent of run runID: its run, task and the
	// fan_out call its end answers (all empty for a root run).
	ChildLink(ctx context.Context, runID string) (runs.ChildLink, error)
	// RunningChildren returns the child runs of task taskID of run runID
	// still running.
	RunningChildren(ctx context.Context, runID, taskID string) ([]string, error)
	// FanOutCall reports whether key is a fan_out call of task taskID of
	// run runID, and whether it is still issued.
	FanOutCall(ctx context.Context, runID, taskID, key string) (found, issued bool, err error)
	// AnswerCall resolves the fan_out call key of task taskID of run
	// runID, still issued, as done with answer, or, with refusal set,
	// failed with refusal as its error. Any other call, and a call
	// resolved already, is left as it is.
	AnswerCall(ctx context.Context, runID, taskID, key, answer, refusal string) error
}

// FundingLedger settles the funding of closed child runs (store.Ledger).
type FundingLedger interface {
	SettleFunding(ctx context.Context, runID string) (budget.Reservation, error)
}

// RunContinuer continues runs (docs/budget.md#continue).
type RunContinuer interface {
	// ContinueRun records a continuation: the ledger's entries, the
	// continuation's row, a reopened run's rows (RUNNING, owned by c.Owner,
	// its tasks c.Tasks PENDING) and its RunContinued event, in one write;
	// a retry with its key returns the first one's record (Replay). A
	// refusal writes nothing and is a *runs.ContinueError.
	ContinueRun(ctx context.Context, c runs.Continue) (runs.Continued, error)
	// Continuation returns the continuation of runID made with key, as its
	// RunContinued said it; runs.ErrNotFound if there is none.
	Continuation(ctx context.Context, runID, key string) (*fanoutv1.RunContinued, error)
}

// RunReader reads runs and their tasks.
type RunReader interface {
	// GetRun returns a run of the tenant and its tasks' outcomes in dispatch order.
	GetRun(ctx context.Context, tenantID, runID string) (*fanoutv1.Run, error)
	// RunByKey returns tenantID's run created under idempotency key key,
	// or runs.ErrNotFound.
	RunByKey(ctx context.Context, tenantID, key string) (*fanoutv1.Run, error)
	// ReadRun is GetRun of any tenant, for the engine's own paths (adopting
	// a run, ending one it drives): never for a caller's request.
	ReadRun(ctx context.Context, runID string) (*fanoutv1.Run, error)
	// ListRuns returns summaries of up to limit runs of a tenant in state
	// (any state if unspecified), newest first, older than (beforeCreated,
	// beforeID) when beforeCreated is not zero. A summary has its budget and
	// its tasks' statuses but no spec, result or task summaries, and reading
	// it must not cost their size.
	ListRuns(ctx context.Context, tenantID string, state fanoutv1.RunState,
		beforeCreated time.Time, beforeID string, limit int) ([]*fanoutv1.Run, error)
	// RunTasks returns up to limit of the outcomes of a tenant's run's
	// tasks in dispatch order, from dispatch index from, and how many tasks
	// the run has; reading a page must not cost the run's size.
	RunTasks(ctx context.Context, tenantID, runID string, from, limit int) ([]*fanoutv1.TaskOutcome, int, error)
	// RunFacts returns up to limit of the facts of a tenant's run's joined
	// result, from index from, and how many it has (none while the run has
	// no result), at the cost of the page.
	RunFacts(ctx context.Context, tenantID, runID string, from, limit int) ([]*fanoutv1.Fact, int, error)
}

// TaskWriter writes a run's tasks, fenced by the run's owner.
type TaskWriter interface {
	// StartTask marks started's task RUNNING on its worker, stamping
	// started_at, and appends started (its TaskStarted event) in the same
	// write, if owner drives the run. Returns runs.ErrEnded if the task has
	// already ended, runs.ErrNotOwner if another orchestrator drives the run
	// now.
	StartTask(ctx context.Context, runID, owner string, started *fanoutv1.TaskStarted) (*fanoutv1.TaskOutcome, error)
	// FinishTask stores a task's terminal outcome, stamping finished_at, and
	// its TaskFinished event, in one write, if owner drives the run, and
	// returns it as stored. A terminal outcome is
	// final: returns runs.ErrEnded if the task has already ended, and
	// runs.ErrNotOwner if another orchestrator adopted the run.
	FinishTask(ctx context.Context, runID, owner string, o *fanoutv1.TaskOutcome) (*fanoutv1.TaskOutcome, error)
	// FailTasks ends every PENDING or RUNNING task of the run as FAILED with
	// reason as its error and its ledger spend as its tokens, with their
	// TaskFinished events in the same write, if owner drives the run; keeps
	// terminal outcomes, and returns the tasks it ended in dispatch order.
	FailTasks(ctx context.Context, runID, owner, reason string) ([]*fanoutv1.TaskOutcome, error)
}

// RunEnder ends runs: the run's state, result, ledger close and last events in one write.
type RunEnder interface {
	// FinishRun ends the run if it is RUNNING and owner drives it — its
	// final state, result and RunFinished event in one write — and reports
	// ended true; otherwise (it has ended, or another replica adopted it) it
	// writes nothing and returns the run unchanged, ended false.
	FinishRun(ctx context.Context, runID, owner string, state fanoutv1.RunState, cause string,
		result *fanoutv1.JoinedResult) (run *fanoutv1.Run, ended bool, err error)
	// CloseRun ends the run as FinishRun does and, in the same write, first
	// closes its ledger run (budget.Ledger.EndRunFenced to
	// budget.StateClosed, with owner epoch epoch), sets result's
	// TotalTokens to the closed account's spend and appends its last
	// BudgetUpdate, with that account, before the RunFinished. It returns
	// the run's row (state, cause and times, not its tasks), the closed
	// account (nil for a run without accounts, and no BudgetUpdate then),
	// whether it ended the run, and the events it appended as stored
	// (runs.Closing), once they are durable. A run that changed hands
	// since epoch is a budget.DeniedError, and nothing is written.
	CloseRun(ctx context.Context, runID, owner string, epoch int64, state fanoutv1.RunState, cause string,
		result *fanoutv1.JoinedResult) (runs.Closing, error)
}

// Leases keep the runs an orchestrator drives, and adopt the runs nobody does.
type Leases interface {
	// Heartbeat refreshes, in database time and one statement, the lease of
	// the runs of runIDs that owner drives (RUNNING, owned by owner), and
	// returns those of runIDs that another node owns now (adopted while
	// owner's heartbeat lapsed).
	Heartbeat(ctx context.Context, owner string, runIDs []string) (lost []string, err error)
	// AdoptOrphan makes node the owner of one RUNNING run whose heartbeat is
	// older than orphanAfter (database time), counting the adoption, and
	// returns it; RunID is empty when there is none. Of replicas adopting at
	// once, exactly one gets each run; once it returns, the previous owner
	// can write none of the run's tasks.
	AdoptOrphan(ctx context.Context, node string, orphanAfter time.Duration) (runs.Adoption, error)
}

// EventAppender appends to a run's event log.
type EventAppender interface {
	// AppendEvent appends the run's next event and returns it with its
	// sequence (gapless, from 1) and time set. Once the run has ended it
	// takes only RunFinished: anything else is runs.ErrEnded.
	AppendEvent(ctx context.Context, runID string, ev *fanoutv1.RunEvent) (*fanoutv1.RunEvent, error)
	// AppendEvents appends several events (no RunFinished) as consecutive
	// sequences in one write, with AppendEvent's error contract.
	AppendEvents(ctx context.Context, runID string, evs []*fanoutv1.RunEvent) ([]*fanoutv1.RunEvent, error)
}

// EventReader reads a run's event log and where it ends.
type EventReader interface {
	// Heads returns where the event log of each of runIDs that exists
	// ends, and the run's state, in one read.
	Heads(ctx context.Context, runIDs []string) (map[string]runs.Head, error)
	// Head returns where the run's event log ends and its state, without
	// reading its spec, tasks or result.
	Head(ctx context.Context, tenantID, runID string) (runs.Head, error)
	// Events returns up to limit events with sequence > after, in order.
	Events(ctx context.Context, tenantID, runID string, after int64, limit int) ([]*fanoutv1.RunEvent, error)
}

// EventNotices tells of writes of any run's events, by any node, soon
// after they commit (the writer notifies from a transaction of its own,
// once the write has returned; a notice can be lost). *store.Notifier
// implements it.
type EventNotices interface {
	// ListenEvents calls moved with a run's id and the sequence its log
	// now ends at, for each write, and ready on every (re)connect (what
	// was written while it was away is not told), until ctx ends. It
	// returns at once if it cannot listen at all.
	ListenEvents(ctx context.Context, ready func(), moved func(runID string, head int64)) error
}

// RunWatcher tells when a run's ledger account ended (exhausted, cancelled,
// closed) on any node. *budget.Watcher implements it.
type RunWatcher interface {
	Subscribe(runID string) *budget.Subscription
	// Reopened forgets what was heard of the run's end: a continuation
	// reopened it (docs/budget.md#continue).
	Reopened(runID string)
}

var _ RunWatcher = (*budget.Watcher)(nil)

// Errors of the engine, besides budget's sentinels and budget.ValidationErrors.
var (
	// ErrSpecMismatch: the idempotency key was used before with a different spec.
	ErrSpecMismatch = errors.New("idempotency key already used with a different spec")
	// ErrShuttingDown: the engine accepts no new runs.
	ErrShuttingDown = errors.New("orchestrator is shutting down")
)

// Config tunes an Engine. Zero values take the documented defaults.
type Config struct {
	// Node names this orchestrator in the run table's owner column.
	// Default: hostname-pid.
	Node string
	// MaxTasks caps the tasks of one run; more is RESOURCE_EXHAUSTED. Default 256.
	MaxTasks int
	// MaxIterations caps TaskSpec.max_iterations. Default 50.
	MaxIterations int32
	// DefaultIterations replaces max_iterations 0 in what workers get. Default 10.
	DefaultIterations int32
	// DefaultConcurrency replaces Limits.max_concurrency 0. Default 16.
	DefaultConcurrency int32
	// MaxConcurrency lowers larger Limits.max_concurrency. Default 256.
	MaxConcurrency int32
	// ConcurrencyInterval is how often a run whose concurrency comes from
	// the rate limits (Limits.max_concurrency 0, EngineParams.RateLimits
	// set) reads them again and recomputes it; it is also recomputed when
	// a task ends, from what the run observed. Default 5s.
	ConcurrencyInterval time.Duration
	// DefaultHeadroom is the share of a rate limit the fleet's runs may
	// plan to use, for a tenant that sets none. Default 0.7.
	DefaultHeadroom float64
	// DefaultMinReservation replaces Budget.min_reservation_tokens 0 (lowered
	// to the limit when the limit is smaller). Default 256.
	DefaultMinReservation int64
	// MaxOutputTokens caps ModelSettings.max_output_tokens, the output
	// allowance reserved per model call. Default 65,536.
	MaxOutputTokens int
	// MaxRunTokens caps Budget.limit_tokens; more is RESOURCE_EXHAUSTED. 0: no cap.
	MaxRunTokens int64
	// DefaultTaskTimeout applies when TaskSpec.timeout is unset. Default 5m.
	DefaultTaskTimeout time.Duration
	// DefaultRunTimeout applies when Limits.run_timeout is unset. Default 30m.
	DefaultRunTimeout time.Duration
	// MaxRunTimeout lowers longer run timeouts. Default 24h.
	MaxRunTimeout time.Duration
	// MaxSpecBytes caps the encoded RunSpec; more is RESOURCE_EXHAUSTED.
	// Default 4 MiB (the gRPC default receive limit).
	MaxSpecBytes int
	// KnownTools are the tool names TaskSpec.allowed_tools may use (the
	// workers' built-in tools). Any other name is INVALID_ARGUMENT.
	KnownTools []string
	// ReadTools are the known tools that only read: a hedged task
	// (TaskSpec.hedge) may allow these and no other, since a hedge runs
	// the task twice at once and writes must stay at most once. nil: none
	// (a task with any tool cannot be hedged). node sets the workers'
	// read-only built-ins; an MCP tool counts as a write here.
	ReadTools []string
	// ToolRules are the operator's policy of the tools that have one (the
	// MCP config's tenants and approval): a tool a rule keeps from the
	// caller's tenant is INVALID_ARGUMENT in allowed_tools, and a run
	// records, for each tool its tasks allow, whether its writes wait for
	// approval. A tool without a rule is every tenant's, without approval.
	ToolRules map[string]ToolRule
	// RetryBackoff is the first bound of the jittered wait before a call
	// that every worker refused (RESOURCE_EXHAUSTED, UNAVAILABLE) before it
	// started is tried again; it doubles up to 2s. Such a call is tried
	// until its deadline, not a number of times: it fails for want of a
	// worker only when its task's (or run's) deadline passes. Default 50ms.
	RetryBackoff time.Duration
	// HeldWait is how long a run whose tasks have all ended waits for its
	// reservations still held (by a worker that died or was cut off) to be
	// settled or to expire before closing the run voids them. Default 90s:
	// three default leases, as a dead holder's lease ends within one.
	HeldWait time.Duration
	// CancelGrace is how long a worker gets to report its summary after its
	// task's context ended for a reason the worker hears too (exhaustion,
	// CancelRun, timeout) before the call is cut. Default 2s; negative: none.
	CancelGrace time.Duration
	// WatchPollInterval is how often WatchRun polls for events of a run
	// driven by another replica when no notifications tell of them
	// (EngineParams.Events nil). Default 150ms.
	WatchPollInterval time.Duration
	// WatchFallbackPoll is how often WatchRun polls for them when
	// notifications do (EngineParams.Events), in case one is lost without
	// the LISTEN connection dropping (a dropped one is made up for when it
	// is back). Default 3s.
	WatchFallbackPoll time.Duration
	// WatchMaxLag and WatchSlowAfter end a slow reader: a WatchRun or Run
	// stream that stays more than WatchMaxLag events behind its run's head
	// for WatchSlowAfter without a break ends RESOURCE_EXHAUSTED naming the
	// after_sequence to resume from (watch.go says why the rule is timed).
	// Defaults 1,000 events and 10s.
	WatchMaxLag    int64
	WatchSlowAfter time.Duration
	// HeartbeatInterval is how often the engine refreshes the lease
	// (run.owner_heartbeat, database time) of every run it drives, in one
	// statement, and looks for orphaned runs to adopt. Default 5s.
	HeartbeatInterval time.Duration
	// OrphanAfter is how stale (by database time) a RUNNING run's heartbeat
	// must be before a replica adopts the run: it cancels the run's ledger
	// account, fails its unfinished tasks and ends it FAILED ("orchestrator
	// <owner> lost before the run ended"). It is raised to at least two
	// HeartbeatIntervals; keep it the same on every replica. Default 30s.
	OrphanAfter time.Duration
	// Logger receives errors and run lifecycle logs. Default slog.Default().
	Logger *slog.Logger
}

// ToolRule is the operator's policy of one tool.
type ToolRule struct {
	// Tenants may use the tool; nil is every tenant.
	Tenants []string
	// Approval: each write of the tool waits for a person's approval, for
	// at most ApprovalTimeout (> 0).
	Approval        bool
	ApprovalTimeout time.Duration
}

// allows reports whether tenant may use a tool under rule r.
func (r ToolRule) allows(tenant string) bool {
	return r.Tenants == nil || slices.Contains(r.Tenants, tenant)
}

// DefaultConfig returns the Config whose every limit and interval is its
// documented default, as NewEngine fills zero fields; Node, Logger,
// KnownTools and MaxRunTokens stay zero.
func DefaultConfig() Config {
	c := Config{}.withDefaults()
	c.Node, c.Logger = "", nil
	return c
}

func (c Config) withDefaults() Config {
	if c.Node == "" {
		host, _ := os.Hostname()
		c.Node = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def32 := func(v *int32, d int32) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MaxTasks, 256)
	def32(&c.MaxIterations, 50)
	def32(&c.DefaultIterations, min(10, c.MaxIterations))
	def32(&c.MaxConcurrency, 256)
	def32(&c.DefaultConcurrency, min(16, c.MaxConcurrency))
	defDur(&c.ConcurrencyInterval, 5*time.Second)
	if c.DefaultHeadroom <= 0 || c.DefaultHeadroom > 1 {
		c.DefaultHeadroom = 0.7
	}
	if c.DefaultMinReservation <= 0 {
		c.DefaultMinReservation = 256
	}
	defDur(&c.DefaultTaskTimeout, 5*time.Minute)
	defDur(&c.MaxRunTimeout, 24*time.Hour)
	defDur(&c.DefaultRunTimeout, min(30*time.Minute, c.MaxRunTimeout))
	def(&c.MaxSpecBytes, 4<<20)
	def(&c.MaxOutputTokens, 1<<16)
	defDur(&c.RetryBackoff, 50*time.Millisecond)
	defDur(&c.HeldWait, 90*time.Second)
	if c.CancelGrace < 0 {
		c.CancelGrace = 0
	} else if c.CancelGrace == 0 {
		c.CancelGrace = 2 * time.Second
	}
	defDur(&c.WatchPollInterval, 150*time.Millisecond)
	defDur(&c.WatchFallbackPoll, 3*time.Second)
	if c.WatchMaxLag <= 0 {
		c.WatchMaxLag = 1000
	}
	defDur(&c.WatchSlowAfter, 10*time.Second)
	defDur(&c.HeartbeatInterval, 5*time.Second)
	defDur(&c.OrphanAfter, 30*time.Second)
	c.OrphanAfter = max(c.OrphanAfter, 2*c.HeartbeatInterval)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}
