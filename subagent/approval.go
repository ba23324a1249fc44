package subagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fanout/fanout/internal/redact"
	"github.com/fanout/fanout/runs"
)

// DefaultApprovalPoll is how often a task waiting for an approval reads
// its call's state (Loop.ApprovalPoll); after failed reads it waits longer,
// up to maxApprovalPoll.
const (
	DefaultApprovalPoll = 500 * time.Millisecond
	maxApprovalPoll     = 5 * time.Second
)

// pending reports whether w waits for a decision or was approved and not
// sent: a task that meets it again waits for it (or sends it), never asks
// again.
func pending(w runs.Write) bool {
	return w.State == runs.WriteAwaitingApproval || w.State == runs.WriteApproved
}

// awaitApproval waits until write w (recorded awaiting_approval or
// approved, by this attempt or an earlier one) is decided. Approved, it
// moves the call to issued for this attempt (the database refuses that
// without a recorded approval) and returns ok: send it. Otherwise it
// returns the call's outcome: denied (by a person, expired or the run's
// end) is the call's failure, told to the model. While it waits the task
// holds no model reservation and no tool slot; its own deadline and the
// run's still count, and ctx's end ends the wait (the call stays pending:
// a re-dispatched attempt takes it up, the run's end denies it).
func (r *taskAttempt) awaitApproval(ctx context.Context, tool Tool, w runs.Write) (o toolOutcome, ok bool) {
	if r.task.OnApproval != nil {
		r.task.OnApproval(w)
	}
	m := metrics()
	set := toolMetricAttrs(tool)
	attrs := metric.WithAttributeSet(set)
	m.approvalsPending.Add(ctx, 1, attrs)
	started := time.Now()
	outcome := "ended"
	defer func() {
		bg := context.WithoutCancel(ctx)
		m.approvalsPending.Add(bg, -1, attrs)
		m.approvalWait.Record(bg, time.Since(started).Seconds(), metric.WithAttributeSet(
			attribute.NewSet(append(set.ToSlice(), attribute.String("fanout.approval.outcome", outcome))...)))
	}()
	poll := r.ApprovalPoll
	if poll <= 0 {
		poll = DefaultApprovalPoll
	}
	// Sent under this attempt: the current attempt's account and secret,
	// whatever attempt asked.
	w.Account, w.Attempt = int64(r.task.Account), int64(r.task.Attempt)
	t := time.NewTimer(0)
	defer t.Stop()
	failures := 0 // database calls failed in a row: polled less often
	retry := func(what string, err error) {
		if ctx.Err() == nil {
			r.Logger.WarnContext(ctx, what, "key", w.Key, "err", err)
		}
		failures++
		t.Reset(min(poll<<min(failures, 4), maxApprovalPoll))
	}
	for {
		select {
		case <-ctx.Done():
			o.notRun = fmt.Sprintf("not run: the task ended (%v) while the write waited for approval", context.Cause(ctx))
			return o, false
		case <-t.C:
		}
		st, err := r.Writes.WriteStatus(ctx, w.Key, r.task.AttemptSecret)
		if errors.Is(err, runs.ErrWriteNotFound) {
			// Recorded awaiting approval, and now the database has no
			// record of it: it lost the commit (a failover to a standby
			// that lacked it). No decision can come; never send it.
			outcome = "lost"
			r.Logger.ErrorContext(ctx, "a write waiting for approval is gone from the database; not sent", "key", w.Key)
			o.err = errors.New("not sent: the database no longer has its record (lost in a database failover?); no approval of it can be read")
			return o, false
		}
		if err != nil {
			retry("read the state of a write waiting for approval", err)
			continue
		}
		switch st.State {
		case runs.WriteAwaitingApproval:
			if st.Expired { // the database's clock says so
				if _, err := r.Writes.ExpireWrite(ctx, w.Key, r.task.AttemptSecret); err != nil {
					retry("deny an expired approval", err)
				} else {
					failures = 0
					t.Reset(0)
				}
				continue
			}
		case runs.WriteApproved, runs.WriteIssued:
			sent, state, err := r.Writes.SendWrite(ctx, w, r.task.AttemptSecret)
			switch {
			case errors.Is(err, runs.ErrAttemptSuperseded):
				o.notRun = notRunSuperseded
				return o, false
			case err != nil:
				retry("record an approved write as sent", err)
				continue
			case sent:
				outcome = "approved"
				return o, true
			case state == runs.WriteIssued: // sent by another attempt, never heard back
				w.State = state
				r.remember(w)
				return replayed(w), false
			default: // decided otherwise meanwhile: read it again
				t.Reset(0)
				continue
			}
		case runs.WriteDenied:
			outcome = "denied"
			if st.Error == runs.DeniedExpired {
				outcome = "expired"
			}
			w.State, w.Error = runs.WriteDenied, st.Error
			r.remember(w)
			o.err = errors.New(st.Error)
			return o, false
		default: // done, failed, unknown, not_sent: another attempt sent it
			w.State, w.Error = st.State, st.Error
			r.remember(w)
			return replayed(w), false
		}
		failures = 0
		t.Reset(poll)
	}
}

// preview is what an approver sees of a call's arguments: its JSON
// redacted (internal/redact's rule, as everywhere a call is shown), cut at
// runs.MaxPreviewBytes (at a character boundary, marked). Arguments that
// are not JSON are shown as their length only.
func preview(args json.RawMessage) string {
	d := json.NewDecoder(bytes.NewReader(args))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return fmt.Sprintf("(%d bytes of arguments that are not JSON)", len(args))
	}
	b, err := json.Marshal(redact.JSON(v))
	if err != nil {
		return fmt.Sprintf("(%d bytes of arguments)", len(args))
	}
	s := string(b)
	if len(s) <= runs.MaxPreviewBytes {
		return s
	}
	const mark = " …[cut]"
	cut := runs.MaxPreviewBytes - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
