package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

// appendInTx appends evs (of one kind, named what) to the run, in order,
// within tx (appendSQL). A run that has ended takes none: runs.ErrEnded.
func appendInTx(ctx context.Context, tx pgx.Tx, runID, what string, evs []*fanoutv1.RunEvent) error {
	keys := make([]string, len(evs))
	for i := range keys {
		keys[i] = newEventKey()
	}
	return appendKeyed(ctx, tx, runID, what, evs, keys)
}

// appendKeyed is appendInTx with each event's key given.
func appendKeyed(ctx context.Context, tx pgx.Tx, runID, what string, evs []*fanoutv1.RunEvent, keys []string) error {
	bodies, err := encodeEvents(runID, what, evs)
	if err != nil {
		return err
	}
	_, _, err = appendBodies(ctx, tx, runID, what, bodies, keys)
	return err
}

// encodeEvents encodes evs (of one kind, named what) as the log stores them.
func encodeEvents(runID, what string, evs []*fanoutv1.RunEvent) ([][]byte, error) {
	bodies := make([][]byte, len(evs))
	for i, ev := range evs {
		body, err := encodeEvent(ev)
		if err != nil {
			return nil, fmt.Errorf("append %s to run %s: encode: %w", what, runID, err)
		}
		bodies[i] = body
	}
	return bodies, nil
}

// appendBodies appends encoded events to the run, in order, within tx
// (appendSQL), and returns the sequence of the first and their time. A run
// that has ended takes none: runs.ErrEnded.
func appendBodies(ctx context.Context, tx pgx.Tx, runID, what string, bodies [][]byte, keys []string) (first int64, at time.Time, err error) {
	if len(bodies) == 0 {
		return 0, time.Time{}, nil
	}
	var state string
	var last int64
	if err := tx.QueryRow(ctx, appendSQL, runID, bodies, keys).Scan(&state, &last, &at); err != nil {
		return 0, time.Time{}, fmt.Errorf("append %s to run %s: %w", what, runID, err)
	}
	if state != "RUNNING" {
		return 0, time.Time{}, fmt.Errorf("append %s to run %s: the run has ended %s: %w", what, runID, state, runs.ErrEnded)
	}
	return last - int64(len(bodies)) + 1, at, nil
}

// storedEvent is the event of a stored body with its columns: what a read
// of the log returns, and what CloseRun hands back of what it appended.
func storedEvent(runID string, body []byte, sequence int64, at time.Time) (*fanoutv1.RunEvent, error) {
	ev, err := decodeEvent(body)
	if err != nil {
		return nil, fmt.Errorf("decode event %d: %w", sequence, err)
	}
	ev.RunId, ev.Sequence, ev.Time = runID, sequence, timestamppb.New(at)
	return ev, nil
}

// AppendEvent appends ev as the run's next event and returns a copy with its
// sequence (the previous one plus 1: no gaps, even with concurrent writers)
// and time (database time) set. A run's history ends with its RunFinished:
// once the run has ended, any other event is refused with runs.ErrEnded
// (it comes from a replica that lost the run to another). Returns
// runs.ErrNotFound for an unknown run.
func (s *Runs) AppendEvent(ctx context.Context, runID string, ev *fanoutv1.RunEvent) (*fanoutv1.RunEvent, error) {
	out, err := s.AppendEvents(ctx, runID, []*fanoutv1.RunEvent{ev})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// AppendEvents appends evs to the run as consecutive events, in order and
// all or none, and returns copies with their sequences and time set. Its
// error contract is AppendEvent's: once the run has ended it takes nothing
// (runs.ErrEnded; the end wrote the RunFinished, FinishRun); an unknown run
// is runs.ErrNotFound.
func (s *Runs) AppendEvents(ctx context.Context, runID string, evs []*fanoutv1.RunEvent) ([]*fanoutv1.RunEvent, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	op := &eventOp{runID: runID, bodies: make([][]byte, len(evs)), keys: make([]string, len(evs))}
	outs := make([]*fanoutv1.RunEvent, len(evs))
	for i, ev := range evs {
		out := proto.CloneOf(ev)
		out.RunId, out.Sequence, out.Time = "", 0, nil // the columns hold them
		body, err := encodeEvent(out)
		if err != nil {
			return nil, fmt.Errorf("append events to run %s: encode: %w", runID, err)
		}
		outs[i], op.bodies[i], op.keys[i] = out, body, newEventKey()
	}
	// Idempotent by the events' keys: a try after an ambiguous commit first
	// looks for them, and a try that collides with them (the lost try
	// committed meanwhile) finds them too.
	err := retried(ctx, s.log, "runs.append_events", idempotent, func(ctx context.Context, t try) error {
		if t.ambiguous {
			if found, err := s.appended(ctx, op); found || err != nil {
				return err
			}
		}
		op.err = nil
		if _, err := s.events.do(ctx, op); err != nil {
			return err
		}
		if isUniqueViolation(op.err) {
			if found, err := s.appended(ctx, op); found || err != nil {
				return err
			}
		}
		return op.err
	})
	if err != nil {
		return nil, fmt.Errorf("append events to run %s: %w", runID, err)
	}
	for i, out := range outs {
		out.RunId, out.Sequence, out.Time = runID, op.first+int64(i), timestamppb.New(op.at)
	}
	return outs, nil
}

// appended reports whether op's events are stored (found by the key of
// the first: a call's events are written all or none) and if so sets op's
// first sequence and time from them.
func (s *Runs) appended(ctx context.Context, op *eventOp) (bool, error) {
	r, err := s.q.EventByKey(ctx, s.pool, dbsqlc.EventByKeyParams{RunID: op.runID, EventKey: op.keys[0]})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	op.first, op.at = r.Sequence, r.CreatedAt
	return err == nil, err
}

// newEventKey is a random (version 4) UUID, the key of one event.
func newEventKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// eventOp is one AppendEvents call waiting for its batch.
type eventOp struct {
	runID  string
	bodies [][]byte // eventRecords, in order
	keys   []string // each body's event_key
	first  int64    // the sequence of bodies[0], once appended
	at     time.Time
	err    error
}

// appendSQL appends one run's events of a batch in one statement: one
// UPDATE of the run row takes as many sequence numbers as it accepts events
// (all while the run is RUNNING, none once it ended: FinishRun wrote the
// run's last event, its RunFinished) and
// one INSERT stores them with their keys ($3), numbered in array order. The
// row lock makes the sequences gapless; no row back means no such run.
const appendSQL = `
	WITH seq AS (
		UPDATE run SET last_sequence = last_sequence + CASE WHEN state = 'RUNNING' THEN cardinality($2::jsonb[]) ELSE 0 END
		WHERE run_id = $1
		RETURNING tenant_id, last_sequence, state),
	kept AS (
		SELECT t.body, t.key, row_number() OVER (ORDER BY t.ord) AS k, count(*) OVER () AS n
		  FROM seq, unnest($2::jsonb[], $3::uuid[]) WITH ORDINALITY AS t(body, key, ord)
		 WHERE seq.state = 'RUNNING'),
	ins AS (
		INSERT INTO run_event (run_id, sequence, tenant_id, event, event_key)
		SELECT $1, seq.last_sequence - kept.n + kept.k, seq.tenant_id, kept.body, kept.key FROM seq, kept)
	SELECT state, last_sequence, now() FROM seq`

// appendBatch appends a batch of AppendEvents calls in one round trip and
// one transaction: one appendSQL per run, runs in id order (so concurrent
// batches lock run rows in one order and cannot deadlock), each run's calls
// in arrival order. If the transaction fails as a whole because of one call
// (a server error rolled it back), each call is tried again on its own, so
// that one bad call fails alone; a transient error (retry.go) fails every
// call instead, for AppendEvents to retry under its caller's deadline.
func (s *Runs) appendBatch(ctx context.Context, batch []*pending[*eventOp]) {
	defer func() {
		for _, p := range batch {
			close(p.done)
		}
	}()
	defer announceRuns(s.notices, batch, func(op *eventOp) string { return op.runID })
	slices.SortStableFunc(batch, func(a, b *pending[*eventOp]) int { return strings.Compare(a.item.runID, b.item.runID) })
	var groups [][]*eventOp
	for i, p := range batch {
		if i == 0 || p.item.runID != batch[i-1].item.runID {
			groups = append(groups, nil)
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], p.item)
	}
	err := s.appendGroups(ctx, groups)
	if err == nil {
		return
	}
	if class, _ := classify(err); class != permanent || len(batch) == 1 {
		for _, p := range batch {
			p.item.err = err
		}
		return
	}
	for _, p := range batch {
		if err := s.appendGroups(ctx, [][]*eventOp{{p.item}}); err != nil {
			p.item.err = err
		}
	}
}

// appendGroups runs appendSQL for each group (one run's calls) in one
// pgx batch, which PostgreSQL runs as one implicit transaction. It sets
// each call's outcome and returns an error only if the batch failed.
func (s *Runs) appendGroups(ctx context.Context, groups [][]*eventOp) error {
	q := &pgx.Batch{}
	for _, g := range groups {
		var bodies [][]byte
		var keys []string
		for _, op := range g {
			bodies = append(bodies, op.bodies...)
			keys = append(keys, op.keys...)
		}
		q.Queue(appendSQL, g[0].runID, bodies, keys)
	}
	br := s.pool.SendBatch(ctx, q)
	for _, g := range groups {
		var state string
		var last int64
		var at time.Time
		err := br.QueryRow().Scan(&state, &last, &at)
		if errors.Is(err, pgx.ErrNoRows) {
			for _, op := range g {
				op.err = runs.ErrNotFound
			}
			continue
		}
		if err != nil {
			_ = br.Close()
			return err
		}
		// Number the calls as appendSQL numbered their events.
		next := last + 1
		for _, op := range g {
			if state != "RUNNING" {
				op.err = fmt.Errorf("the run has ended %s: %w", state, runs.ErrEnded)
				continue
			}
			next -= int64(len(op.bodies))
		}
		for _, op := range g {
			if state == "RUNNING" {
				op.first, op.at, op.err = next, at, nil
				next += int64(len(op.bodies))
			}
		}
	}
	return br.Close()
}

// Events returns up to limit events of the run with sequence > after, in
// sequence order. An unknown run (or one of another tenant) has no events;
// an empty tenantID is runs.ErrNoTenant.
func (s *Runs) Events(ctx context.Context, tenantID, runID string, after int64, limit int) ([]*fanoutv1.RunEvent, error) {
	if tenantID == "" {
		return nil, fmt.Errorf("events of run %s: %w", runID, runs.ErrNoTenant)
	}
	out, err := retry(ctx, s.log, "runs.events", idempotent, func(ctx context.Context, _ try) ([]*fanoutv1.RunEvent, error) {
		rows, err := s.q.Events(ctx, s.pool, dbsqlc.EventsParams{RunID: runID, TenantID: tenantID, After: after,
			MaxEvents: int32(min(limit, math.MaxInt32))})
		if err != nil {
			return nil, err
		}
		out := make([]*fanoutv1.RunEvent, len(rows))
		for i, r := range rows {
			ev, err := storedEvent(runID, r.Event, r.Sequence, r.CreatedAt)
			if err != nil {
				return nil, err
			}
			out[i] = ev
		}
		return out, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read events of run %s: %w", runID, err)
	}
	return out, nil
}
