package subagent_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

func TestBuiltinTools(t *testing.T) {
	t.Parallel()
	tools := subagent.BuiltinTools()
	for _, name := range subagent.BuiltinToolNames() {
		if !tools.Known(name) {
			t.Errorf("BuiltinToolNames lists %q but BuiltinTools lacks it", name)
		}
	}
	if tools.Known("rm") {
		t.Error(`Known("rm") = true`)
	}
	if defs := tools.Defs([]string{"note", "rm", "search"}); len(defs) != 2 || defs[0].Name != "note" {
		t.Errorf("Defs = %+v, want note, search", defs)
	}

	search, _ := tools.Get("search")
	call := subagent.ToolCall{Name: "search", Args: json.RawMessage(`{"query":"go"}`)}
	r1, err := search.Func(t.Context(), call)
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := search.Func(t.Context(), call)
	if r1.Text != r2.Text || len(r1.Sources) == 0 || !strings.Contains(r1.Text, r1.Sources[0]) {
		t.Errorf("search is not deterministic or lacks sources: %+v, %+v", r1, r2)
	}
	if search.Effect != subagent.EffectRead {
		t.Error("search is not a read")
	}
}

func TestNoteIsIdempotentByKey(t *testing.T) {
	t.Parallel()
	note, _ := subagent.BuiltinTools().Get("note")
	if note.Effect != subagent.EffectWrite {
		t.Fatal("note is not a write")
	}
	write := func(key, text string) string {
		t.Helper()
		r, err := note.Func(t.Context(), subagent.ToolCall{Name: "note", IdempotencyKey: key, Args: jsonArgs("text", text)})
		if err != nil {
			t.Fatal(err)
		}
		return r.Text
	}
	first := write("k1", "hello")
	if replay := write("k1", "something else"); replay != first {
		t.Errorf("replay of k1 = %q, want the first result %q", replay, first)
	}
	if other := write("k2", "bye"); other == first || !strings.HasPrefix(other, "note 2 ") {
		t.Errorf("k2 = %q, want a second note", other)
	}
	if _, err := note.Func(t.Context(), subagent.ToolCall{Name: "note"}); err == nil {
		t.Error("note without a key succeeded")
	}
}

func TestNewToolsRejectsDuplicates(t *testing.T) {
	t.Parallel()
	f := func(context.Context, subagent.ToolCall) (subagent.ToolResult, error) {
		return subagent.ToolResult{}, nil
	}
	if _, err := subagent.NewTools(subagent.Tool{Name: "x", Func: f}, subagent.Tool{Name: "x", Func: f}); err == nil {
		t.Error("duplicate tool accepted")
	}
	if names := subagent.BuiltinToolNames(); !slices.IsSorted(names) {
		t.Errorf("BuiltinToolNames = %v, not sorted", names)
	}
}

// failingRenew is the real ledger whose lease renewals fail.
type failingRenew struct{ budget.Ledger }

func (failingRenew) Renew(context.Context, budget.ReservationID, int64, time.Duration, string) (budget.Reservation, error) {
	return budget.Reservation{}, budget.ErrLeaseLost
}

// TestLoopStopsWhenLeaseCannotBeRenewed: a worker that cannot renew stops
// its call before the lease ends, and still settles it.
func TestLoopStopsWhenLeaseCannotBeRenewed(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	sim := newSim(t, llm.SimConfig{Latency: time.Hour})
	loop := newLoop(b, sim)
	loop.Ledger = failingRenew{b.ledger}
	// Long enough that the renewal (at TTL/3) is tried well before the
	// stop a margin before the lease's end, even on a loaded machine (300ms
	// once lost that race: the stop came first, not the refused renewal).
	loop.LeaseTTL = 3 * time.Second
	// The call would take an hour: only the failed renewal can stop it
	// before this deadline does.
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	sum := loop.Run(ctx, newTask(b, "a"))
	if ctx.Err() != nil {
		t.Fatalf("the call ran until the test's %v deadline (status %s, err %v): the failed lease renewal did not stop it",
			patience, sum.Status, sum.Err)
	}
	if sum.Status != subagent.StatusFailed || !errors.Is(sum.Err, budget.ErrLeaseLost) {
		t.Errorf("status %s, err %v; want FAILED with ErrLeaseLost", sum.Status, sum.Err)
	}
	if calls := sim.Calls(); len(calls) != 1 || !calls[0].Cancelled {
		t.Errorf("calls %+v, want one cancelled", calls)
	}
	b.checkLedger(t)
}

// jsonArgs is the arguments object {name: value}.
func jsonArgs(name, value string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{name: value}) // A map of strings always marshals.
	return b
}
