package store

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

// Ledger implements budget.Ledger on PostgreSQL. Each operation is one call of
// a ledger_* SQL function (migrations/functions/ledger_*.sql, one file each): one round trip, one transaction,
// locking the account chain root first. The functions report refusals as an
// outcome column rather than raising, so several calls can share one
// transaction (group commit, LedgerConfig.Coalesce) without changing this
// type's API.
//
// Every call is retried after a transient database error (retry.go): each
// is idempotent, by the reservation it names, by the key of a reserve, or
// by the state it moves a run from.
type Ledger struct {
	db
	exec ledgerExec // chosen once, by NewLedger
}

var _ budget.Ledger = (*Ledger)(nil)

// LedgerConfig tunes a Ledger. Zero values take the documented defaults.
type LedgerConfig struct {
	// Coalesce makes reservations, settlements and voids that arrive together
	// on this node share one transaction (group commit): on one hot run
	// account the row lock and the commit flush are then paid once per
	// batch instead of once per call. Calls are applied in arrival order per
	// account chain with the same grant rule, so exactness is unchanged.
	// A Ledger with Coalesce must be closed with Close.
	Coalesce bool
	// MaxBatch bounds the calls in one transaction. Default 64.
	MaxBatch int
	// Committers is how many batch transactions may be in flight at once.
	// Default 1: parallel batches on one hot run account only wait for each
	// other's row lock (measured: 1,000 concurrent subagents spent 17 ms per
	// reserve waiting with 4 committers, 3.4 ms with 1), while one committer
	// lets everything that arrives during a batch join the next one.
	Committers int
	// Logger receives a warning for every retried database error. Default
	// slog.Default().
	Logger *slog.Logger
}

// NewLedger returns a ledger on pool tuned by cfg (at most one; none: the
// zero LedgerConfig, each call its own transaction). A node's ledger is
// Stores.Ledger, on the ledger pool.
func NewLedger(pool *Pool, config ...LedgerConfig) *Ledger {
	cfg := configOf(config)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if !cfg.Coalesce {
		return &Ledger{db: newDB(pool, cfg.Logger), exec: directExec{pool: pool}}
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 64
	}
	if cfg.Committers <= 0 {
		cfg.Committers = 1
	}
	return &Ledger{db: newDB(pool, cfg.Logger), exec: newBatchExec(pool, cfg.Committers, cfg.MaxBatch)}
}

// call runs c on the ledger's executor, retried after a transient error:
// every ledger_result call is idempotent (a reserve carries a key; settle,
// void, renew and expire name a reservation and its generation and answer
// "replay" when it is already where they would move it). A replay after a
// try whose commit was ambiguous is that try's work, so it is reported as
// "ok", as the lost reply would have been.
func (l *Ledger) call(ctx context.Context, op string, c ledgerCall) (ledgerResult, error) {
	return retry(ctx, l.log, "ledger."+op, idempotent, func(ctx context.Context, t try) (ledgerResult, error) {
		r, err := l.exec.call(ctx, c)
		if err == nil && t.ambiguous && r.Outcome == "replay" {
			r.Outcome = "ok"
		}
		return r, err
	})
}

// newReserveKey is the key of a reserve whose caller gave none, so that
// the reserve, too, can be retried after an ambiguous commit.
func newReserveKey() string { return "store/" + rand.Text() }

// Close stops the committers of a coalescing ledger; calls after Close fail.
// It is a no-op on a ledger without Coalesce.
func (l *Ledger) Close() { l.exec.close() }

// ledgerResult mirrors the SQL type ledger_result.
type ledgerResult struct {
	Outcome        string
	InfoAccount    *int64
	InfoKind       *string
	InfoState      *string
	InfoAvailable  *int64
	Info           *string
	ReservationID  *int64
	AccountID      *int64
	RunID          *string
	TenantID       *string
	Requested      *int64
	Amount         *int64
	Holder         *string
	Generation     *int64
	LeaseExpiresAt *time.Time
	State          *string
	Actual         *int64
	Spent          *int64
	Overrun        *int64
	Estimated      *bool
	RunAvailable   *int64
	WindDown       *bool
}

func (r *ledgerResult) scan(row pgx.Row) error {
	return row.Scan(&r.Outcome, &r.InfoAccount, &r.InfoKind, &r.InfoState, &r.InfoAvailable, &r.Info,
		&r.ReservationID, &r.AccountID, &r.RunID, &r.TenantID, &r.Requested, &r.Amount,
		&r.Holder, &r.Generation, &r.LeaseExpiresAt, &r.State, &r.Actual, &r.Spent,
		&r.Overrun, &r.Estimated, &r.RunAvailable, &r.WindDown)
}

func val[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// nullable is s, or SQL NULL when s is empty.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (r *ledgerResult) reservation() budget.Reservation {
	return budget.Reservation{
		ID:        budget.ReservationID(val(r.ReservationID)),
		AccountID: budget.AccountID(val(r.AccountID)),
		RunID:     val(r.RunID),
		TenantID:  val(r.TenantID),
		Requested: val(r.Requested),
		Amount:    val(r.Amount),
		Lease: budget.Lease{
			Holder:     val(r.Holder),
			Generation: val(r.Generation),
			ExpiresAt:  val(r.LeaseExpiresAt),
		},
		State:     budget.ReservationState(val(r.State)),
		Actual:    val(r.Actual),
		Spent:     val(r.Spent),
		Overrun:   val(r.Overrun),
		Estimated: val(r.Estimated),
		WindDown:  val(r.WindDown),
	}
}

// err turns a refusal outcome into the budget error it stands for.
func (r *ledgerResult) err(id budget.ReservationID, need int64) error {
	switch r.Outcome {
	case "ok", "replay":
		return nil
	case "exhausted":
		return &budget.ExhaustedError{
			Account:   budget.AccountID(val(r.InfoAccount)),
			Kind:      budget.AccountKind(val(r.InfoKind)),
			State:     budget.AccountState(val(r.InfoState)),
			Requested: need,
			Available: val(r.InfoAvailable),
		}
	case "not_found":
		return budget.ErrNotFound
	case "conflict":
		return &budget.ConflictError{Reservation: id, Reason: val(r.Info)}
	case "lease_lost":
		return fmt.Errorf("%w: %s", budget.ErrLeaseLost, val(r.Info))
	case "denied":
		return &budget.DeniedError{Account: budget.AccountID(val(r.InfoAccount)), Reason: val(r.Info)}
	case "resolved":
		return &budget.ResolvedError{Reservation: budget.ReservationID(val(r.ReservationID)),
			State: budget.ReservationState(val(r.State))}
	}
	return fmt.Errorf("ledger: unknown outcome %q", r.Outcome)
}

// The statements of the ledger functions that return a ledger_result, each
// selecting its columns in the order ledgerResult.scan reads them. They
// stay hand-written: group commit queues several of them in one batch of
// one transaction (ledgerexec.go), which sqlc's per-query code cannot.
const (
	// resultColumns selects a ledger_result's columns in ledgerResult.scan's order.
	resultColumns = `SELECT outcome, info_account, info_kind, info_state, info_available, info,
	reservation_id, account_id, run_id, tenant_id, requested, amount, holder, generation,
	lease_expires_at, state, actual, spent, overrun, estimated, run_available, wind_down
	FROM `
	reserveSQL = resultColumns + `ledger_reserve($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`
	settleSQL  = resultColumns + `ledger_settle($1, $2, $3, $4, $5, $6, $7, $8)`
	voidSQL    = resultColumns + `ledger_void($1, $2, '', $3)`
	renewSQL   = resultColumns + `ledger_renew($1, $2, $3, $4)`
	expireSQL  = resultColumns + `ledger_expire($1)`
)

// Reserve implements budget.Ledger.
func (l *Ledger) Reserve(ctx context.Context, p budget.ReserveParams) (res budget.Reservation, err error) {
	if err := p.Validate(); err != nil {
		return budget.Reservation{}, err
	}
	ctx, done := observe(ctx, "reserve", AttrAccount.Int64(int64(p.Account)), AttrRequested.Int64(p.Want))
	var r ledgerResult
	defer func() { done(&r, err, AttrGranted.Int64(res.Amount), AttrRunID.String(res.RunID)) }()
	key := p.Key
	if key == "" {
		key = newReserveKey()
	}
	a := &reserveArgs{account: int64(p.Account), run: p.RunID, tenant: p.TenantID, attempt: p.Attempt, want: p.Want, min: p.Min,
		holder: p.Holder, ttl: p.TTL, key: key, model: p.Model, secret: nullable(p.Secret), fromHeld: p.FromHeld}
	r, err = l.call(ctx, "reserve", ledgerCall{sql: reserveSQL, args: a.args(), account: p.Account, reserve: a})
	if err == nil {
		err = r.err(0, p.Min)
	}
	if err == nil && r.reservation().State != budget.ReservationHeld {
		// The functions never grant a resolved reservation; if one came
		// back, no call may be made on it.
		err = &budget.ResolvedError{Reservation: budget.ReservationID(val(r.ReservationID)), State: budget.ReservationState(val(r.State))}
	}
	if err != nil {
		return budget.Reservation{}, fmt.Errorf("reserve %d tokens on account %d: %w", p.Want, p.Account, err)
	}
	res = r.reservation()
	if r.Outcome == "ok" {
		countReserved(ctx, res.Amount)
	}
	return res, nil
}

// BeginAttempt implements budget.Ledger.
func (l *Ledger) BeginAttempt(ctx context.Context, account budget.AccountID, runID, tenantID string) (budget.Attempt, error) {
	var outcome string
	var attempt int64
	var kind, state, secret *string
	// Not idempotent, but safe to retry even when a try's commit was
	// ambiguous: a lost try bumped the attempt once more, to a number no one
	// was told, so no reserve can name it. It fences the earlier attempts,
	// as this call does anyway; the attempt the caller gets is still the
	// account's current one, and its secret the one the account keeps.
	err := retried(ctx, l.log, "ledger.begin_attempt", idempotent, func(ctx context.Context, _ try) error {
		return l.pool.QueryRow(ctx, "SELECT outcome, attempt, info_kind, info_state, secret FROM ledger_begin_attempt($1, $2, $3)",
			int64(account), runID, tenantID).Scan(&outcome, &attempt, &kind, &state, &secret)
	})
	if err == nil {
		switch outcome {
		case "ok":
			return budget.Attempt{N: attempt, Secret: val(secret)}, nil
		case "not_found":
			err = budget.ErrNotFound
		case "denied":
			err = &budget.DeniedError{Account: account, Reason: fmt.Sprintf("not an account of run %s of tenant %s", runID, tenantID)}
		case "exhausted":
			err = &budget.ExhaustedError{Account: account, Kind: budget.AccountKind(val(kind)), State: budget.AccountState(val(state))}
		default:
			err = fmt.Errorf("ledger: unknown outcome %q", outcome)
		}
	}
	return budget.Attempt{}, fmt.Errorf("begin attempt on account %d of run %s: %w", account, runID, err)
}

// OpenHedge implements budget.Ledger: one call of ledger_open_hedge,
// idempotent (a retry returns the account the first try opened), which
// raises FA001 when epoch is not the run's adoption count.
func (l *Ledger) OpenHedge(ctx context.Context, task budget.AccountID, runID, tenantID string, epoch int64) (budget.AccountID, error) {
	var outcome string
	var id int64
	var kind, state *string
	err := retried(ctx, l.log, "ledger.open_hedge", idempotent, func(ctx context.Context, _ try) error {
		return l.pool.QueryRow(ctx, "SELECT outcome, account_id, info_kind, info_state FROM ledger_open_hedge($1, $2, $3, $4)",
			int64(task), runID, tenantID, epoch).Scan(&outcome, &id, &kind, &state)
	})
	if isCode(err, "FA001") {
		err = &budget.DeniedError{Account: task, Reason: pgMessage(err)}
	}
	if err == nil {
		switch outcome {
		case "ok":
			return budget.AccountID(id), nil
		case "not_found":
			err = budget.ErrNotFound
		case "denied":
			err = &budget.DeniedError{Account: task, Reason: fmt.Sprintf("not a task account of run %s of tenant %s", runID, tenantID)}
		case "exhausted":
			err = &budget.ExhaustedError{Account: task, Kind: budget.AccountKind(val(kind)), State: budget.AccountState(val(state))}
		default:
			err = fmt.Errorf("ledger: unknown outcome %q", outcome)
		}
	}
	return 0, fmt.Errorf("open the hedge of task account %d of run %s: %w", task, runID, err)
}

// Settle implements budget.Ledger.
func (l *Ledger) Settle(ctx context.Context, p budget.SettleParams) (res budget.Reservation, err error) {
	if err := p.Validate(); err != nil {
		return budget.Reservation{}, err
	}
	ctx, done := observe(ctx, "settle", AttrReservationID.Int64(int64(p.Reservation)),
		AttrActual.Int64(p.Actual), AttrEstimated.Bool(p.Estimated))
	var r ledgerResult
	defer func() { done(&r, err, AttrGranted.Int64(res.Amount), AttrRunID.String(res.RunID)) }()
	args := &settleArgs{id: int64(p.Reservation), generation: p.Generation, actual: p.Actual, estimated: p.Estimated,
		model: p.Model, input: p.InputTokens, output: p.OutputTokens, secret: nullable(p.Secret)}
	r, err = l.call(ctx, "settle", ledgerCall{sql: settleSQL, args: args.args(), reservation: p.Reservation, settle: args})
	if err == nil && r.Outcome == "ok" {
		countSpent(ctx, val(r.Spent), p.Estimated)
	}
	if err == nil {
		err = r.err(p.Reservation, 0)
	}
	res = r.reservation()
	if err != nil {
		return res, fmt.Errorf("settle reservation %d at %d tokens: %w", p.Reservation, p.Actual, err)
	}
	return res, nil
}

// Void implements budget.Ledger.
func (l *Ledger) Void(ctx context.Context, id budget.ReservationID, generation int64, secret string) (res budget.Reservation, err error) {
	if id <= 0 {
		return budget.Reservation{}, &budget.ValidationError{Field: "reservation", Reason: fmt.Sprintf("must be a positive reservation id, got %d", id)}
	}
	ctx, done := observe(ctx, "void", AttrReservationID.Int64(int64(id)))
	var r ledgerResult
	defer func() { done(&r, err, AttrRunID.String(res.RunID)) }()
	r, err = l.call(ctx, "void", ledgerCall{sql: voidSQL, args: []any{int64(id), generation, nullable(secret)}, reservation: id})
	if err == nil {
		err = r.err(id, 0)
	}
	res = r.reservation()
	if err != nil {
		return res, fmt.Errorf("void reservation %d: %w", id, err)
	}
	return res, nil
}

// Renew implements budget.Ledger.
func (l *Ledger) Renew(ctx context.Context, id budget.ReservationID, generation int64, ttl time.Duration, secret string) (budget.Reservation, error) {
	if ttl <= 0 || ttl > budget.MaxLeaseTTL {
		return budget.Reservation{}, &budget.ValidationError{Field: "ttl", Reason: fmt.Sprintf("must be in (0, %s], got %s", budget.MaxLeaseTTL, ttl)}
	}
	ctx, done := observe(ctx, "renew", AttrReservationID.Int64(int64(id)))
	r, err := l.call(ctx, "renew", ledgerCall{sql: renewSQL, args: []any{int64(id), generation, ttl, nullable(secret)}})
	defer func() { done(&r, err) }()
	if err == nil {
		err = r.err(id, 0)
	}
	if err != nil {
		return r.reservation(), fmt.Errorf("renew reservation %d: %w", id, err)
	}
	return r.reservation(), nil
}

// expireBatch bounds one sweep, so a backlog is worked off in steps.
const expireBatch = 500

// ExpireLeases implements budget.Ledger. Each expiry is its own transaction,
// so sweepers on several nodes never hold one another's chains.
func (l *Ledger) ExpireLeases(ctx context.Context) (int, error) {
	ids, err := retry(ctx, l.log, "ledger.find_expired", idempotent, func(ctx context.Context, _ try) ([]int64, error) {
		rows, err := l.pool.Query(ctx, `SELECT reservation_id FROM reservation
			WHERE state = 'held' AND lease_expires_at <= now() ORDER BY reservation_id LIMIT $1`, expireBatch)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[int64])
	})
	if err != nil {
		return 0, fmt.Errorf("find expired leases: %w", err)
	}
	n := 0
	for _, id := range ids {
		ectx, done := observe(ctx, "expire", AttrReservationID.Int64(id))
		r, err := l.call(ectx, "expire", ledgerCall{sql: expireSQL, args: []any{id}})
		done(&r, err, AttrEstimated.Bool(true))
		if err != nil {
			return n, fmt.Errorf("expire reservation %d: %w", id, err)
		}
		if r.Outcome == "ok" {
			n++
			countSpent(ectx, val(r.Spent), true)
		}
	}
	return n, nil
}

// accountOf maps an account row of the named queries (queries/accounts.sql,
// which all select the same columns) to the ledger's type.
func accountOf(r dbsqlc.AccountRow) budget.Account {
	return budget.Account{ID: budget.AccountID(r.AccountID), TenantID: r.TenantID, ParentID: budget.AccountID(r.ParentID),
		Kind: budget.AccountKind(r.Kind), RunID: r.RunID, TaskID: r.TaskID, Limit: r.LimitTokens, Reserved: r.Reserved,
		Spent: r.Spent, MinReservation: r.MinReservation, State: budget.AccountState(r.State), Cause: r.Cause,
		Attempt: r.Attempt, Closing: r.Closing, Held: r.Held}
}

// readAccount is the account a query returned; pgx.ErrNoRows is
// budget.ErrNotFound.
func readAccount(r dbsqlc.AccountRow, err error) (budget.Account, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		return budget.Account{}, budget.ErrNotFound
	}
	return accountOf(r), err
}

// Account implements budget.Ledger.
func (l *Ledger) Account(ctx context.Context, id budget.AccountID) (budget.Account, error) {
	a, err := retry(ctx, l.log, "ledger.account", idempotent, func(ctx context.Context, _ try) (budget.Account, error) {
		return readAccount(l.q.Account(ctx, l.pool, int64(id)))
	})
	if err != nil {
		return a, fmt.Errorf("read account %d: %w", id, err)
	}
	return a, nil
}

// RunAccount implements budget.Ledger: the run's account with what its
// tasks' slices spent counted as spent (posted or not) and what they hold
// unreserved in Sliced.
func (l *Ledger) RunAccount(ctx context.Context, runID string) (budget.Account, error) {
	a, err := retry(ctx, l.log, "ledger.run_account", idempotent, func(ctx context.Context, _ try) (budget.Account, error) {
		r, err := l.q.RunAccount(ctx, l.pool, runID)
		a, err := readAccount(dbsqlc.AccountRow{AccountID: r.AccountID, TenantID: r.TenantID, ParentID: r.ParentID,
			Kind: r.Kind, RunID: r.RunID, TaskID: r.TaskID, LimitTokens: r.LimitTokens, Reserved: r.Reserved,
			Spent: r.Spent, MinReservation: r.MinReservation, State: r.State, Cause: r.Cause, Attempt: r.Attempt,
			Closing: r.Closing, Held: r.Held}, err)
		a.Sliced = r.Sliced
		return a, err
	})
	if err != nil {
		return a, fmt.Errorf("read run %s account: %w", runID, err)
	}
	return a, nil
}

// CancelRun implements budget.Ledger.
func (l *Ledger) CancelRun(ctx context.Context, runID, cause string) (budget.Account, error) {
	return l.endRun(ctx, runID, budget.StateCancelled, cause)
}

// CloseRun implements budget.Ledger.
func (l *Ledger) CloseRun(ctx context.Context, runID string) (budget.Account, error) {
	return l.endRun(ctx, runID, budget.StateClosed, "run closed")
}

func (l *Ledger) endRun(ctx context.Context, runID string, state budget.AccountState, cause string) (budget.Account, error) {
	// Idempotent: a run already where the call would move it is returned
	// as it is.
	a, err := retry(ctx, l.log, "ledger.end_run", idempotent, func(ctx context.Context, _ try) (budget.Account, error) {
		r, err := l.q.EndRun(ctx, l.pool, dbsqlc.EndRunParams{RunID: runID, State: string(state), Cause: cause})
		return readAccount(dbsqlc.AccountRow(r), err)
	})
	if err != nil {
		return a, fmt.Errorf("end run %s (%s): %w", runID, state, err)
	}
	return a, nil
}

// EndRunFenced implements budget.Ledger: ledger_end_run_fenced, which
// raises FA001 when epoch is not the run's adoption count (run.adoptions).
func (l *Ledger) EndRunFenced(ctx context.Context, runID string, state budget.AccountState, cause string,
	epoch int64) (budget.Account, error) {
	// Idempotent as ledger_end_run is; the epoch check only reads.
	a, err := retry(ctx, l.log, "ledger.end_run_fenced", idempotent, func(ctx context.Context, _ try) (budget.Account, error) {
		r, err := l.q.EndRunFenced(ctx, l.pool, dbsqlc.EndRunFencedParams{RunID: runID, State: string(state), Cause: cause,
			Epoch: epoch})
		return readAccount(dbsqlc.AccountRow(r), err)
	})
	switch {
	case isCode(err, "FA001"):
		return a, fmt.Errorf("end run %s (%s): %w", runID, state, &budget.DeniedError{Reason: pgMessage(err)})
	case err != nil:
		return a, fmt.Errorf("end run %s (%s): %w", runID, state, err)
	}
	return a, nil
}

// WindDown implements budget.Ledger: ledger_wind_down, which raises FA001
// when epoch is not the run's adoption count.
func (l *Ledger) WindDown(ctx context.Context, runID string, epoch int64, taskIDs []string) error {
	// Idempotent: marking a marked task changes nothing.
	_, err := retry(ctx, l.log, "ledger.wind_down", idempotent, func(ctx context.Context, _ try) (int64, error) {
		return l.q.WindDown(ctx, l.pool, dbsqlc.WindDownParams{RunID: runID, Epoch: epoch, TaskIds: taskIDs})
	})
	switch {
	case isCode(err, "FA001"):
		return fmt.Errorf("wind down run %s: %w", runID, &budget.DeniedError{Reason: pgMessage(err)})
	case err != nil:
		return fmt.Errorf("wind down run %s: %w", runID, err)
	}
	return nil
}

// OpenTenant implements budget.Ledger.
func (l *Ledger) OpenTenant(ctx context.Context, tenantID string, limit int64) (budget.Account, error) {
	switch {
	case tenantID == "":
		return budget.Account{}, &budget.ValidationError{Field: "tenant_id", Reason: "must not be empty"}
	case limit <= 0:
		return budget.Account{}, &budget.ValidationError{Field: "limit", Reason: fmt.Sprintf("must be > 0, got %d", limit)}
	}
	// Idempotent: an existing tenant account is returned as it is.
	a, err := retry(ctx, l.log, "ledger.open_tenant", idempotent, func(ctx context.Context, _ try) (budget.Account, error) {
		r, err := l.q.OpenTenant(ctx, l.pool, dbsqlc.OpenTenantParams{TenantID: tenantID, LimitTokens: limit})
		return readAccount(dbsqlc.AccountRow(r), err)
	})
	if err != nil {
		return a, fmt.Errorf("open tenant %s: %w", tenantID, err)
	}
	return a, nil
}

// OpenRun implements budget.Ledger. It is one call of ledger_open_run: the
// node role cannot write accounts or entries itself.
func (l *Ledger) OpenRun(ctx context.Context, p budget.OpenRunParams) (budget.RunAccounts, error) {
	if err := p.Validate(); err != nil {
		return budget.RunAccounts{}, err
	}
	// Idempotent by the run id: an existing run's accounts are returned as
	// they are.
	out, err := retry(ctx, l.log, "ledger.open_run", idempotent, func(ctx context.Context, _ try) (budget.RunAccounts, error) {
		out, err := l.openRun(ctx, p)
		if isUniqueViolation(err) {
			// Another node opened the same run at the same moment: read what it wrote.
			out, err = l.runAccounts(ctx, p.RunID)
		}
		return out, err
	})
	if err != nil {
		return out, fmt.Errorf("open run %s: %w", p.RunID, openRunError(p, err))
	}
	return out, nil
}

// openRunError says what ledger_open_run's refusal of p means.
func openRunError(p budget.OpenRunParams, err error) error {
	switch {
	case isCode(err, "23503"): // foreign_key_violation: the tenant account
		return fmt.Errorf("tenant account %d: %w", p.TenantAccount, budget.ErrNotFound)
	case isCode(err, "22023"): // invalid_parameter_value
		return &budget.ValidationError{Field: "tenant_account", Reason: pgMessage(err)}
	}
	return err
}

func (l *Ledger) openRun(ctx context.Context, p budget.OpenRunParams) (budget.RunAccounts, error) {
	return openRunIn(ctx, l.q, l.pool, p)
}

// openRunIn is one call of ledger_open_run with db, a pool or the
// transaction that creates the run (Runs.OpenRun).
func openRunIn(ctx context.Context, q *dbsqlc.Queries, db dbsqlc.DBTX, p budget.OpenRunParams) (budget.RunAccounts, error) {
	taskIDs, limits, slices := taskArrays(p.Tasks)
	var parent *int64
	if p.TenantAccount != 0 {
		id := int64(p.TenantAccount)
		parent = &id
	}
	rows, err := q.OpenRun(ctx, db, dbsqlc.OpenRunParams{RunID: p.RunID, TenantID: p.TenantID, TenantAccount: parent,
		LimitTokens: p.Limit, MinReservation: p.MinReservation, TaskIds: taskIDs, TaskLimits: limits, Held: p.Held, TaskSlices: slices})
	accounts := make([]dbsqlc.AccountRow, len(rows))
	for i, r := range rows {
		accounts[i] = dbsqlc.AccountRow(r)
	}
	return collectRunAccounts(accounts, err)
}

// taskArrays is tasks as ledger_open_run takes them: ids, limits and slice
// sizes, in order.
func taskArrays(tasks []budget.TaskBudget) (ids []string, limits, slices []int64) {
	ids = make([]string, len(tasks))
	limits = make([]int64, len(tasks))
	slices = make([]int64, len(tasks))
	for i, t := range tasks {
		ids[i], limits[i], slices[i] = t.TaskID, t.Limit, t.Slice
	}
	return ids, limits, slices
}

func (l *Ledger) runAccounts(ctx context.Context, runID string) (budget.RunAccounts, error) {
	return readRunAccounts(ctx, l.q, l.pool, runID)
}

// readRunAccounts reads a run's accounts as OpenRun returns them.
func readRunAccounts(ctx context.Context, q *dbsqlc.Queries, db dbsqlc.DBTX, runID string) (budget.RunAccounts, error) {
	rows, err := q.RunAccounts(ctx, db, runID)
	accounts := make([]dbsqlc.AccountRow, len(rows))
	for i, r := range rows {
		accounts[i] = dbsqlc.AccountRow(r)
	}
	return collectRunAccounts(accounts, err)
}

// collectRunAccounts is a run's accounts as OpenRun returns them: the run's
// and its tasks', or budget.ErrNotFound without the run's.
func collectRunAccounts(rows []dbsqlc.AccountRow, err error) (budget.RunAccounts, error) {
	out := budget.RunAccounts{Tasks: map[string]budget.AccountID{}}
	if err != nil {
		return out, err
	}
	found := false
	for _, r := range rows {
		a := accountOf(r)
		if a.Kind == budget.KindRun {
			out.Run, found = a, true
		} else {
			out.Tasks[a.TaskID] = a.ID
		}
	}
	if !found {
		return out, budget.ErrNotFound
	}
	return out, nil
}
