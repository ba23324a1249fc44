package orchestrator

import (
	"fmt"
	"slices"
	"sync"
)

// Admission by forecast (docs/budget.md#admission-by-forecast; fanout.v1.AdmissionPolicy). The
// forecaster is a run's budget plan as its driver sees it: what the tasks
// may claim (the run's limit less what it holds for its synthesis and less
// its min_reservation, below which the run counts as exhausted; all but the
// held when the tasks' token_budgets add up to no more: claimable), what the
// tasks that ended spent, what the tasks in flight have spent so far and
// what each task is forecast to need. It knows this from the outcomes and
// the iterations the workers already report (spend from settle results,
// grants from reserve replies); it never reads the ledger, which stays the
// only enforcement: a wrong forecast costs a cut-off call (the exhaustion
// policy), never a token over the budget.
//
// What a task needs of the budget is its peak, not its spend: each call
// reserves an upper bound of its input plus its output cap, so a task
// holds its spend so far plus its current grant (FactSummary.peak_tokens),
// and tasks in flight together must fit, or the ledger exhausts the run
// under them. A task's forecast is the average peak of the run's tasks that
// ran to an answer (SUCCEEDED, ITERATION_LIMIT), capped at the task's own
// token_budget; before any has, the average peak of the whole tasks of
// the run's tenant with its model in earlier runs (the prior, read once as
// the run starts; docs/budget.md#priors), capped likewise; without one,
// the task's token_budget (the caller's word for what it may need), or for
// a task without one an even share of what the tasks may claim; never more
// than that. A cap taken for a forecast
// starts the first tasks fewer at a time than the budget might allow,
// until one answers; a share that is too small would let more start than
// the budget pays for, whose reservations (each an upper bound) then
// exhaust the run under them: a task's first iterations are over before
// the run could tell it to wind down. The driver starts the next task in dispatch order
// only when what is left, less what the tasks in flight are forecast to
// still need, covers its forecast; otherwise the task waits while tasks
// are in flight (they may need less than forecast, and their outcomes
// sharpen the forecast). Once none is, it starts short if what is left
// pays for one useful iteration and a final answer (usefulOf): forecast at
// that and wound down from the start (Dispatch.wind_down_after = 1, so no
// ledger mark races its second grant); else it is NOT_STARTED.
//
// Wind-down: when what is left no longer pays for what the tasks in flight
// still need, they are wound down: each one's next grant says so, and that
// iteration is its last, without tools; no task starts until they have
// all ended, and then only as the forecast allows (a task started after a
// wind-down is not wound down). A task in flight still needs its next call
// (forecast from its own last grant plus that grant's growth over the one
// before, else from the largest grant any task of the run reported) and,
// after it, what its forecast says is left of its need: before any task
// has answered (when a forecast is only a cap), one more call.
type forecaster struct {
	mu       sync.Mutex
	limit    int64   // the run's budget
	budget   int64   // what the tasks may claim (claimable)
	held     int64   // what the run holds for its synthesis
	caps     []int64 // caps[i]: task i's token_budget, 0 if none
	share    int64   // an even share of budget over the tasks
	useful   []int64 // useful[i]: what pays for task i's first useful iteration and a final answer
	min      int64   // the run's min_reservation: no forecast is below it
	prior    int64   // the average peak of the tenant's whole tasks with the run's model in earlier runs, 0 if none
	priorN   int64   // how many tasks that prior rests on
	spent    int64   // what the tasks that ended spent
	answered int64   // tasks that ran to an answer
	cost     int64   // what those needed (their peaks), in all
	maxGrant int64   // the largest grant any task reported
	// firstSpent and secondGrant: the most a task spent in its first
	// iteration, and the largest grant of a second one: what a useful
	// iteration and an answer cost, once seen (usefulOf).
	firstSpent, secondGrant int64
	flight                  map[int]*inFlight
	wound                   bool // the tasks in flight were wound down; cleared when none is left
}

// inFlight is what the forecaster knows of a task in flight.
type inFlight struct {
	forecast int64 // at admission
	short    bool  // started with less than its forecast: wound down from the start
	done     bool  // its last call is over: it needs nothing more
	spent    int64 // so far, from its iterations
	last     int64 // its last iteration's grant
	prev     int64 // the one before
	// hedge is the task's second attempt, once admitted (admitHedge): in
	// flight beside the first, with its own spend and grants and its own
	// need; nil for a task not hedged.
	hedge *inFlight
}

func newForecaster(p *plan, limit, held int64) *forecaster {
	tasks := p.spec.GetTasks()
	// A continued run's earlier syntheses spent of the limit too
	// (docs/budget.md#continue).
	f := &forecaster{limit: limit, held: held, caps: make([]int64, len(tasks)), min: p.minReservation, flight: map[int]*inFlight{},
		spent: max(p.spentBeside, 0)}
	for i, t := range tasks {
		f.caps[i] = t.GetTokenBudget()
	}
	f.budget = claimable(f.caps, limit, held, p.minReservation)
	if p.prior.tasks > 0 {
		f.prior, f.priorN = (max(p.prior.peak, p.prior.spent)+p.prior.tasks-1)/p.prior.tasks, p.prior.tasks
	}
	f.share = f.budget / int64(max(1, len(tasks)))
	out := int64(defaultSynthesisOutput)
	if n := p.spec.GetModel().GetMaxOutputTokens(); n > 0 {
		out = int64(n)
	}
	f.useful = make([]int64, len(tasks))
	for i, t := range tasks {
		f.useful[i] = usefulCost(int64(len(t.GetInstruction())+len(p.spec.GetGoal())), out)
	}
	return f
}

// setLimit makes limit the run's budget when it is more than the one the
// forecaster plans with (a continuation raised it; docs/budget.md#continue),
// and reports whether it was.
func (f *forecaster) setLimit(p *plan, limit int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if limit <= f.limit {
		return false
	}
	f.limit = limit
	f.budget = claimable(f.caps, limit, f.held, p.minReservation)
	f.share = f.budget / int64(max(1, len(f.caps)))
	return true
}

// usefulCost is what pays for a task's first useful iteration and a final
// answer, before any call of the run was granted: the first call's input
// (its prompt of promptBytes, plus synthesisPromptBytes of framing, a
// token per byte as the worker bounds it) and two outputs of out, the
// first call's and the final answer's. It is a floor, not a bound: a task
// started on it is wound down from the start, and the wind-down (and a
// final call the ledger cannot pay for, which hands back what the task
// found) keeps a low one from cutting a call off.
func usefulCost(promptBytes, out int64) int64 {
	return promptBytes + synthesisPromptBytes + 2*out
}

// claimable is what a run's tasks (of token_budgets caps, 0 for none) may
// claim: the run's limit less what it holds for its synthesis and less its
// min_reservation, below which the ledger marks the run exhausted. But
// when every task has a token_budget and they add up to at most the limit
// less what is held, the tasks may claim all of that: each task's own
// account stops it at its token_budget, so together they never take the
// run past its limit, and the margin would only keep the last of them
// waiting for the first to end (a run whose budget is the sum of its
// tasks' token_budgets would start them in two waves). The ledger can then
// exhaust the run under them only once they hold or have spent, together,
// all but less than min_reservation of their token_budgets.
func claimable(caps []int64, limit, held, minReservation int64) int64 {
	room := max(0, limit-held)
	if len(caps) == 0 {
		return max(0, room-minReservation)
	}
	var sum int64
	for _, c := range caps {
		if c <= 0 || c > room-sum { // a task without one, or past the room (never overflows)
			return max(0, room-minReservation)
		}
		sum += c
	}
	return room
}

// forecast is what task i is forecast to cost, and on what it rests.
func (f *forecaster) forecast(i int) (int64, string) {
	n := f.need(i)
	switch {
	case f.answered > 0 && (f.caps[i] == 0 || f.caps[i] >= f.average()):
		return n, fmt.Sprintf("the average need of the %d tasks that ran to an answer", f.answered)
	case f.answered > 0:
		return n, "its token_budget"
	case f.prior > 0 && (f.caps[i] == 0 || f.caps[i] >= f.prior):
		return n, fmt.Sprintf("the average need of %d tasks of its tenant with its model in earlier runs (no task has answered yet)", f.priorN)
	case f.caps[i] > 0:
		return n, "its token_budget (no task has answered yet)"
	}
	return n, "an even share of the run's budget (no task has answered yet)"
}

// need is forecast's figure alone: it is asked for every task in flight
// at every admission and iteration, so it builds no text.
func (f *forecaster) need(i int) int64 {
	var n int64
	switch {
	case f.answered > 0:
		n = f.average()
		if c := f.caps[i]; c > 0 && c < n {
			n = c
		}
	case f.prior > 0:
		// Before any task of the run answered, its tenant's earlier runs
		// with the model say what a task needs.
		n = f.prior
		if c := f.caps[i]; c > 0 && c < n {
			n = c
		}
	case f.caps[i] > 0:
		n = f.caps[i]
	default:
		n = f.share
	}
	// No task needs more than the run lets its tasks claim, nor less than
	// one minimal grant.
	return max(min(n, f.budget), f.min)
}

// average is the average need of the tasks that ran to an answer (at
// least one has).
func (f *forecaster) average() int64 { return (f.cost + f.answered - 1) / f.answered }

// left is what the tasks may still spend, by what the forecaster knows.
func (f *forecaster) left() int64 {
	left := f.budget - f.spent
	for _, t := range f.flight {
		left -= t.spent
		if t.hedge != nil {
			left -= t.hedge.spent
		}
	}
	return left
}

// committed is what the tasks in flight are forecast to still spend: a
// hedged task's two attempts each.
func (f *forecaster) committed() int64 {
	var n int64
	for i, t := range f.flight {
		n += f.remaining(i, t)
		if t.hedge != nil {
			n += f.remaining(i, t.hedge)
		}
	}
	return n
}

// remaining is what attempt t of task i in flight is forecast to still
// spend.
func (f *forecaster) remaining(i int, t *inFlight) int64 {
	if t.done {
		return 0 // it answered: it only has to end
	}
	now := f.need(i) // as the run's history says now
	// At least its next call: a task past its forecast still runs.
	return max(t.last, min(now, t.forecast)-t.spent)
}

// admission is the forecaster's answer for the next task.
type admission int

const (
	admit  admission = iota // start it
	hold                    // wait: tasks in flight may free enough
	short                   // start it with less than its forecast, wound down from the start
	refuse                  // never start it: nothing is in flight
)

// admit decides whether task i starts now. On admit the task counts as in
// flight until ended. forecast is the task's forecast; why, on refuse,
// says it with the figures.
func (f *forecaster) admit(i int) (verdict admission, forecast int64, why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, basis := f.forecast(i)
	left, committed := f.left(), f.committed()
	switch {
	case f.wound:
		return hold, n, "" // until the tasks wound down have ended
	case left-committed >= n:
		f.flight[i] = &inFlight{forecast: n}
		return admit, n, ""
	case len(f.flight) > 0:
		return hold, n, ""
	case left >= f.usefulOf(i):
		// None is in flight and what is left pays for a useful iteration
		// and an answer, not for its forecast: it starts wound down from
		// the start.
		u := f.usefulOf(i)
		f.flight[i] = &inFlight{forecast: u, short: true}
		return short, u, ""
	}
	why = fmt.Sprintf("not started: forecast to cost %d tokens (%s), but the run had %d left for its tasks", n, basis, max(0, left))
	if f.held > 0 {
		why += fmt.Sprintf(" (%d more are held for its synthesis)", f.held)
	}
	return refuse, n, why
}

// progress records that task i in flight has spent spent so far, after an
// iteration whose call was granted granted; last: that call was its last
// (SubagentIteration.last), so it needs nothing more. It returns the tasks
// in flight to wind down now, if they must be (once until they have all
// ended).
func (f *forecaster) progress(i int, spent, granted int64, last bool) (windDown []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.flight[i]
	if t == nil {
		return nil
	}
	return f.record(t, spent, granted, last)
}

// progressHedge is progress for the second attempt of task i (its hedge),
// whose spend and grants are its own.
func (f *forecaster) progressHedge(i int, spent, granted int64, last bool) (windDown []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.flight[i]
	if t == nil || t.hedge == nil {
		return nil
	}
	return f.record(t.hedge, spent, granted, last)
}

// record is progress for attempt t of a task in flight.
func (f *forecaster) record(t *inFlight, spent, granted int64, last bool) (windDown []int) {
	switch {
	case t.last == 0:
		f.firstSpent = max(f.firstSpent, spent)
	case t.prev == 0:
		f.secondGrant = max(f.secondGrant, granted)
	}
	t.prev, t.last = t.last, granted
	t.spent, t.done = spent, last
	f.maxGrant = max(f.maxGrant, granted)
	if f.wound {
		return nil
	}
	var need int64 // what the tasks in flight still need: a hedged task's two attempts each
	for j, t := range f.flight {
		need += f.stillNeeds(j, t)
		if t.hedge != nil {
			need += f.stillNeeds(j, t.hedge)
		}
	}
	if f.left() >= need {
		return nil
	}
	f.wound = true
	for j := range f.flight {
		windDown = append(windDown, j)
	}
	slices.Sort(windDown)
	return windDown
}

// stillNeeds is what attempt t of task j in flight still needs, for the
// wind-down: its next call and what its forecast says is left after it.
func (f *forecaster) stillNeeds(j int, t *inFlight) int64 {
	if t.done {
		return 0 // it answered: it only has to end
	}
	next := f.maxGrant
	if t.last > 0 {
		next = t.last
	}
	if t.prev > 0 {
		next += max(0, t.last-t.prev) // calls grow as the conversation does
	}
	after := next
	switch {
	case t.short && t.last > 0:
		after = 0 // wound down from the start: its next call is its answer
	case f.answered > 0 || f.prior > 0:
		now := f.need(j)
		after = max(0, min(now, t.forecast)-t.spent-next)
	}
	return next + after
}

// usefulOf is what pays for task i's first useful iteration and a final
// answer: usefulCost's floor, or what the run's tasks showed it costs (a
// first iteration's spend and a second one's grant), if more.
func (f *forecaster) usefulOf(i int) int64 {
	u := f.useful[i]
	if f.firstSpent > 0 && f.secondGrant > 0 {
		u = max(u, f.firstSpent+f.secondGrant)
	}
	return max(u, 2*f.min)
}

// ended records how task i ended: what it spent and needed at its peak,
// and whether it ran to an answer (its need then informs the forecasts).
func (f *forecaster) ended(i int, spent, peak int64, answered bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.flight[i]; t != nil && t.short {
		answered = false // an answer after one iteration says nothing of what a whole task needs
	}
	if t := f.flight[i]; t != nil && t.hedge != nil {
		answered = false // its spend is two attempts': neither is what one task needs
	}
	delete(f.flight, i)
	if len(f.flight) == 0 {
		f.wound = false // what is left is for tasks started from now on
	}
	f.spent += spent
	if answered {
		f.answered++
		f.cost += max(peak, spent)
	}
}

// forecastOf is task i's forecast at admission, 0 if it is not in flight.
func (f *forecaster) forecastOf(i int) int64 {
	if f == nil {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.flight[i]; t != nil {
		return t.forecast
	}
	return 0
}
