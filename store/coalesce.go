package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
)

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
}

// NewLedgerWithConfig returns a ledger on pool tuned by cfg.
func NewLedgerWithConfig(pool *Pool, cfg LedgerConfig) *Ledger {
	l := &Ledger{pool: pool}
	if !cfg.Coalesce {
		return l
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 64
	}
	if cfg.Committers <= 0 {
		cfg.Committers = 1
	}
	c := &coalescer{
		l:        l,
		chains:   map[int64][]int64{},
		resChain: map[budget.ReservationID][]int64{},
	}
	c.g = newGroupCommit(cfg.Committers, cfg.MaxBatch, c.run)
	l.co = c
	return l
}

// Close stops the committers of a coalescing ledger; calls after Close fail.
// It is a no-op on a ledger without Coalesce.
func (l *Ledger) Close() {
	if l.co != nil {
		l.co.g.close()
	}
}

// op is one ledger function call waiting for its batch.
type op struct {
	sql   string // e.g. "ledger_reserve($1, ...)"
	args  []any
	chain []int64 // the accounts it locks, root first: the batch sort key
	res   ledgerResult
	err   error
}

type coalescer struct {
	l *Ledger
	g *groupCommit[*op]

	mu       sync.Mutex
	chains   map[int64][]int64                // account -> chain (immutable once created)
	resChain map[budget.ReservationID][]int64 // reservations this node holds -> chain
}

// batchTimeout bounds one group transaction; it runs detached from any one
// caller's context, since it carries other callers' calls too.
const batchTimeout = 30 * time.Second

// maxRememberedReservations bounds resChain; past it the map starts afresh
// (unknown reservations simply run uncoalesced).
const maxRememberedReservations = 1 << 16

// maxRememberedChains bounds the account chain cache the same way.
const maxRememberedChains = 1 << 16

func (c *coalescer) accountChain(ctx context.Context, account int64) ([]int64, error) {
	c.mu.Lock()
	ch, ok := c.chains[account]
	c.mu.Unlock()
	if ok {
		return ch, nil
	}
	err := c.l.pool.QueryRow(ctx, "SELECT chain FROM account WHERE account_id = $1", account).Scan(&ch)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil // the function reports not_found
	}
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if len(c.chains) >= maxRememberedChains {
		// Chains never change, but accounts of ended runs are asked for no
		// more: start afresh rather than grow without bound.
		c.chains = map[int64][]int64{}
	}
	c.chains[account] = ch
	c.mu.Unlock()
	return ch, nil
}

func (c *coalescer) reservationChain(id budget.ReservationID) []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resChain[id]
}

func (c *coalescer) remember(id budget.ReservationID, chain []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.resChain) >= maxRememberedReservations {
		c.resChain = map[budget.ReservationID][]int64{}
	}
	c.resChain[id] = chain
}

func (c *coalescer) forget(id budget.ReservationID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.resChain, id)
}

// do runs o in the next batch and waits for its result.
func (c *coalescer) do(ctx context.Context, o *op) (ledgerResult, error) {
	if _, err := c.g.do(ctx, o); err != nil {
		return ledgerResult{}, err
	}
	return o.res, o.err
}

// run executes batch in one transaction. The calls are ordered by their
// account chains (a stable sort, so arrival order holds within a chain):
// every transaction then takes row locks in one global order, tree preorder,
// and batches on different nodes cannot deadlock. If the transaction fails
// as a whole, each call is retried on its own.
func (c *coalescer) run(batch []*pending[*op]) {
	slices.SortStableFunc(batch, func(a, b *pending[*op]) int { return slices.Compare(a.item.chain, b.item.chain) })
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	if len(batch) == 1 {
		// Alone: one autocommit round trip beats BEGIN, the call and COMMIT.
		p := batch[0]
		p.item.res, p.item.err = c.l.direct(ctx, p.item.sql, p.item.args...)
		close(p.done)
		return
	}
	err := pgx.BeginFunc(ctx, c.l.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, p := range batch {
			b.Queue("SELECT "+resultCols+" FROM "+p.item.sql, p.item.args...)
		}
		br := tx.SendBatch(ctx, b)
		for _, p := range batch {
			if err := p.item.res.scan(br.QueryRow()); err != nil {
				_ = br.Close()
				return err
			}
		}
		return br.Close()
	})
	if err != nil {
		for _, p := range batch {
			p.item.res, p.item.err = c.l.direct(ctx, p.item.sql, p.item.args...)
		}
	}
	for _, p := range batch {
		close(p.done)
	}
}

// call runs one ledger function: in a group transaction when coalescing and
// the account chain is known, on its own otherwise.
func (l *Ledger) call(ctx context.Context, chain []int64, sql string, args ...any) (ledgerResult, error) {
	if l.co == nil || chain == nil {
		return l.direct(ctx, sql, args...)
	}
	return l.co.do(ctx, &op{sql: sql, args: args, chain: chain})
}

func (l *Ledger) direct(ctx context.Context, sql string, args ...any) (ledgerResult, error) {
	var r ledgerResult
	err := r.scan(l.pool.QueryRow(ctx, "SELECT "+resultCols+" FROM "+sql, args...))
	if err != nil && isCheckViolation(err) {
		// The CHECK is the last line of defence; reaching it is a bug to surface loudly.
		err = fmt.Errorf("ledger invariant refused by database (bug): %w", err)
	}
	return r, err
}
