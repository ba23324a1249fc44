package subagent_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// gatewayPage is what nginx answers when the upstream is gone.
const gatewayPage = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n" +
	"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"

// firstThen answers the first request with first and every later one like
// a subagent that answers at once: the final answer, or compressed facts
// when asked for structured output.
func firstThen(first llmtest.Reply) func(llmtest.Request) llmtest.Reply {
	return func(r llmtest.Request) llmtest.Reply {
		switch {
		case r.N == 1:
			return first
		case structured(r):
			return llmtest.Reply{Text: compressedFacts}
		default:
			return llmtest.Reply{Text: localFacts}
		}
	}
}

// TestLoopRetriesMaybeBilledCallUnderNewReservation answers the first call
// with a 5xx that is not in the provider's error shape: the provider may
// have run and billed it. The task still succeeds: that attempt is settled
// at its whole reservation, flagged estimated, and the call is made again
// under a new reservation, settled with its real usage. It is one
// iteration.
func TestLoopRetriesMaybeBilledCallUnderNewReservation(t *testing.T) {
	t.Parallel()
	for _, first := range []struct {
		name  string
		reply llmtest.Reply
	}{
		{"json error string", llmtest.Reply{Status: http.StatusInternalServerError,
			Raw: `{"error":"TypeError","message":"Cannot read properties of undefined (reading 'choices')"}`}},
		{"html gateway page", llmtest.Reply{Status: http.StatusBadGateway, Raw: gatewayPage, ContentType: "text/html"}},
	} {
		for _, k := range providerKinds {
			t.Run(first.name+"/"+k.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
				srv, model := newProviderModel(t, k.provider, k.stream, firstThen(first.reply))

				sum := newLoop(b, model).Run(t.Context(), newTask(b, "a"))

				if sum.Status != subagent.StatusSucceeded || sum.Iterations != 1 {
					t.Fatalf("status %s after %d iterations (err %v, failed %q), want SUCCEEDED after 1",
						sum.Status, sum.Iterations, sum.Err, sum.Failed)
				}
				res := b.reservations(t)
				if len(res) != 3 {
					t.Fatalf("reservations %+v, want the billed attempt's, its retry's and the compression's", res)
				}
				if r := res[0]; r.State != "settled" || !r.Estimated || r.Actual == nil || *r.Actual != r.Amount ||
					r.Spent != r.Amount || !strings.HasSuffix(r.Key, "/i1") {
					t.Errorf("first reservation %+v: want i1 settled estimated at its whole amount", r)
				}
				if r := res[1]; r.State != "settled" || r.Estimated || r.Actual == nil || *r.Actual <= 0 ||
					!strings.HasSuffix(r.Key, "/i1r1") {
					t.Errorf("second reservation %+v: want i1r1 settled with the real usage", r)
				}
				if r := res[2]; r.State != "settled" || r.Estimated || !strings.HasSuffix(r.Key, "/compress") {
					t.Errorf("third reservation %+v: want the compression call's, settled with its usage", r)
				}
				reported := srv.Stats().Tokens
				if *res[1].Actual+*res[2].Actual != reported {
					t.Errorf("settled %d + %d, the provider reported %d", *res[1].Actual, *res[2].Actual, reported)
				}
				if spent := b.account(t, "a").Spent; spent != res[0].Amount+reported || sum.TokensSpent != spent {
					t.Errorf("task account spent %d, summary %d; want %d estimated + %d reported",
						spent, sum.TokensSpent, res[0].Amount, reported)
				}
				if n := len(srv.Requests()); n != 3 {
					t.Errorf("%d requests, want 3", n)
				}
				if !hasNote(sum, "may have been billed") {
					t.Errorf("failed %q, want a note on the attempt that may have been billed", sum.Failed)
				}
				b.checkLedger(t)
			})
		}
	}
}

// TestLoopProviderErrorRetriedInsideReservation answers the first call
// with a 503 in the provider's own error shape: it consumed nothing, so it
// is retried inside the same reservation.
func TestLoopProviderErrorRetriedInsideReservation(t *testing.T) {
	t.Parallel()
	for _, k := range providerKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
			srv, model := newProviderModel(t, k.provider, k.stream, firstThen(llmtest.Reply{Status: http.StatusServiceUnavailable}))

			sum := newLoop(b, model).Run(t.Context(), newTask(b, "a"))

			if sum.Status != subagent.StatusSucceeded || sum.Iterations != 1 || len(sum.Failed) != 0 {
				t.Fatalf("status %s after %d iterations (err %v, failed %q), want SUCCEEDED after 1, nothing failed",
					sum.Status, sum.Iterations, sum.Err, sum.Failed)
			}
			res := b.reservations(t)
			if len(res) != 2 || !strings.HasSuffix(res[0].Key, "/i1") || !strings.HasSuffix(res[1].Key, "/compress") {
				t.Fatalf("reservations %+v, want one for the iteration (retried inside it) and the compression's", res)
			}
			if n, errs := len(srv.Requests()), srv.Stats().Errors; n != 3 || errs != 1 {
				t.Errorf("%d requests, %d errors; want 3 and 1", n, errs)
			}
			checkPaid(t, b, srv, sum)
		})
	}
}

// TestLoopBilledRetriesAreBounded answers every call with a gateway's 502:
// each is a new paid call under its own reservation, at most BilledRetry's
// MaxAttempts, and then the task fails with the provider's error.
func TestLoopBilledRetriesAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	srv, model := newProviderModel(t, llmtest.OpenAI, false, func(llmtest.Request) llmtest.Reply {
		return llmtest.Reply{Status: http.StatusBadGateway, Raw: gatewayPage, ContentType: "text/html"}
	})
	loop := newLoop(b, model)
	loop.BilledRetry = llm.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond} // 3 calls by default

	sum := loop.Run(t.Context(), newTask(b, "a"))

	var se *llm.StatusError
	if sum.Status != subagent.StatusFailed || !errors.Is(sum.Err, llm.ErrMaybeBilled) || !errors.Is(sum.Err, llm.ErrRetriesExhausted) ||
		!errors.As(sum.Err, &se) || se.StatusCode != http.StatusBadGateway || !strings.Contains(sum.Err.Error(), "502 Bad Gateway") {
		t.Fatalf("status %s, err %v; want FAILED with the 502 after the retries ran out", sum.Status, sum.Err)
	}
	if sum.Iterations != 1 {
		t.Errorf("%d iterations, want 1: retries are calls, not iterations", sum.Iterations)
	}
	res := b.reservations(t)
	wantKeys := []string{"/i1", "/i1r1", "/i1r2"}
	if len(res) != len(wantKeys) || len(srv.Requests()) != len(wantKeys) {
		t.Fatalf("reservations %+v after %d requests, want %d of each", res, len(srv.Requests()), len(wantKeys))
	}
	var total int64
	for i, r := range res {
		if r.State != "settled" || !r.Estimated || r.Spent != r.Amount || !strings.HasSuffix(r.Key, wantKeys[i]) {
			t.Errorf("reservation %+v: want %s settled estimated at its whole amount", r, wantKeys[i])
		}
		total += r.Spent
	}
	if spent := b.account(t, "a").Spent; spent != total || sum.TokensSpent != total {
		t.Errorf("task account spent %d, summary %d; want every attempt's whole reservation, %d", spent, sum.TokensSpent, total)
	}
	b.checkLedger(t)
}

// TestLoopBilledRetryWaitsRetryAfter: a Retry-After is a floor of the wait
// before the new call, and a retry whose wait would pass the task's
// deadline is not made.
func TestLoopBilledRetryWaitsRetryAfter(t *testing.T) {
	t.Parallel()
	t.Run("floor", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
		var mu sync.Mutex
		var arrivals []time.Time
		next := firstThen(llmtest.Reply{Status: http.StatusServiceUnavailable, Raw: "upstream connect error", ContentType: "text/plain", RetryAfter: "1"})
		srv, model := newProviderModel(t, llmtest.OpenAI, false, func(r llmtest.Request) llmtest.Reply {
			mu.Lock()
			arrivals = append(arrivals, time.Now())
			mu.Unlock()
			return next(r)
		})
		loop := newLoop(b, model)
		loop.BilledRetry = llm.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}

		sum := loop.Run(t.Context(), newTask(b, "a"))

		if sum.Status != subagent.StatusSucceeded {
			t.Fatalf("status %s, err %v", sum.Status, sum.Err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(arrivals) != 3 || len(srv.Requests()) != 3 {
			t.Fatalf("%d requests, want the failed call, its retry and the compression", len(arrivals))
		}
		if gap := arrivals[1].Sub(arrivals[0]); gap < time.Second {
			t.Errorf("retried after %s, before the Retry-After of 1s", gap)
		}
		b.checkLedger(t)
	})
	t.Run("past the deadline", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
		srv, model := newProviderModel(t, llmtest.Anthropic, false, firstThen(llmtest.Reply{
			Status: http.StatusInternalServerError, Raw: `{"error":"TypeError"}`, RetryAfter: "30"}))
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		start := time.Now()

		sum := newLoop(b, model).Run(ctx, newTask(b, "a"))

		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("gave up after %s, want at once", d)
		}
		if sum.Status != subagent.StatusFailed || !errors.Is(sum.Err, llm.ErrRetriesExhausted) || !strings.Contains(sum.Err.Error(), "deadline") {
			t.Errorf("status %s, err %v; want FAILED: retries exhausted by the deadline", sum.Status, sum.Err)
		}
		if res := b.reservations(t); len(res) != 1 || !res[0].Estimated || len(srv.Requests()) != 1 {
			t.Errorf("reservations %+v after %d requests, want the one call, settled estimated", res, len(srv.Requests()))
		}
		b.checkLedger(t)
	})
}

// TestLoopBilledRetryStopsWhenTheRunEnds exhausts the run while the loop
// waits to retry a call that may have been billed: no new reservation and
// no new call are made.
func TestLoopBilledRetryStopsWhenTheRunEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	srv, model := newProviderModel(t, llmtest.OpenAI, true, firstThen(llmtest.Reply{
		Status: http.StatusBadGateway, Raw: gatewayPage, ContentType: "text/html", RetryAfter: "60"}))
	task := newTask(b, "a")
	watch := newWatch()
	task.Watch = watch

	wait := goRun(t, t.Context(), newLoop(b, model), task)
	poll(t, "the first call to be settled", func() bool {
		res := b.reservations(t)
		return len(res) == 1 && res[0].State == "settled"
	})
	watch.fire(budget.RunSignal{RunID: b.runID, State: budget.StateExhausted})
	sum := wait("the loop stopping while it waited to retry")

	if sum.Status != subagent.StatusBudgetExhausted {
		t.Errorf("status %s (err %v), want BUDGET_EXHAUSTED", sum.Status, sum.Err)
	}
	if res := b.reservations(t); len(res) != 1 || len(srv.Requests()) != 1 {
		t.Errorf("reservations %+v after %d requests; want only the first call's", res, len(srv.Requests()))
	}
	b.checkLedger(t)
}

// TestLoopRetriesMaybeBilledCompressionUnderNewReservation answers the
// first compression call with a 5xx that is not in the provider's error
// shape. The compression call is paid like an iteration's: that attempt is
// settled (not voided) at its whole reservation, flagged estimated, and the
// call is made again under a new reservation, settled with its real usage,
// whose facts are the summary's.
func TestLoopRetriesMaybeBilledCompressionUnderNewReservation(t *testing.T) {
	t.Parallel()
	for _, first := range []struct {
		name  string
		reply llmtest.Reply
	}{
		{"json error string", llmtest.Reply{Status: http.StatusInternalServerError,
			Raw: `{"error":"TypeError","message":"Cannot read properties of undefined (reading 'choices')"}`}},
		{"html gateway page", llmtest.Reply{Status: http.StatusBadGateway, Raw: gatewayPage, ContentType: "text/html"}},
	} {
		for _, k := range providerKinds {
			t.Run(first.name+"/"+k.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
				var compressions atomic.Int32
				srv, model := newProviderModel(t, k.provider, k.stream, func(r llmtest.Request) llmtest.Reply {
					switch {
					case !structured(r):
						return llmtest.Reply{Text: localFacts}
					case compressions.Add(1) == 1:
						return first.reply
					default:
						return llmtest.Reply{Text: compressedFacts}
					}
				})
				loop := newLoop(b, model)
				loop.CompressMaxTokens = 300

				sum := loop.Run(t.Context(), newTask(b, "a"))

				if sum.Status != subagent.StatusSucceeded || sum.Iterations != 1 {
					t.Fatalf("status %s after %d iterations (err %v, failed %q), want SUCCEEDED after 1",
						sum.Status, sum.Iterations, sum.Err, sum.Failed)
				}
				if len(sum.Facts) != 2 || sum.Facts[0].Text != "compressed fact" {
					t.Errorf("facts %+v, want the retried compression call's", sum.Facts)
				}
				res := b.reservations(t)
				if len(res) != 3 {
					t.Fatalf("reservations %+v, want the iteration's, the billed compression's and its retry's", res)
				}
				if r := res[0]; r.State != "settled" || r.Estimated || !strings.HasSuffix(r.Key, "/i1") {
					t.Errorf("first reservation %+v: want i1 settled with its usage", r)
				}
				if r := res[1]; r.State != "settled" || !r.Estimated || r.Actual == nil || *r.Actual != r.Amount ||
					r.Spent != r.Amount || !strings.HasSuffix(r.Key, "/compress") {
					t.Errorf("second reservation %+v: want compress settled estimated at its whole amount", r)
				}
				if r := res[2]; r.State != "settled" || r.Estimated || r.Actual == nil || *r.Actual <= 0 ||
					!strings.HasSuffix(r.Key, "/compressr1") {
					t.Errorf("third reservation %+v: want compressr1 settled with the real usage", r)
				}
				reported := srv.Stats().Tokens
				if *res[0].Actual+*res[2].Actual != reported {
					t.Errorf("settled %d + %d, the provider reported %d", *res[0].Actual, *res[2].Actual, reported)
				}
				if spent := b.account(t, "a").Spent; spent != res[1].Amount+reported || sum.TokensSpent != spent {
					t.Errorf("task account spent %d, summary %d; want %d estimated + %d reported",
						spent, sum.TokensSpent, res[1].Amount, reported)
				}
				reqs := srv.Requests()
				if len(reqs) != 3 || !structured(reqs[1]) || !structured(reqs[2]) || reqs[2].MaxTokens != 300 {
					t.Errorf("%d requests, want the iteration's and two compression calls of 300 output tokens", len(reqs))
				}
				if !hasNote(sum, "may have been billed") {
					t.Errorf("failed %q, want a note on the compression call that may have been billed", sum.Failed)
				}
				b.checkLedger(t)
			})
		}
	}
}

// TestLoopBilledCompressionRetriesAreBounded answers every compression call
// with a gateway's 502: each is settled at its whole reservation under its
// own key, at most BilledRetry's MaxAttempts, and then the final answer's
// facts are kept with a note.
func TestLoopBilledCompressionRetriesAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	srv, model := newProviderModel(t, llmtest.Anthropic, false, func(r llmtest.Request) llmtest.Reply {
		if structured(r) {
			return llmtest.Reply{Status: http.StatusBadGateway, Raw: gatewayPage, ContentType: "text/html"}
		}
		return llmtest.Reply{Text: localFacts}
	})
	loop := newLoop(b, model)
	loop.BilledRetry = llm.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond} // 3 calls by default

	sum := loop.Run(t.Context(), newTask(b, "a"))

	if sum.Status != subagent.StatusSucceeded || len(sum.Facts) != 1 || sum.Facts[0].Text != "local fact" {
		t.Fatalf("status %s (err %v), facts %+v; want SUCCEEDED with the final answer's fact", sum.Status, sum.Err, sum.Facts)
	}
	if !hasNote(sum, "compress: "+llm.ErrRetriesExhausted.Error()) || !hasNote(sum, "502 Bad Gateway") {
		t.Errorf("failed %q, want a note that the compression call's retries ran out", sum.Failed)
	}
	res := b.reservations(t)
	wantKeys := []string{"/i1", "/compress", "/compressr1", "/compressr2"}
	if len(res) != len(wantKeys) || len(srv.Requests()) != len(wantKeys) {
		t.Fatalf("reservations %+v after %d requests, want %d of each", res, len(srv.Requests()), len(wantKeys))
	}
	billed := int64(0)
	for i, r := range res {
		if !strings.HasSuffix(r.Key, wantKeys[i]) || r.State != "settled" {
			t.Errorf("reservation %+v: want %s settled", r, wantKeys[i])
		}
		if i > 0 {
			if !r.Estimated || r.Spent != r.Amount {
				t.Errorf("reservation %+v: want it settled estimated at its whole amount", r)
			}
			billed += r.Spent
		}
	}
	if spent := b.account(t, "a").Spent; spent != srv.Stats().Tokens+billed || sum.TokensSpent != spent {
		t.Errorf("task account spent %d, summary %d; want %d reported + %d estimated", spent, sum.TokensSpent, srv.Stats().Tokens, billed)
	}
	b.checkLedger(t)
}

// TestLoopRefusedCallIsSettledAtZero answers every call with a refusal in
// the provider's own error shape (429s past the retries inside the
// reservation, a 400): the provider ran nothing, so the reservation is
// settled at 0, not estimated, and the task spent nothing
// (docs/ledger.md#reservation-states).
func TestLoopRefusedCallIsSettledAtZero(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusTooManyRequests, http.StatusBadRequest} {
		for _, k := range providerKinds {
			t.Run(http.StatusText(status)+"/"+k.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
				srv, model := newProviderModel(t, k.provider, k.stream, func(llmtest.Request) llmtest.Reply {
					return llmtest.Reply{Status: status, RetryAfter: "0"}
				})

				sum := newLoop(b, model).Run(t.Context(), newTask(b, "a"))

				var se *llm.StatusError
				if sum.Status != subagent.StatusFailed || !errors.As(sum.Err, &se) || se.StatusCode != status {
					t.Fatalf("status %s, err %v; want FAILED with the %d", sum.Status, sum.Err, status)
				}
				res := b.reservations(t)
				if len(res) != 1 || len(srv.Requests()) == 0 {
					t.Fatalf("reservations %+v after %d requests, want one, for the refused call", res, len(srv.Requests()))
				}
				if r := res[0]; r.State != "settled" || r.Estimated || r.Actual == nil || *r.Actual != 0 || r.Spent != 0 {
					t.Errorf("reservation %+v: want settled at 0, not estimated (a refusal is proof nothing ran)", r)
				}
				if spent := b.account(t, "a").Spent; spent != 0 || sum.TokensSpent != 0 {
					t.Errorf("task account spent %d, summary %d; want 0", spent, sum.TokensSpent)
				}
				b.checkLedger(t)
			})
		}
	}
}

// TestProgressSaysWhatTheIterationWaited: an iteration whose call waited
// out a 429's retry-after reports that wait (Progress.Waited, sent as
// SubagentIteration.waited), and one served at once reports none: the
// orchestrator sizes concurrency from call time less it
// (docs/operations.md#concurrency-from-the-rate-limits).
func TestProgressSaysWhatTheIterationWaited(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	_, model := newProviderModel(t, llmtest.OpenAI, false, firstThen(llmtest.Reply{Status: http.StatusTooManyRequests, RetryAfter: "0.3"}))
	loop := newLoop(b, model)
	var progress []subagent.Progress
	loop.ProgressFunc = func(p subagent.Progress) { progress = append(progress, p) }

	sum := loop.Run(t.Context(), newTask(b, "a"))

	if sum.Status != subagent.StatusSucceeded || len(progress) == 0 {
		t.Fatalf("status %s, %d progress reports (err %v)", sum.Status, len(progress), sum.Err)
	}
	if w := progress[0].Waited; w < 300*time.Millisecond {
		t.Errorf("iteration 1 waited out a retry-after of 0.3s but reported %s", w)
	}
	for _, p := range progress[1:] {
		if p.Waited != 0 {
			t.Errorf("iteration %d was served at once but reported %s waited", p.Iteration, p.Waited)
		}
	}
}
