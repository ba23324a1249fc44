package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/runs"
)

// RunSpend is one row of the run_spend view.
type RunSpend struct {
	TenantID     string `json:"tenant_id"`
	RunID        string `json:"run_id"`
	State        string `json:"state"`
	Cause        string `json:"cause,omitempty"`
	Limit        int64  `json:"limit_tokens"`
	Spent        int64  `json:"spent_tokens"`
	Reported     int64  `json:"reported_tokens"`
	Estimated    int64  `json:"estimated_tokens"`
	Overrun      int64  `json:"overrun_tokens"`
	Reserved     int64  `json:"reserved_tokens"`
	Available    int64  `json:"available_tokens"`
	Reservations int64  `json:"reservations"`
	Held         int64  `json:"held_tokens"`      // still held back for the synthesis
	Synthesis    int64  `json:"synthesis_tokens"` // what the synthesis spent of what was held back
}

// TaskSpend is one row of the task_spend view.
type TaskSpend struct {
	TaskID       string `json:"task_id"`
	Limit        int64  `json:"limit_tokens"`
	Spent        int64  `json:"spent_tokens"`
	Reported     int64  `json:"reported_tokens"`
	Estimated    int64  `json:"estimated_tokens"`
	Overrun      int64  `json:"overrun_tokens"`
	Reserved     int64  `json:"reserved_tokens"`
	Reservations int64  `json:"reservations"`
}

// ContinuationSpend is one row of the run_continuations view: a
// continuation of the run (docs/budget.md#continue) and what was spent from
// it until the next.
type ContinuationSpend struct {
	Continuation int32  `json:"continuation"`
	Added        int64  `json:"added_tokens"`
	Limit        int64  `json:"limit_tokens"`
	SpentBefore  int64  `json:"spent_before_tokens"`
	Spent        int64  `json:"spent_tokens"`
	Reopened     bool   `json:"reopened"`
	Actor        string `json:"actor"`
}

// RunAudit is what an auditor sees of one run.
type RunAudit struct {
	Run           RunSpend            `json:"run"`
	Tasks         []TaskSpend         `json:"tasks"`
	Continuations []ContinuationSpend `json:"continuations,omitempty"`
	Accounts      int                 `json:"accounts_checked"`       // accounts of the run checked by conservation_check
	Broken        int                 `json:"accounts_not_conserved"` // of which not conserved (0 on a healthy ledger)
}

// Audit is the store of what auditors and operators do: read a run's spend
// through the audit views, set prices, and grant or revoke tenant auditors.
type Audit struct {
	db
}

// NewAudit returns the audit store on pool (whose login each method names).
func NewAudit(pool *Pool) *Audit { return &Audit{db: newDB(pool, nil)} }

// Run reads one run's spend exactly as an auditor would: as the role
// fanout_auditor, through the audit views only. runs.ErrNotFound if the
// tenant has no such run.
func (s *Audit) Run(ctx context.Context, tenantID, runID string) (RunAudit, error) {
	a, err := retry(ctx, s.log, "audit.run", idempotent, func(ctx context.Context, _ try) (RunAudit, error) {
		return s.readRun(ctx, tenantID, runID)
	})
	if err != nil {
		return a, fmt.Errorf("audit run %s of tenant %s: %w", runID, tenantID, err)
	}
	return a, nil
}

func (s *Audit) readRun(ctx context.Context, tenantID, runID string) (RunAudit, error) {
	var a RunAudit
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE fanout_auditor"); err != nil {
			return err
		}
		r := &a.Run
		err := tx.QueryRow(ctx, `SELECT tenant_id, run_id, state, cause, limit_tokens, spent_tokens,
			reported_tokens, estimated_tokens, overrun_tokens, reserved_tokens, available_tokens, reservations,
			held_tokens, synthesis_tokens
			FROM run_spend WHERE tenant_id = $1 AND run_id = $2`, tenantID, runID).Scan(
			&r.TenantID, &r.RunID, &r.State, &r.Cause, &r.Limit, &r.Spent, &r.Reported, &r.Estimated,
			&r.Overrun, &r.Reserved, &r.Available, &r.Reservations, &r.Held, &r.Synthesis)
		if errors.Is(err, pgx.ErrNoRows) {
			return runs.ErrNotFound
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT task_id, limit_tokens, spent_tokens, reported_tokens, estimated_tokens,
			overrun_tokens, reserved_tokens, reservations
			FROM task_spend WHERE tenant_id = $1 AND run_id = $2 ORDER BY task_id`, tenantID, runID)
		if err != nil {
			return err
		}
		a.Tasks, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (TaskSpend, error) {
			var t TaskSpend
			err := row.Scan(&t.TaskID, &t.Limit, &t.Spent, &t.Reported, &t.Estimated, &t.Overrun, &t.Reserved, &t.Reservations)
			return t, err
		})
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT continuation, added_tokens, limit_tokens, spent_before_tokens, spent_tokens,
			reopened, actor
			FROM run_continuations WHERE tenant_id = $1 AND run_id = $2 ORDER BY continuation`, tenantID, runID)
		if err != nil {
			return err
		}
		a.Continuations, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ContinuationSpend, error) {
			var c ContinuationSpend
			err := row.Scan(&c.Continuation, &c.Added, &c.Limit, &c.SpentBefore, &c.Spent, &c.Reopened, &c.Actor)
			return c, err
		})
		if err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE NOT conserved)
			FROM conservation_check WHERE tenant_id = $1 AND run_id = $2`, tenantID, runID).Scan(&a.Accounts, &a.Broken)
	})
	return a, err
}

// Price is one row of the price table: what a million tokens of Model cost
// from EffectiveFrom on (until the model's next row), in Currency.
type Price struct {
	Model            string    `json:"model"`
	EffectiveFrom    time.Time `json:"effective_from"`
	InputPerMillion  string    `json:"input_per_million"` // a decimal, exact as stored
	OutputPerMillion string    `json:"output_per_million"`
	Currency         string    `json:"currency"`
}

// SetPriceParams set a model's price. Prices are decimals ("3", "0.15",
// "15.00"), kept exact (numeric); Currency defaults to USD. Actor names
// who set it, for the admin log.
type SetPriceParams struct {
	Actor            string
	Model            string
	EffectiveFrom    time.Time
	InputPerMillion  string
	OutputPerMillion string
	Currency         string
	// Reason is required when EffectiveFrom is before now: such a price
	// corrects what spend was priced at, as a new row beside the old.
	Reason string
}

var (
	decimalRE  = regexp.MustCompile(`^[0-9]{1,12}(\.[0-9]{1,9})?$`)
	currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)
)

// Validate checks p before anything is written.
func (p SetPriceParams) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &budget.ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case p.Actor == "":
		return bad("actor", "must name who sets the price, for the admin log")
	case p.Model == "" || len(p.Model) > budget.MaxModelLen:
		return bad("model", "must be 1..%d bytes, got %d", budget.MaxModelLen, len(p.Model))
	case p.EffectiveFrom.IsZero():
		return bad("effective_from", "must be set")
	case !decimalRE.MatchString(p.InputPerMillion):
		return bad("input_per_million", "must be a decimal >= 0 with at most 12 digits before the point and 9 after, got %q", p.InputPerMillion)
	case !decimalRE.MatchString(p.OutputPerMillion):
		return bad("output_per_million", "must be a decimal >= 0 with at most 12 digits before the point and 9 after, got %q", p.OutputPerMillion)
	case p.Currency != "" && !currencyRE.MatchString(p.Currency):
		return bad("currency", "must be 3 capital letters (ISO 4217), got %q", p.Currency)
	case len(p.Reason) > 1024:
		return bad("reason", "must be at most 1024 bytes, got %d", len(p.Reason))
	}
	return nil
}

// SetPrice adds a model's price from p.EffectiveFrom on through price_set,
// which logs the action to admin_action in the same transaction. Prices
// are append-only: one effective before now is a correction and needs
// p.Reason. The pool may be the owner's or AdminService's (fanout_admin
// may execute price_set). Retried only when the try surely did not commit
// (each logs an action).
func (s *Audit) SetPrice(ctx context.Context, p SetPriceParams) (Price, error) {
	if err := p.Validate(); err != nil {
		return Price{}, err
	}
	if p.Currency == "" {
		p.Currency = "USD"
	}
	out, err := retry(ctx, s.log, "audit.set_price", unsentOnly, func(ctx context.Context, _ try) (Price, error) {
		var out Price
		err := s.pool.QueryRow(ctx, `SELECT model, effective_from, input_per_million::text, output_per_million::text, currency
			FROM price_set($1, $2, $3, $4::numeric, $5::numeric, $6, $7)`,
			p.Actor, p.Model, p.EffectiveFrom, p.InputPerMillion, p.OutputPerMillion, p.Currency, nullable(p.Reason)).Scan(
			&out.Model, &out.EffectiveFrom, &out.InputPerMillion, &out.OutputPerMillion, &out.Currency)
		return out, err
	})
	if isCode(err, "22023") {
		err = &budget.ValidationError{Field: "price", Reason: pgMessage(err)}
	}
	if err != nil {
		return out, fmt.Errorf("set price of model %s from %s: %w", p.Model, p.EffectiveFrom.Format(time.RFC3339), err)
	}
	return out, nil
}
