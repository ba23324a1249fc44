package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fanout/fanout/budget"
)

// The store's one retry mechanism (docs/operations.md, "Database restarts
// and failover"): every call of the ledger, the run store and the rate
// limiter goes through retry, which tries it again after a transient
// database error — a restart, a failover, a cut connection, a
// serialization failure or a deadlock — with jittered exponential backoff
// bounded by the caller's deadline, and only where a second try cannot do
// the work twice.

// Retry bounds. The backoff doubles from retryFirstBackoff to
// retryMaxBackoff, each wait drawn from its upper half; a call whose
// context has no deadline stops retrying retryMaxElapsed after its first
// try.
const (
	retryFirstBackoff = 20 * time.Millisecond
	retryMaxBackoff   = time.Second
	retryMaxElapsed   = 30 * time.Second
)

// safety says when a call may be tried again.
type safety int

const (
	// unsentOnly: a second run could do the work twice, so the call is
	// retried only when the error proves that the first did not happen
	// (nothing reached the server, or the server rolled it back).
	unsentOnly safety = iota
	// idempotent: a second run of the call after a first that committed
	// does nothing more (a key, a state the call moves from, or a read),
	// or nothing harmful (said where a call claims it), so it is retried
	// after any transient error, even one that leaves unknown whether the
	// first try committed. A call that must tell its
	// own committed first try from someone else's work reads try.ambiguous
	// and settles it by re-reading by its key.
	idempotent
)

// errClass is what a database error says about the call that got it.
type errClass int

const (
	// permanent: not a transient failure (a refusal, a bug, the caller's
	// own context ending); trying again would fail again or is not wanted.
	permanent errClass = iota
	// notRun: transient, and the call's work did not happen: nothing was
	// sent, the connection was refused, or the server rolled back.
	notRun
	// ambiguous: transient, but the call's work may have committed (the
	// connection was lost after the statement was sent, or the server was
	// shut down under it).
	ambiguous
)

// classify tells whether err is a transient database error and whether the
// work that got it may have committed, and names it for metrics and logs
// by its SQLSTATE ("connection" for a connection-level error without one).
func classify(err error) (errClass, string) {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return permanent, ""
	}
	var connect *pgconn.ConnectError
	connecting := errors.As(err, &connect)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case code == "40001", code == "40P01":
			// serialization_failure, deadlock_detected: the server rolled
			// the transaction back.
			return notRun, code
		case code == "57P03":
			// cannot_connect_now: the server is starting or stopping.
			return notRun, code
		case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02":
			// connection_exception, admin_shutdown, crash_shutdown.
			if connecting || pgconn.SafeToRetry(err) {
				return notRun, code
			}
			return ambiguous, code
		}
		return permanent, pgErr.Code // a refusal (auth, a constraint, ...) while connecting or running
	}
	if connecting {
		return notRun, "connection" // refused, reset or unreachable before anything was sent
	}
	if errors.Is(err, pgconn.ErrConnClosed) {
		// pgx reports "conn closed" as safe to retry, but it also reports
		// it for a statement whose reply was lost (a read of the reply
		// failed and closed the connection; seen at COMMIT): ambiguous.
		return ambiguous, "connection"
	}
	if pgconn.SafeToRetry(err) {
		return notRun, "connection" // nothing was sent
	}
	var netErr net.Error
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.As(err, &netErr) {
		return ambiguous, "connection"
	}
	return permanent, ""
}

// try tells a retried call about the tries before it.
type try struct {
	n int // 0 for the first try
	// ambiguous: an earlier try failed in a way that leaves unknown
	// whether it committed; a call that cannot tell its own committed work
	// from another's re-reads by its key.
	ambiguous bool
}

// retry runs f until it succeeds, fails with an error that is not
// transient, fails with one that s does not allow retrying, or the next
// try would start after ctx's deadline (or retryMaxElapsed after the first,
// if ctx has none). It returns f's last result. op names the call in the
// retry metric and log line (fanout.db.retries; no data, only op and the
// SQLSTATE).
func retry[T any](ctx context.Context, log *slog.Logger, op string, s safety, f func(context.Context, try) (T, error)) (T, error) {
	start := time.Now()
	limit, hasDeadline := ctx.Deadline()
	if !hasDeadline {
		limit = start.Add(retryMaxElapsed)
	}
	backoff := retryFirstBackoff
	var t try
	for {
		out, err := f(ctx, t)
		class, code := classify(err)
		if class == permanent {
			return out, err
		}
		if class == ambiguous && s != idempotent {
			return out, unavailable(err)
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if time.Now().Add(wait).After(limit) {
			return out, unavailable(err)
		}
		countRetry(ctx, op, code)
		if log == nil {
			log = slog.Default()
		}
		log.WarnContext(ctx, "database error; retrying", "op", op, "sqlstate", code, "try", t.n+1,
			"backoff", wait, "ambiguous", class == ambiguous)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return out, unavailable(err)
		case <-timer.C:
		}
		t.n++
		t.ambiguous = t.ambiguous || class == ambiguous
		backoff = min(2*backoff, retryMaxBackoff)
	}
}

// unavailable marks a transient error that retry gave up on as
// budget.ErrUnavailable, keeping it in the chain for the callers that
// read its SQLSTATE: the API answers UNAVAILABLE, which a client retries,
// not INTERNAL.
func unavailable(err error) error {
	return fmt.Errorf("%w: %w", budget.ErrUnavailable, err)
}

// retried runs f under retry for a call that returns only an error.
func retried(ctx context.Context, log *slog.Logger, op string, s safety, f func(context.Context, try) error) error {
	_, err := retry(ctx, log, op, s, func(ctx context.Context, t try) (struct{}, error) { return struct{}{}, f(ctx, t) })
	return err
}
