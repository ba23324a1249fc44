package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fanout/fanout/budget"
)

// ledgerCall is one call of a ledger function that returns a ledger_result.
type ledgerCall struct {
	sql  string // the statement: reserveSQL, settleSQL, ...
	args []any
	// What the call acts on, for an executor that orders calls by the
	// accounts they lock: the account a reserve draws on, or the
	// reservation a settle or void resolves. Neither for the other calls.
	account     budget.AccountID
	reservation budget.ReservationID
	// reserve is a reserve's arguments, typed: a batch writes consecutive
	// reserves with one call of ledger_reserve_batch.
	reserve *reserveArgs
	// settle is a settle's, for ledger_settle_batch the same way.
	settle *settleArgs
}

// settleArgs are the arguments of one ledger_settle call, in its order.
type settleArgs struct {
	id, generation, actual int64
	estimated              bool
	model                  string
	input, output          int64
	secret                 *string
}

func (a *settleArgs) args() []any {
	return []any{a.id, a.generation, a.actual, a.estimated, a.model, a.input, a.output, a.secret}
}

// settleBatchSQL makes consecutive settles of a batch in one statement
// (migrations/functions/ledger_settle_batch.sql): row i is call i's result.
const settleBatchSQL = resultColumns + `ledger_settle_batch($1, $2, $3, $4, $5, $6, $7, $8)`

// queueSettles queues calls, all settles, as one ledger_settle_batch.
func queueSettles(q *pgx.Batch, calls []*pending[*batchedCall]) {
	n := len(calls)
	ids, gens, actuals, inputs, outputs := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	estimated, models, secrets := make([]bool, n), make([]string, n), make([]*string, n)
	for i, p := range calls {
		a := p.item.settle
		ids[i], gens[i], actuals[i], inputs[i], outputs[i] = a.id, a.generation, a.actual, a.input, a.output
		estimated[i], models[i], secrets[i] = a.estimated, a.model, a.secret
	}
	q.Queue(settleBatchSQL, ids, gens, actuals, estimated, models, inputs, outputs, secrets)
}

// settleRun is the length of the run of settles batch starts with.
func settleRun(batch []*pending[*batchedCall]) int {
	n := 0
	for n < len(batch) && batch[n].item.settle != nil {
		n++
	}
	return n
}

// reserveArgs are the arguments of one ledger_reserve call, in its order.
type reserveArgs struct {
	account, attempt, want, min int64
	run, tenant, holder, key    string
	ttl                         time.Duration
	model                       string
	secret                      *string
	fromHeld                    bool
}

func (a *reserveArgs) args() []any {
	return []any{a.account, a.run, a.tenant, a.attempt, a.want, a.min, a.holder, a.ttl, a.key, a.model, a.secret, a.fromHeld}
}

// reserveBatchSQL makes consecutive reserves of a batch in one statement
// (migrations/functions/ledger_reserve_batch.sql): row i is call i's result.
const reserveBatchSQL = resultColumns + `ledger_reserve_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`

// queueReserves queues calls, all reserves, as one ledger_reserve_batch.
func queueReserves(q *pgx.Batch, calls []*pending[*batchedCall]) {
	n := len(calls)
	accounts, attempts, wants, mins := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	runs, tenants, holders, keys, models := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	ttls, secrets, fromHeld := make([]time.Duration, n), make([]*string, n), make([]bool, n)
	for i, p := range calls {
		a := p.item.reserve
		accounts[i], attempts[i], wants[i], mins[i] = a.account, a.attempt, a.want, a.min
		runs[i], tenants[i], holders[i], keys[i], models[i] = a.run, a.tenant, a.holder, a.key, a.model
		ttls[i], secrets[i], fromHeld[i] = a.ttl, a.secret, a.fromHeld
	}
	q.Queue(reserveBatchSQL, accounts, runs, tenants, attempts, wants, mins, holders, ttls, keys, models, secrets, fromHeld)
}

// reserveRun is the length of the run of reserves batch starts with.
func reserveRun(batch []*pending[*batchedCall]) int {
	n := 0
	for n < len(batch) && batch[n].item.reserve != nil {
		n++
	}
	return n
}

// ledgerExec runs ledger calls. A Ledger holds one, chosen at construction:
// directExec (one statement per call) or batchExec (group commit).
type ledgerExec interface {
	call(ctx context.Context, c ledgerCall) (ledgerResult, error)
	close()
}

// directExec runs each call as one statement in its own transaction.
type directExec struct{ pool *pgxpool.Pool }

func (d directExec) call(ctx context.Context, c ledgerCall) (ledgerResult, error) {
	var r ledgerResult
	err := r.scan(d.pool.QueryRow(ctx, c.sql, c.args...))
	if err != nil && isCheckViolation(err) {
		// The CHECK is the last line of defence; reaching it is a bug to surface loudly.
		err = fmt.Errorf("ledger invariant refused by database (bug): %w", err)
	}
	return r, err
}

func (directExec) close() {}

// batchExec makes the reserves, settles and voids that arrive together on
// this node share one transaction (group commit), ordered by the account
// chains they lock. A call whose chain it does not know (a reservation made
// by another node, an account that does not exist) and every other call
// run directly.
type batchExec struct {
	direct directExec
	g      *groupCommit[*batchedCall]

	mu       sync.Mutex
	chains   map[budget.AccountID]lockSet     // account -> what its calls lock (immutable once created)
	resChain map[budget.ReservationID]lockSet // reservations this node holds -> what their calls lock
}

// lockSet is what a call locks: the chain of its account, root first, and
// whether the account is a budget slice (a call the slice pays for locks
// the slice's row alone; docs/ledger.md#budget-slices).
type lockSet struct {
	chain  []int64
	sliced bool
}

// batchedCall is one call waiting for its batch.
type batchedCall struct {
	ledgerCall
	lockSet // the accounts it locks, root first: the batch sort key
	res     ledgerResult
	err     error
}

// maxRememberedReservations bounds resChain; past it the map starts afresh
// (unknown reservations simply run directly).
const maxRememberedReservations = 1 << 16

// maxRememberedChains bounds the account chain cache the same way.
const maxRememberedChains = 1 << 16

func newBatchExec(pool *pgxpool.Pool, committers, maxBatch int) *batchExec {
	b := &batchExec{
		direct:   directExec{pool: pool},
		chains:   map[budget.AccountID]lockSet{},
		resChain: map[budget.ReservationID]lockSet{},
	}
	b.g = newGroupCommit(committers, maxBatch, b.run)
	return b
}

func (b *batchExec) call(ctx context.Context, c ledgerCall) (ledgerResult, error) {
	locks, err := b.chainOf(ctx, c)
	if err != nil {
		return ledgerResult{}, err
	}
	if locks.chain == nil {
		return b.direct.call(ctx, c)
	}
	o, err := b.g.do(ctx, &batchedCall{ledgerCall: c, lockSet: locks})
	if err != nil {
		return ledgerResult{}, err
	}
	if o.err == nil && o.res.Outcome == "ok" {
		b.mu.Lock()
		switch {
		case c.account != 0: // a new reservation on chain
			if len(b.resChain) >= maxRememberedReservations {
				b.resChain = map[budget.ReservationID]lockSet{}
			}
			b.resChain[budget.ReservationID(val(o.res.ReservationID))] = locks
		case c.reservation != 0: // resolved: it takes no more calls
			delete(b.resChain, c.reservation)
		}
		b.mu.Unlock()
	}
	return o.res, o.err
}

// chainOf returns what c locks; its chain is nil when it is not known.
func (b *batchExec) chainOf(ctx context.Context, c ledgerCall) (lockSet, error) {
	switch {
	case c.reservation != 0:
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.resChain[c.reservation], nil
	case c.account != 0:
		return b.accountChain(ctx, c.account)
	}
	return lockSet{}, nil
}

func (b *batchExec) accountChain(ctx context.Context, account budget.AccountID) (lockSet, error) {
	b.mu.Lock()
	ls, ok := b.chains[account]
	b.mu.Unlock()
	if ok {
		return ls, nil
	}
	err := b.direct.pool.QueryRow(ctx, "SELECT chain, cap_tokens IS NOT NULL FROM account WHERE account_id = $1",
		int64(account)).Scan(&ls.chain, &ls.sliced)
	if errors.Is(err, pgx.ErrNoRows) {
		return lockSet{}, nil // the function reports not_found
	}
	if err != nil {
		return lockSet{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.chains) >= maxRememberedChains {
		// Chains never change, but accounts of ended runs are asked for no
		// more: start afresh rather than grow without bound.
		b.chains = map[budget.AccountID]lockSet{}
	}
	b.chains[account] = ls
	return ls, nil
}

// batchOrder is the order of a batch's calls: calls on accounts that are
// not slices first, by chain (tree preorder: every transaction takes
// those locks in one global order); then calls on slices, reserves before
// settles before the rest, so that each kind is one statement
// (ledger_reserve_batch, ledger_settle_batch), by chain within a kind. A
// call on a slice locks the slice's row alone, and after one the
// transaction takes no row above a slice but without waiting
// (docs/ledger.md#budget-slices).
func batchOrder(x, y *pending[*batchedCall]) int {
	a, b := x.item, y.item
	if a.sliced != b.sliced {
		if a.sliced {
			return 1
		}
		return -1
	}
	if a.sliced {
		if c := cmp.Compare(a.kindRank(), b.kindRank()); c != 0 {
			return c
		}
	}
	return slices.Compare(a.chain, b.chain)
}

// kindRank orders calls on slices: reserves, settles, the rest.
func (c *batchedCall) kindRank() int {
	switch {
	case c.reserve != nil:
		return 0
	case c.settle != nil:
		return 1
	}
	return 2
}

// run executes batch in one transaction, in one round trip. The calls are ordered by their
// account chains (a stable sort, so arrival order holds within a chain):
// every transaction then takes row locks in one global order, tree preorder,
// and batches on different nodes cannot deadlock. (A call on a budget
// slice locks the slice's row alone; a later call of the batch that needs
// the rows above it does not wait for them: docs/ledger.md#budget-slices.)
// If the transaction fails as a whole because of one call (a server error
// rolled it back) or a serialization failure, each call is tried again on
// its own, so that it fails alone; any other transient error (retry.go)
// fails every call of the batch instead, for Ledger.call to retry under its
// caller's deadline.
func (b *batchExec) run(ctx context.Context, batch []*pending[*batchedCall]) {
	defer func() {
		for _, p := range batch {
			close(p.done)
		}
	}()
	if len(batch) == 1 {
		// Alone: one autocommit round trip beats BEGIN, the call and COMMIT.
		o := batch[0].item
		o.res, o.err = b.direct.call(ctx, o.ledgerCall)
		return
	}
	slices.SortStableFunc(batch, batchOrder)
	// One round trip: a batch sent without BEGIN runs in one implicit
	// transaction (the extended protocol's Sync commits it, or rolls all
	// of it back on an error), as BEGIN, the calls and COMMIT did in three.
	// Consecutive reserves (two or more) are one statement, set-based.
	q := &pgx.Batch{}
	var stmts [][]*pending[*batchedCall] // the calls each statement answers, in order
	for rest := batch; len(rest) > 0; {
		n := max(reserveRun(rest), 1)
		switch s := settleRun(rest); {
		case n > 1:
			queueReserves(q, rest[:n])
		case s > 1:
			n = s
			queueSettles(q, rest[:n])
		default:
			q.Queue(rest[0].item.sql, rest[0].item.args...)
		}
		stmts = append(stmts, rest[:n])
		rest = rest[n:]
	}
	err := func() error {
		br := b.direct.pool.SendBatch(ctx, q)
		for _, calls := range stmts {
			if err := scanResults(br, calls); err != nil {
				_ = br.Close()
				return err
			}
		}
		return br.Close()
	}()
	if class, code := classify(err); class != permanent && code != "40001" {
		for _, p := range batch {
			p.item.err = err
		}
		return
	}
	// A serialization failure of a batch (a call that needed the rows above
	// a budget slice whose row an earlier call of the batch held, and that
	// another transaction held: docs/ledger.md#budget-slices) is made good
	// by each call on its own, in a transaction that takes its rows in
	// order; so is a batch that failed because of one call.
	if err != nil {
		for _, p := range batch {
			p.item.res, p.item.err = b.direct.call(ctx, p.item.ledgerCall)
		}
	}
}

// scanResults reads the next statement's answer to calls: one row each, in order.
func scanResults(br pgx.BatchResults, calls []*pending[*batchedCall]) error {
	if len(calls) == 1 {
		return calls[0].item.res.scan(br.QueryRow())
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for _, p := range calls {
		if !rows.Next() {
			if err := rows.Err(); err != nil {
				return err
			}
			return fmt.Errorf("ledger_reserve_batch answered fewer than its %d calls", len(calls))
		}
		if err := p.item.res.scan(rows); err != nil {
			return err
		}
	}
	if rows.Next() {
		return fmt.Errorf("ledger_reserve_batch answered more than its %d calls", len(calls))
	}
	rows.Close()
	return rows.Err()
}

func (b *batchExec) close() { b.g.close() }
