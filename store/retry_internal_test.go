package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fanout/fanout/budget"
)

// TestClassify: which database errors are transient, and which of those
// leave unknown whether the work committed (docs/operations.md, "Database
// restarts and failover").
func TestClassify(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// A real connect error: nothing listens on the port of a closed listener.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	_, refused := pgconn.Connect(ctx, "postgres://nobody@"+addr+"/x?sslmode=disable&connect_timeout=5")
	if refused == nil {
		t.Fatalf("connect to %s, where nothing listens, succeeded", addr)
	}
	pg := func(code string) error { return &pgconn.PgError{Severity: "FATAL", Code: code, Message: "m"} }
	for _, tc := range []struct {
		name  string
		err   error
		class errClass
		code  string
	}{
		{"nil", nil, permanent, ""},
		{"admin shutdown (pg_ctl restart -m fast)", pg("57P01"), ambiguous, "57P01"},
		{"crash shutdown", pg("57P02"), ambiguous, "57P02"},
		{"cannot connect now (starting up)", pg("57P03"), notRun, "57P03"},
		{"connection failure", pg("08006"), ambiguous, "08006"},
		{"connection exception, wrapped", fmt.Errorf("settle reservation 7: %w", pg("08000")), ambiguous, "08000"},
		{"serialization failure: rolled back", pg("40001"), notRun, "40001"},
		{"deadlock: rolled back", pg("40P01"), notRun, "40P01"},
		{"unique violation", pg("23505"), permanent, "23505"},
		{"check violation", pg("23514"), permanent, "23514"},
		{"bad password", pg("28P01"), permanent, "28P01"},
		{"connection refused while connecting", refused, notRun, "connection"},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), ambiguous, "connection"},
		{"broken pipe", fmt.Errorf("write: %w", syscall.EPIPE), ambiguous, "connection"},
		{"unexpected EOF", fmt.Errorf("receive message: %w", io.ErrUnexpectedEOF), ambiguous, "connection"},
		{"network error", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("boom")}, ambiguous, "connection"},
		{"conn closed", pgconn.ErrConnClosed, ambiguous, "connection"},
		{"the caller's deadline", context.DeadlineExceeded, permanent, ""},
		{"the caller's cancel", fmt.Errorf("q: %w", context.Canceled), permanent, ""},
		{"the store closed", errClosed, permanent, ""},
		{"anything else", errors.New("ledger: unknown outcome"), permanent, ""},
	} {
		class, code := classify(tc.err)
		if class != tc.class || code != tc.code {
			t.Errorf("%s (%v): class %d, code %q; want %d, %q", tc.name, tc.err, class, code, tc.class, tc.code)
		}
	}
}

// TestRetryPolicy: what retry tries again, and that it stops in time.
func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	transient := &pgconn.PgError{Code: "57P01"} // ambiguous
	rolledBack := &pgconn.PgError{Code: "40001"}
	count := func(s safety, errs ...error) (int, error) {
		n := 0
		_, err := retry(t.Context(), quiet, "test", s, func(context.Context, try) (int, error) {
			n++
			if n <= len(errs) {
				return 0, errs[n-1]
			}
			return n, nil
		})
		return n, err
	}
	if n, err := count(idempotent, transient, rolledBack); n != 3 || err != nil {
		t.Errorf("idempotent call after two transient errors: %d tries, %v; want 3, success", n, err)
	}
	if n, err := count(unsentOnly, transient); n != 1 || !errors.Is(err, transient) || !errors.Is(err, budget.ErrUnavailable) {
		t.Errorf("non-idempotent call after an ambiguous error: %d tries, %v; want 1, the error", n, err)
	}
	if n, err := count(unsentOnly, rolledBack); n != 2 || err != nil {
		t.Errorf("non-idempotent call after a rollback: %d tries, %v; want 2, success", n, err)
	}
	if n, err := count(idempotent, &pgconn.PgError{Code: "23505"}); n != 1 || err == nil || errors.Is(err, budget.ErrUnavailable) {
		t.Errorf("permanent error: %d tries, %v; want 1, the error", n, err)
	}

	// Bounded by the caller's deadline: a database that never comes back
	// fails the call before its deadline, after several tries.
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	var tries []try
	_, err := retry(ctx, quiet, "test", idempotent, func(context.Context, try) (int, error) {
		tries = append(tries, try{})
		return 0, transient
	})
	if !errors.Is(err, transient) || !errors.Is(err, budget.ErrUnavailable) {
		t.Errorf("retry until the deadline: %v, want the last error, marked unavailable", err)
	}
	if time.Now().After(deadline.Add(50 * time.Millisecond)) {
		t.Errorf("retry returned %v after the caller's deadline", time.Since(deadline))
	}
	if len(tries) < 3 {
		t.Errorf("%d tries in 300ms; want several (backoff starts at %v)", len(tries), retryFirstBackoff)
	}

	// Each try learns whether an earlier one may have committed.
	var seen []try
	_, _ = retry(t.Context(), quiet, "test", idempotent, func(_ context.Context, tr try) (int, error) {
		seen = append(seen, tr)
		switch tr.n {
		case 0:
			return 0, rolledBack
		case 1:
			return 0, transient
		}
		return 0, nil
	})
	if len(seen) != 3 || seen[1].ambiguous || !seen[2].ambiguous {
		t.Errorf("tries %+v: want 3, the second not ambiguous (a rollback), the third ambiguous", seen)
	}
}

// quiet is a logger for tests that retry on purpose.
var quiet = slog.New(slog.DiscardHandler)
