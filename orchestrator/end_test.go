package orchestrator_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// noFinishEvents refuses every append that carries a RunFinished, as a
// write that failed once would: the end must not depend on it.
type noFinishEvents struct{ orchestrator.RunStore }

func (s noFinishEvents) AppendEvent(ctx context.Context, runID string, ev *fanoutv1.RunEvent) (*fanoutv1.RunEvent, error) {
	if ev.GetRunFinished() != nil {
		return nil, errors.New("write tcp: broken pipe")
	}
	return s.RunStore.AppendEvent(ctx, runID, ev)
}

func (s noFinishEvents) AppendEvents(ctx context.Context, runID string, evs []*fanoutv1.RunEvent) ([]*fanoutv1.RunEvent, error) {
	for _, ev := range evs {
		if ev.GetRunFinished() != nil {
			return nil, errors.New("write tcp: broken pipe")
		}
	}
	return s.RunStore.AppendEvents(ctx, runID, evs)
}

// TestTheEndIsOneWrite: a run's final state, result and RunFinished are
// one write. Here every separate append of a RunFinished fails (issue 12:
// when the second of two writes failed once, the run was SUCCEEDED in the
// database and every stream hung); the followers still hear the end.
func TestTheEndIsOneWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w1", llm.SimConfig{}, 8)
	n := b.orchestratorWith(t, "o1", orchestrator.Config{}, func(p *orchestrator.EngineParams) {
		p.Store = noFinishEvents{p.Store}
	}, w)
	r, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec("one-write", 2, 1_000_000)})
	if err != nil {
		t.Fatal(err)
	}
	evs := watchAllAfter(t, n.client, r.GetRunId(), 0)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED || len(fin.GetResult().GetTasks()) != 2 {
		t.Fatalf("RunFinished %s with %d tasks, want SUCCEEDED with 2", fin.GetState(), len(fin.GetResult().GetTasks()))
	}
	got, err := n.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: r.GetRunId()})
	if err != nil || got.GetRun().GetState() != fin.GetState() {
		t.Fatalf("GetRun: %v, %v; want the state RunFinished carried", got.GetRun().GetState(), err)
	}
}

// TestWatchEndsWhenTheRunHasEnded: a run whose state is final ends its
// followers even if its RunFinished event is missing (a run ended by an
// older version, or by hand): the stream ends with a RunFinished rebuilt
// from the run, for a follower from the start and one that has read
// everything stored.
func TestWatchEndsWhenTheRunHasEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w1", llm.SimConfig{}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	fin := checkEvents(t, runStream(t, n.client, spec("missing-end", 1, 1_000_000)))
	var runID string
	var last int64
	if err := b.pool.QueryRow(t.Context(), `DELETE FROM fanout.run_event
		WHERE (run_id, sequence) = (SELECT run_id, last_sequence FROM fanout.run WHERE idempotency_key = 'missing-end')
		RETURNING run_id, sequence - 1`).Scan(&runID, &last); err != nil {
		t.Fatalf("delete the RunFinished: %v", err)
	}
	for _, after := range []int64{0, last} {
		evs := watchAllAfter(t, n.client, runID, after)
		if len(evs) == 0 || evs[len(evs)-1].GetRunFinished() == nil {
			t.Fatalf("after %d: the stream ended without a RunFinished (%d events)", after, len(evs))
		}
		got := evs[len(evs)-1].GetRunFinished()
		if got.GetState() != fin.GetState() || len(got.GetResult().GetTasks()) != 1 {
			t.Errorf("after %d: rebuilt RunFinished %s with %d tasks, want %s with 1", after, got.GetState(),
				len(got.GetResult().GetTasks()), fin.GetState())
		}
	}
}
