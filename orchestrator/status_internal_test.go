package orchestrator

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/budget"
)

// TestADatabaseOutageIsUnavailable: an error the store gave up retrying
// (budget.ErrUnavailable) answers UNAVAILABLE, which clients retry, not
// INTERNAL; and the answer does not repeat the error, which names the
// database's host and login.
func TestADatabaseOutageIsUnavailable(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	err := fmt.Errorf("read the head of run r1: %w", fmt.Errorf("%w: %w", budget.ErrUnavailable,
		fmt.Errorf("failed to connect to `user=fanout_app database=fanout`: 10.0.0.7:5432: connection refused")))
	st := status.Convert(s.toStatus(context.Background(), err))
	if st.Code() != codes.Unavailable {
		t.Errorf("a database outage answers %s %q, want UNAVAILABLE", st.Code(), st.Message())
	}
	if strings.Contains(st.Message(), "10.0.0.7") || strings.Contains(st.Message(), "fanout_app") {
		t.Errorf("the answer %q names the database", st.Message())
	}
}
