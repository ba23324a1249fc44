package store_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
)

// sliceModel is the reference for a run whose tasks are budget slices
// (docs/ledger.md#budget-slices), with the semantics of ledger_carve,
// ledger_uncarve, ledger_recall, ledger_reserve_slice, ledger_check_pool,
// ledger_mark_tasks, ledger_return_slices and ledger_end_run: the ledger must
// agree with it after every step. One run, an optional tenant above it, no
// periods and nothing held for a synthesis (the unsliced model covers those).
type sliceModel struct {
	accounts map[budget.AccountID]*sliceAccount
	tenant   budget.AccountID // 0: none
	run      budget.AccountID
	tasks    []budget.AccountID // in account order
	res      map[budget.ReservationID]*budget.Reservation
	resTask  map[budget.ReservationID]budget.AccountID
	closing  bool
	byTenant bool // the run was exhausted by its tenant's budget
	stats    map[string]int
}

type sliceAccount struct {
	limit, reserved, spent, minRes int64
	cap, size, posted              int64 // a sliced task's cap, slice_size, posted
	kind                           budget.AccountKind
	state                          budget.AccountState
}

func (m *sliceModel) avail(id budget.AccountID) int64 {
	a := m.accounts[id]
	return a.limit - a.reserved - a.spent
}

func (m *sliceModel) belowMin(id budget.AccountID) bool {
	return m.avail(id) < m.accounts[id].minRes
}

// above is the chain above a task, root first.
func (m *sliceModel) above() []budget.AccountID {
	if m.tenant != 0 {
		return []budget.AccountID{m.tenant, m.run}
	}
	return []budget.AccountID{m.run}
}

// carve is ledger_carve.
func (m *sliceModel) carve(task budget.AccountID, amount int64) int64 {
	t := m.accounts[task]
	if t.state != budget.StateOpen {
		return 0
	}
	d := min(amount, t.cap-t.limit)
	for _, id := range m.above() {
		a := m.accounts[id]
		if a.state != budget.StateOpen || a.kind == budget.KindTenant && m.belowMin(id) {
			return 0
		}
		d = min(d, m.avail(id))
	}
	if d <= 0 {
		return 0
	}
	for _, id := range m.above() {
		m.accounts[id].reserved += d
	}
	t.limit += d
	return d
}

// uncarve is ledger_uncarve.
func (m *sliceModel) uncarve(task budget.AccountID, ret bool) int64 {
	t := m.accounts[task]
	free := int64(0)
	if ret {
		free = max(m.avail(task), 0)
	}
	x := t.spent - t.posted
	for _, id := range m.above() {
		m.accounts[id].reserved -= free + x
		m.accounts[id].spent += x
	}
	t.limit -= free
	t.posted = t.spent
	return free
}

// recall is ledger_recall.
func (m *sliceModel) recall(except budget.AccountID) int64 {
	got := int64(0)
	for _, id := range m.tasks {
		if id != except && m.avail(id) > 0 {
			got += m.uncarve(id, true)
		}
	}
	if got > 0 {
		m.stats["recall"]++
	}
	return got
}

// mark is ledger_mark_tasks.
func (m *sliceModel) mark(state budget.AccountState) {
	for _, id := range m.tasks {
		if m.accounts[id].state == budget.StateOpen {
			m.accounts[id].state = state
		}
	}
}

// checkExhausted is ledger_check_exhausted.
func (m *sliceModel) checkExhausted() {
	if m.accounts[m.run].state == budget.StateOpen && m.belowMin(m.run) {
		m.accounts[m.run].state = budget.StateExhausted
		m.mark(budget.StateExhausted)
	}
}

// exhaustTenant is ledger_exhaust_tenant.
func (m *sliceModel) exhaustTenant() {
	if m.accounts[m.run].state == budget.StateOpen {
		m.accounts[m.run].state = budget.StateExhausted
		m.byTenant = true
		m.mark(budget.StateExhausted)
	}
}

// checkPool is ledger_check_pool: the run's row is read before the tenant
// is checked, so a run the tenant just exhausted is still recalled from.
func (m *sliceModel) checkPool(task budget.AccountID) {
	runOpen := m.accounts[m.run].state == budget.StateOpen
	if m.tenant != 0 && m.accounts[m.tenant].state == budget.StateOpen && m.belowMin(m.tenant) {
		m.exhaustTenant()
	}
	if runOpen && m.belowMin(m.run) {
		m.recall(task)
		m.checkExhausted()
	}
}

// begin is ledger_begin_attempt on a sliced task of an open run.
func (m *sliceModel) begin(task budget.AccountID) {
	t := m.accounts[task]
	if m.accounts[m.run].state == budget.StateOpen && t.state == budget.StateOpen && m.avail(task) < t.size {
		m.carve(task, t.size-m.avail(task))
	}
}

// reserve is ledger_reserve on a sliced task: the grant, or the outcome and
// the kind of the account a refusal names.
func (m *sliceModel) reserve(task budget.AccountID, want, minimum int64) (int64, string, budget.AccountKind) {
	t := m.accounts[task]
	if t.state == budget.StateOpen && m.avail(task) >= want {
		m.stats["from the slice"]++
		t.reserved += want
		return want, "ok", ""
	}
	for _, id := range append(m.above(), task) {
		if a := m.accounts[id]; a.state != budget.StateOpen {
			if a.kind == budget.KindRun && m.byTenant && a.state == budget.StateExhausted {
				return 0, "exhausted", budget.KindTenant
			}
			m.stats["refused: "+string(a.kind)+" "+string(a.state)]++
			return 0, "exhausted", a.kind
		}
	}
	topup := false
	if m.avail(task) < want {
		topup = m.carve(task, max(want-m.avail(task), t.size)) > 0
		if m.avail(task) < want && t.limit < t.cap && m.recall(task) > 0 {
			topup = m.carve(task, want-m.avail(task)) > 0 || topup
		}
	}
	g := min(want, m.avail(task))
	if g < minimum {
		named := task
		if t.cap-t.reserved-t.spent >= minimum {
			for _, id := range m.above() {
				named = id
				if m.avail(id)+m.avail(task) < minimum || m.accounts[id].kind == budget.KindTenant && m.belowMin(id) {
					break
				}
			}
			switch {
			case m.accounts[named].kind == budget.KindTenant && m.belowMin(named):
				m.exhaustTenant()
			case m.accounts[named].kind == budget.KindRun:
				m.checkExhausted()
			}
		}
		m.stats["refused by "+string(m.accounts[named].kind)]++
		return 0, "exhausted", m.accounts[named].kind
	}
	if topup {
		m.stats["top-up"]++
	}
	t.reserved += g
	if topup {
		m.checkPool(task)
	}
	return g, "ok", ""
}

func (m *sliceModel) settle(id budget.ReservationID, gen, actual int64) string {
	r, task := m.res[id], m.resTask[id]
	t := m.accounts[task]
	switch {
	case r.State == budget.ReservationSettled:
		if r.Actual == actual {
			return "ok"
		}
		return "conflict"
	case r.State == budget.ReservationExpired || r.Lease.Generation != gen:
		return "lease_lost"
	case r.State == budget.ReservationVoided:
		return "conflict"
	}
	if actual > r.Amount && actual-r.Amount > m.avail(task) {
		// Only a settle that resolves the reservation tops its slice up.
		m.carve(task, actual-r.Amount-m.avail(task))
	}
	charge := min(actual, t.limit-(t.reserved-r.Amount)-t.spent)
	t.reserved -= r.Amount
	t.spent += charge
	r.State, r.Actual, r.Spent = budget.ReservationSettled, actual, charge
	if charge > r.Amount {
		m.checkPool(task)
	}
	m.resolved(task)
	return "ok"
}

func (m *sliceModel) void(id budget.ReservationID, gen int64) string {
	r := m.res[id]
	switch {
	case r.State == budget.ReservationVoided:
		return "ok"
	case r.State == budget.ReservationExpired || r.Lease.Generation != gen:
		return "lease_lost"
	case r.State == budget.ReservationSettled:
		return "conflict"
	}
	m.accounts[m.resTask[id]].reserved -= r.Amount
	r.State = budget.ReservationVoided
	m.resolved(m.resTask[id])
	return "ok"
}

// expire: a slice's expired reservation is spent on the slice, whole.
func (m *sliceModel) expire(id budget.ReservationID) {
	r := m.res[id]
	if r.State != budget.ReservationHeld {
		return
	}
	t := m.accounts[m.resTask[id]]
	t.reserved -= r.Amount
	t.spent += r.Amount
	r.State, r.Spent = budget.ReservationExpired, r.Amount
	r.Lease.Generation++
	m.resolved(m.resTask[id])
}

// resolved is ledger_resolved for a call drawn on task's slice.
func (m *sliceModel) resolved(task budget.AccountID) {
	if !m.closing {
		return
	}
	m.uncarve(task, true)
	if m.accounts[m.run].reserved == 0 {
		m.close()
	}
}

// endRun is ledger_end_run.
func (m *sliceModel) endRun(state budget.AccountState) {
	run := m.accounts[m.run]
	if run.state == budget.StateClosed {
		return
	}
	for _, id := range m.tasks {
		m.uncarve(id, true)
	}
	if state == budget.StateClosed && run.reserved == 0 {
		m.close()
		return
	}
	if run.state == budget.StateOpen || run.state == budget.StateExhausted && state == budget.StateCancelled {
		run.state = budget.StateCancelled
		m.mark(budget.StateCancelled)
	}
	if state == budget.StateClosed {
		m.closing = true
	}
}

func (m *sliceModel) close() {
	for _, a := range m.accounts {
		if a.kind != budget.KindTenant {
			a.state = budget.StateClosed
		}
	}
	m.closing = false
}

// runSliceModel applies n random operations drawn from rng to the ledger and
// to sliceModel, and fails t at the first disagreement on an outcome, a
// grant, a row (limit, reserved, spent, state, posted), a reservation, or
// conservation_check.
func runSliceModel(t *testing.T, b *testBundle, runID string, rng *rand.Rand, n int) {
	t.Helper()
	m := &sliceModel{
		accounts: map[budget.AccountID]*sliceAccount{},
		res:      map[budget.ReservationID]*budget.Reservation{},
		resTask:  map[budget.ReservationID]budget.AccountID{},
		stats:    map[string]int{},
	}
	p := budget.OpenRunParams{RunID: runID, TenantID: "tenant-m", Limit: 2000 + rng.Int64N(8000), MinReservation: 1 + rng.Int64N(60)}
	if rng.IntN(2) == 0 {
		lim := 1000 + rng.Int64N(8000)
		ten, err := b.ledger.OpenTenant(b.ctx, "tenant-m", lim)
		if err != nil {
			t.Fatal(err)
		}
		p.TenantAccount = ten.ID
		m.tenant = ten.ID
		m.accounts[ten.ID] = &sliceAccount{limit: lim, minRes: 1, kind: budget.KindTenant, state: budget.StateOpen}
	}
	for i := range 2 + rng.IntN(4) {
		p.Tasks = append(p.Tasks, budget.TaskBudget{TaskID: fmt.Sprint("t", i), Limit: 300 + rng.Int64N(3000), Slice: 50 + rng.Int64N(400)})
	}
	ra, err := b.ledger.OpenRun(b.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	m.run = ra.Run.ID
	m.accounts[m.run] = &sliceAccount{limit: p.Limit, minRes: p.MinReservation, kind: budget.KindRun, state: budget.StateOpen}
	names := map[budget.AccountID]string{}
	for _, tb := range p.Tasks {
		id := ra.Tasks[tb.TaskID]
		m.tasks = append(m.tasks, id)
		names[id] = tb.TaskID
		m.accounts[id] = &sliceAccount{cap: tb.Limit, size: tb.Slice, minRes: 1, kind: budget.KindTask, state: budget.StateOpen}
	}
	slices.Sort(m.tasks)
	// Attempts begin in account order (beginAttempts's map order would
	// carve in a random order when the pool is short).
	for _, id := range append([]budget.AccountID{m.run}, m.tasks...) {
		if _, err := b.ledger.BeginAttempt(b.ctx, id, runID, p.TenantID); err != nil {
			t.Fatal(err)
		}
		if id != m.run {
			m.begin(id)
		}
	}
	compareSliceModel(t, b, m, -1, "open and begin")

	var resIDs []budget.ReservationID
	pick := func() (budget.ReservationID, bool) {
		if len(resIDs) == 0 {
			return 0, false
		}
		return resIDs[rng.IntN(len(resIDs))], true
	}
	for step := range n {
		var desc, got, want string
		switch op := rng.IntN(101); {
		case op < 45: // reserve: on the slice, or past it (a top-up, a recall, a refusal)
			task := m.tasks[rng.IntN(len(m.tasks))]
			wantTok := 1 + rng.Int64N(m.accounts[task].size/2+1)
			if rng.IntN(4) == 0 {
				wantTok = 1 + rng.Int64N(m.accounts[task].size*3)
			}
			minTok := 1 + rng.Int64N(wantTok)
			desc = fmt.Sprintf("reserve(%s, want %d, min %d)", names[task], wantTok, minTok)
			r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: task, Want: wantTok, Min: minTok, Holder: "m", TTL: time.Hour}))
			g, w, kind := m.reserve(task, wantTok, minTok)
			got, want = outcome(err), w
			var ex *budget.ExhaustedError
			if errors.As(err, &ex) && w == "exhausted" && ex.Kind != kind {
				t.Fatalf("step %d %s: refusal names a %s account, model a %s one", step, desc, ex.Kind, kind)
			}
			if err == nil {
				if r.Amount != g {
					t.Fatalf("step %d %s: granted %d, model %d", step, desc, r.Amount, g)
				}
				cp := r
				m.res[r.ID] = &cp
				m.resTask[r.ID] = task
				resIDs = append(resIDs, r.ID)
			}
		case op < 65: // settle, sometimes stale, sometimes past the grant
			id, ok := pick()
			if !ok {
				continue
			}
			r := m.res[id]
			gen := r.Lease.Generation
			if rng.IntN(10) == 0 {
				gen++
			}
			actual := rng.Int64N(r.Amount*3/2 + 1)
			desc = fmt.Sprintf("settle(%d, gen %d, actual %d)", id, gen, actual)
			_, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: id, Generation: gen, Actual: actual})
			got, want = outcome(err), m.settle(id, gen, actual)
		case op < 70: // settle again, with the same actual or another
			id, ok := pick()
			if !ok || m.res[id].State != budget.ReservationSettled {
				continue
			}
			r := m.res[id]
			actual := r.Actual
			if rng.IntN(2) == 0 {
				actual++
			}
			desc = fmt.Sprintf("settle again(%d, actual %d)", id, actual)
			_, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: id, Generation: r.Lease.Generation, Actual: actual})
			got, want = outcome(err), m.settle(id, r.Lease.Generation, actual)
		case op < 78:
			id, ok := pick()
			if !ok {
				continue
			}
			gen := m.res[id].Lease.Generation
			desc = fmt.Sprintf("void(%d, gen %d)", id, gen)
			_, err := b.ledger.Void(b.ctx, id, gen, "")
			got, want = outcome(err), m.void(id, gen)
		case op < 85: // the lease runs out; the sweeper counts it spent on the slice
			id, ok := pick()
			if !ok {
				continue
			}
			desc = fmt.Sprintf("expire(%d)", id)
			if _, err := b.pool.Exec(b.ctx, "UPDATE reservation SET lease_expires_at = now() - interval '1 second' WHERE reservation_id = $1 AND state = 'held'", int64(id)); err != nil {
				t.Fatal(err)
			}
			_, err := b.ledger.ExpireLeases(b.ctx)
			got, want = outcome(err), "ok"
			m.expire(id)
		case op < 93: // a task's end is recorded: its slice goes back, its spend is posted
			task := m.tasks[rng.IntN(len(m.tasks))]
			desc = fmt.Sprintf("return(%s)", names[task])
			var back int64
			err := b.pool.QueryRow(b.ctx, `SELECT ledger_return_slices($1, $2)`, runID, []string{names[task]}).Scan(&back)
			got, want = outcome(err), "ok"
			if w := m.uncarve(task, true); err == nil && back != w {
				t.Fatalf("step %d %s: %d tokens went back, model %d", step, desc, back, w)
			}
		case op < 99 || step < n*2/3: // a run ends late, if at all
			continue
		case op == 99:
			desc = "cancel"
			_, err := b.ledger.CancelRun(b.ctx, runID, "model")
			got, want = outcome(err), "ok"
			m.endRun(budget.StateCancelled)
		default:
			desc = "close"
			_, err := b.ledger.CloseRun(b.ctx, runID)
			got, want = outcome(err), "ok"
			m.endRun(budget.StateClosed)
		}
		if got != want {
			t.Fatalf("step %d %s: store says %s, model says %s", step, desc, got, want)
		}
		compareSliceModel(t, b, m, step, desc)
	}
	desc := "close at the end"
	if _, err := b.ledger.CloseRun(b.ctx, runID); err != nil {
		t.Fatal(err)
	}
	m.endRun(budget.StateClosed)
	for _, id := range resIDs { // what is still held resolves: the run closes
		if m.res[id].State == budget.ReservationHeld {
			if _, err := b.ledger.Void(b.ctx, id, m.res[id].Lease.Generation, ""); err != nil {
				t.Fatal(err)
			}
			m.void(id, m.res[id].Lease.Generation)
		}
	}
	compareSliceModel(t, b, m, n, desc)
	t.Logf("sliced model: %v", m.stats)
	if run := m.accounts[m.run]; run.state != budget.StateClosed || run.reserved != 0 {
		t.Fatalf("model run after the close: %+v", run)
	}
	var slicesSpent int64
	for _, id := range m.tasks {
		slicesSpent += m.accounts[id].spent
	}
	if run := m.accounts[m.run]; run.spent != slicesSpent {
		t.Fatalf("closed run spent %d, its slices %d: not every slice was posted", run.spent, slicesSpent)
	}
}

func compareSliceModel(t *testing.T, b *testBundle, m *sliceModel, step int, desc string) {
	t.Helper()
	for id, want := range m.accounts {
		var lim, res, spent, posted int64
		var state string
		if err := b.pool.QueryRow(b.ctx, `SELECT limit_tokens, reserved, spent, posted, state FROM account WHERE account_id = $1`,
			int64(id)).Scan(&lim, &res, &spent, &posted, &state); err != nil {
			t.Fatal(err)
		}
		if lim != want.limit || res != want.reserved || spent != want.spent || posted != want.posted || state != string(want.state) {
			t.Fatalf("after step %d %s: account %d (%s) limit/reserved/spent/posted/state = %d/%d/%d/%d/%s, model %d/%d/%d/%d/%s",
				step, desc, id, want.kind, lim, res, spent, posted, state, want.limit, want.reserved, want.spent, want.posted, want.state)
		}
	}
	rows, err := b.pool.Query(b.ctx, "SELECT reservation_id, state, spent, generation, chain FROM reservation")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, spent, gen int64
		var chain []int64
		var state string
		if err := rows.Scan(&id, &state, &spent, &gen, &chain); err != nil {
			t.Fatal(err)
		}
		w := m.res[budget.ReservationID(id)]
		if w == nil || string(w.State) != state || w.Spent != spent || w.Lease.Generation != gen {
			t.Fatalf("after step %d %s: reservation %d state/spent/gen = %s/%d/%d, model %+v", step, desc, id, state, spent, gen, w)
		}
		if len(chain) != 1 || chain[0] != int64(m.resTask[budget.ReservationID(id)]) {
			t.Fatalf("after step %d %s: reservation %d on a slice has chain %v, want [task]", step, desc, id, chain)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	b.checkConserved(t)
	if t.Failed() {
		t.FailNow()
	}
}
