// Package budget is the token ledger's domain: accounts, reservations, the Ledger
// interface every node spends through, its errors, and the exhaustion watcher.
//
// It imports only the standard library. Package store implements Ledger on PostgreSQL.
package budget

import (
	"context"
	"time"
)

// AccountID identifies one ledger account (a tenant, a run, or a task).
type AccountID int64

// ReservationID identifies one reservation.
type ReservationID int64

// AccountKind is the level of an account in the tree tenant -> run -> task.
type AccountKind string

// The account kinds.
const (
	KindTenant AccountKind = "tenant"
	KindRun    AccountKind = "run"
	KindTask   AccountKind = "task"
)

// AccountState is an account's lifecycle state.
//
// A run account moves open -> exhausted | cancelled -> closed and never back:
// once a run has been told it can spend no more, it stays that way, so a
// cancellation is delivered once and refunds that arrive later do not reopen it.
type AccountState string

// The account states.
const (
	StateOpen      AccountState = "open"
	StateExhausted AccountState = "exhausted"
	StateCancelled AccountState = "cancelled"
	StateClosed    AccountState = "closed"
)

// Ended reports whether no reservation can be granted in state s.
func (s AccountState) Ended() bool { return s != StateOpen }

// Account is a snapshot of one account row.
//
// At every quiescent point Limit = Available() + Reserved + Spent + Held, and
// the database refuses any change that would make Reserved + Spent + Held
// exceed Limit (docs/ledger.md#availability-and-exhaustion).
type Account struct {
	ID             AccountID
	TenantID       string
	ParentID       AccountID // 0 for a root
	Kind           AccountKind
	RunID          string // empty for a tenant account
	TaskID         string // empty unless Kind is KindTask
	Limit          int64
	Reserved       int64
	Spent          int64
	MinReservation int64
	State          AccountState
	Cause          string // why the account ended, if it did
	// Attempt is the account's current dispatch attempt (0 before the
	// first); only reserves naming it are granted.
	Attempt int64
	// Closing is set on a run account whose close waits for held
	// reservations to resolve: it closes when the last one settles or expires.
	Closing bool
	// Held is what a run account holds back for its synthesis (a tenant
	// account: the sum of its runs'): counted against Limit, available to
	// no subagent; only a reserve with ReserveParams.FromHeld draws on it.
	Held int64
	// Sliced is, on a run account read with Ledger.RunAccount, the part of
	// Reserved that its tasks' budget slices hold and no call has reserved
	// yet (docs/ledger.md#budget-slices); Reserved - Sliced is what held
	// reservations hold. (RunAccount also counts what the slices spent in
	// Spent, posted to the run's account or not.)
	Sliced int64
}

// Available reports the tokens that can still be reserved on the account alone
// (ancestors may have less); what it holds for a synthesis is not.
func (a Account) Available() int64 { return a.Limit - a.Reserved - a.Spent - a.Held }

// ReservationState is the lifecycle of a reservation. Each reservation leaves
// StateHeld exactly once.
type ReservationState string

// The reservation states.
const (
	ReservationHeld    ReservationState = "held"
	ReservationSettled ReservationState = "settled"
	ReservationVoided  ReservationState = "voided"
	ReservationExpired ReservationState = "expired"
)

// Lease is the right of one holder to settle a reservation. Its expiry is
// computed from the database clock, never a node's.
type Lease struct {
	Holder     string // the node holding the reservation
	Generation int64  // bumped whenever the lease is taken away; stale generations are fenced
	ExpiresAt  time.Time
}

// Reservation is tokens set aside on an account (and all its ancestors) before
// they are spent.
type Reservation struct {
	ID        ReservationID
	AccountID AccountID
	RunID     string
	TenantID  string
	Requested int64 // what the caller wanted
	Amount    int64 // what was granted: min(Requested, available) >= min
	Lease     Lease
	State     ReservationState
	Actual    int64 // reported usage, once settled
	Spent     int64 // what was posted as spent when it resolved
	Overrun   int64 // Actual - Amount when positive: usage beyond the grant
	Estimated bool  // spent was not reported by the provider (cancelled call, expired lease)
	// WindDown, on a grant, says that the task is wound down (Ledger.WindDown):
	// the call it pays for is to be its last, made without tools.
	WindDown bool
}

// OpenRunParams describe a run's accounts.
type OpenRunParams struct {
	RunID          string // caller-chosen, unique
	TenantID       string // required; "default" when the caller has none
	TenantAccount  AccountID
	Limit          int64 // run budget in tokens, > 0
	MinReservation int64 // the run is exhausted when available < MinReservation; >= 1
	Tasks          []TaskBudget
	// Held is what the run holds back for its synthesis: 0..Limit-MinReservation.
	// Under a tenant budget the tenant holds it too, and no more than it
	// has available: RunAccounts.Run.Held says what was held.
	Held int64
	// Child, if set, opens the run as a child run carved from a task of
	// another run (docs/ledger.md#child-runs): its account's limit is what
	// the parent task grants of Limit (at least Child.Min), not Limit
	// itself, and TenantAccount must be 0 (the funding is held above).
	Child *ChildFunding
}

// ChildFunding is how a child run is funded from its parent task
// (OpenRunParams.Child; OpenChildRunParams has the same fields).
type ChildFunding struct {
	ParentTask AccountID     // the task account the child is carved from
	Attempt    int64         // the parent task's current attempt
	Min        int64         // the least grant worth the child, >= 1
	TTL        time.Duration // the funding reservation's lease
	// The rest is the run's record of the tree (docs/budget.md#nested-fan-out):
	ParentRunID  string
	ParentTaskID string
	Call         string // the fan_out tool_call the child's end answers
	RootRunID    string
	Depth        int32
	MaxTreeTasks int // the tree's task cap, every level counted
}

// TaskBudget is one task's budget in a run. Task limits may add up to more
// than the run's: they are caps, and the run account is shared.
type TaskBudget struct {
	TaskID string
	Limit  int64 // > 0
	// Slice, when > 0, makes the task's account a slice of the run's
	// budget (docs/ledger.md#budget-slices): each attempt begins with up to
	// Slice tokens carved for it from the run, and a call its slice pays
	// for reserves and settles on the task's account alone. A slice that
	// runs low is topped up by at least Slice. 0: every call reserves on
	// the task, the run and the tenant at once.
	Slice int64
}

// RunAccounts are the accounts OpenRun created (or found, when the run existed).
type RunAccounts struct {
	Run   Account
	Tasks map[string]AccountID // by task id
	// Attempts are the first attempts begun with the run, by task id: a
	// run store that opens a run's accounts may begin its first
	// dispatches in the same write (orchestrator.RunStore.OpenRun).
	// Ledger.OpenRun begins none.
	Attempts map[string]Attempt
}

// Attempt is a dispatch of a task (or of a run's synthesis) the ledger
// recorded (Ledger.BeginAttempt).
type Attempt struct {
	// N is the attempt's number, from 1: only the account's current
	// attempt may reserve on it.
	N int64
	// Secret proves the attempt: a random string the database keeps only
	// the SHA-256 of. A worker's login must present it to reserve on the
	// account, to settle, void or renew what it reserved there, and to
	// issue, resolve or read the task's tool calls; an orchestrator's
	// login is not asked (it begins attempts). It travels to the worker in
	// the signed dispatch and nowhere else: never log it.
	Secret string
}

// ReserveParams ask for tokens on an account.
//
// RunID, TenantID and Attempt are the grant the caller was dispatched with:
// the ledger refuses (ErrDenied) a reserve whose account is not of that run
// and tenant, or whose attempt is not the account's current one (see
// Ledger.BeginAttempt). The database, not the caller, is the authority on
// who may spend.
type ReserveParams struct {
	Account  AccountID
	RunID    string // the run the account must belong to; required
	TenantID string // the tenant the account must belong to; required
	Attempt  int64  // the account's current attempt, >= 1
	Secret   string // the attempt's secret (Attempt.Secret); a worker's login must present it
	Want     int64  // > 0
	Min      int64  // 1..Want; grant nothing if less than this is available
	Holder   string
	TTL      time.Duration // lease length; > 0
	// Key makes the call idempotent when set: a retry with the same key on
	// the same account returns the first reservation instead of a second one.
	Key string
	// Model is the model the call is made to (the request's model name),
	// kept on the reservation so that its spend can be priced even when
	// it expires unsettled. May be empty (the spend is then unpriced).
	Model string
	// FromHeld draws the grant on what the run holds for its synthesis
	// (Account.Held) instead of what is available: only on a run account,
	// also once the run is exhausted, never once it is cancelled or closed.
	// What such a reservation does not spend is held again.
	FromHeld bool
}

// SettleParams post the real usage of a reservation.
type SettleParams struct {
	Reservation ReservationID
	Generation  int64
	Secret      string // the secret of the attempt that reserved it (ReserveParams.Secret)
	Actual      int64  // >= 0; may exceed the grant (recorded as overrun)
	Estimated   bool   // Actual is a guess (e.g. the full reservation of a cancelled call)
	// Model is the model that was called; empty keeps the reservation's.
	Model string
	// InputTokens and OutputTokens are the provider's split of Actual, when
	// it reported one: they add up to Actual. Both 0 when the usage is
	// estimated or came as a total only; such spend is priced at the
	// higher of the model's two prices.
	InputTokens  int64
	OutputTokens int64
}

// Ledger is the shared token budget. Every method is atomic and safe to call
// from any number of nodes at once.
type Ledger interface {
	// OpenRun creates the run account (under TenantAccount when non-zero) and one
	// account per task. Calling it again with the same RunID returns the
	// existing accounts and writes nothing. Returns a *ValidationError on bad
	// params and ErrNotFound if TenantAccount does not exist.
	OpenRun(ctx context.Context, p OpenRunParams) (RunAccounts, error)

	// OpenTenant creates (or returns) the tenant's account with the given limit.
	OpenTenant(ctx context.Context, tenantID string, limit int64) (Account, error)

	// BeginAttempt records a new dispatch of the task (or, for a run
	// account, of the run's synthesis call) in the database and returns its
	// number, starting at 1, and its secret. From then on only reserves
	// naming that attempt (and, from a worker's login, its secret) are
	// granted on the account: an earlier attempt is fenced.
	// Returns ErrNotFound for an unknown account, an *ExhaustedError when the
	// account or its run has ended, and ErrDenied when the account is not of
	// runID and tenantID.
	BeginAttempt(ctx context.Context, account AccountID, runID, tenantID string) (Attempt, error)

	// OpenHedge opens, or returns if it is open already, the account of
	// the second attempt of the task whose account is task (a hedge:
	// fanout.v1.TaskSpec.hedge): a task account of its own beside the
	// task's, under the run, with the task's token budget as its limit, on
	// which the second attempt begins its attempts while the first runs on
	// the task's. Returns ErrNotFound for an unknown account, an
	// *ExhaustedError when the run or the task account has ended, and
	// ErrDenied when task is not a task account of runID and tenantID, or
	// is a hedge's, or when epoch is not the run's adoption count (another
	// orchestrator took the run: only its current owner opens a hedge).
	OpenHedge(ctx context.Context, task AccountID, runID, tenantID string, epoch int64) (AccountID, error)

	// Reserve grants min(Want, available) if that is at least Min, on the
	// account and every ancestor at once. Returns an *ExhaustedError (which
	// is ErrExhausted) when less than Min is available or an account in the
	// chain has ended, ErrNotFound for an unknown account, a *DeniedError
	// (ErrDenied) when the account is not of RunID and TenantID or Attempt is
	// not its current attempt, and a *ResolvedError (ErrResolved) when Key
	// names a reservation that is no longer held: a resolved reservation
	// never grants again. A retry with the Key of a reservation still held
	// by the same Holder returns it; the caller must start a call only on a
	// reservation whose State is ReservationHeld.
	Reserve(ctx context.Context, p ReserveParams) (Reservation, error)

	// Settle posts Actual as spent and frees the rest of the reservation,
	// exactly once. A retry with the same Actual and Estimated returns the first
	// outcome; a different amount is a *ConflictError. A stale generation or an
	// expired reservation is ErrLeaseLost; a voided one is ErrConflict; a
	// Secret that is not the reservation's, from a worker's login, is a
	// *DeniedError.
	Settle(ctx context.Context, p SettleParams) (Reservation, error)

	// Void frees the whole reservation. Voiding twice is a no-op; voiding a
	// settled reservation is ErrConflict; a stale generation is ErrLeaseLost.
	// secret is the one the reservation was granted to (see ReserveParams;
	// another, from a worker's login, is a *DeniedError).
	Void(ctx context.Context, id ReservationID, generation int64, secret string) (Reservation, error)

	// Renew extends a held lease by ttl from the database's now. Returns
	// ErrLeaseLost when the lease expired, was taken, or the reservation resolved.
	// secret is the one the reservation was granted to.
	Renew(ctx context.Context, id ReservationID, generation int64, ttl time.Duration, secret string) (Reservation, error)

	// ExpireLeases posts every held reservation whose lease ended (database
	// time) as spent at its full amount, flagged estimated, and reports how
	// many it resolved. Safe to run on every node at once.
	ExpireLeases(ctx context.Context) (int, error)

	// CancelRun ends the run's account with StateCancelled so nothing more
	// is granted, and notifies watchers: an open run, and an exhausted one
	// too (under DRAIN its calls run on until they hear the cancel). A
	// cancelled or closed run is unchanged.
	CancelRun(ctx context.Context, runID, cause string) (Account, error)

	// CloseRun closes the run's accounts. It never voids a held
	// reservation (its call may have spent): while any is held, the run is
	// cancelled (nothing more is granted), marked Closing, and closes when
	// the last one is settled by its holder or expired by the sweeper.
	// Idempotent.
	CloseRun(ctx context.Context, runID string) (Account, error)

	// EndRunFenced is CancelRun (state StateCancelled) or CloseRun
	// (StateClosed) by the orchestrator that drives the run, fenced by its
	// owner epoch: the number of times the run had changed hands (another
	// replica adopted it) when this owner took it, 0 for the replica that
	// created it. If the run changed hands since, nothing changes and it
	// returns a *DeniedError.
	EndRunFenced(ctx context.Context, runID string, state AccountState, cause string, epoch int64) (Account, error)

	// WindDown marks the tasks taskIDs of the run as winding down, fenced
	// like EndRunFenced by the owner's epoch (a *DeniedError if the run
	// changed hands): what the run has left pays only for their final
	// answers, and every grant on their accounts from then on says so
	// (Reservation.WindDown). Idempotent; ended tasks are left as they are.
	WindDown(ctx context.Context, runID string, epoch int64, taskIDs []string) error

	// Account returns one account. ErrNotFound if it does not exist.
	Account(ctx context.Context, id AccountID) (Account, error)

	// RunAccount returns a run's account. ErrNotFound if the run is unknown.
	RunAccount(ctx context.Context, runID string) (Account, error)
}
