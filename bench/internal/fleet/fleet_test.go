package fleet

import (
	"errors"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRefusedRunsSaySo(t *testing.T) {
	for _, code := range []codes.Code{codes.Unauthenticated, codes.PermissionDenied} {
		err := Refused("run 10 tasks", status.Error(code, "no"), "bench")
		if !strings.Contains(err.Error(), "REFUSED") || status.Code(errors.Unwrap(err)) != code {
			t.Errorf("%v: %v", code, err)
		}
	}
	if err := Refused("run 10 tasks", status.Error(codes.Unavailable, "down"), "bench"); strings.Contains(err.Error(), "REFUSED") {
		t.Errorf("Unavailable: %v", err)
	}
}

// TestHistogramQuantile: the quantile is the upper bound of the bucket
// that holds its rank, over two scrapes' difference.
func TestHistogramQuantile(t *testing.T) {
	inf := math.Inf(1)
	before := Histogram{Bounds: []float64{0.01, 0.1, 1, inf}, Counts: []float64{5, 5, 5, 5}}
	after := Histogram{Bounds: []float64{0.01, 0.1, 1, inf}, Counts: []float64{55, 95, 104, 105}, Sum: 9}
	d := after.Minus(before)
	if d.Count() != 100 {
		t.Fatalf("count %v, want 100", d.Count())
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 0.01}, {0.9, 0.1}, {0.99, 1}, {1, inf}} {
		if got := d.Quantile(c.q); got != c.want {
			t.Errorf("q%v = %v, want %v", c.q, got, c.want)
		}
	}
	if !math.IsNaN((Histogram{}).Quantile(0.5)) {
		t.Error("an empty histogram's quantile is not NaN")
	}
	if sum := before.Add(before); sum.Count() != 10 {
		t.Errorf("Add: count %v, want 10", sum.Count())
	}
}

// TestLogLineAfterTheRuntimesOutput: a server's "worker serving" line that
// the runtime's gctrace output started on the same stderr line (as in a
// clean-clone .ci/run: `gc {"time":…,"msg":"worker serving",…}`) is still
// read, or the harness waits a minute and fails the scenario.
func TestLogLineAfterTheRuntimesOutput(t *testing.T) {
	for _, line := range []string{
		`{"time":"t","level":"INFO","msg":"worker serving","addr":"127.0.0.1:42973"}`,
		`gc {"time":"t","level":"INFO","msg":"worker serving","addr":"127.0.0.1:42973"}`,
	} {
		if msg, addr, ok := logLine(line); !ok || msg != "worker serving" || addr != "127.0.0.1:42973" {
			t.Errorf("%q: %q %q %v, want the worker serving on 127.0.0.1:42973", line, msg, addr, ok)
		}
	}
	if _, _, ok := logLine("gc 1 @0.034s 2%: 0.76+2.1+0.013 ms clock"); ok {
		t.Error("a gctrace line read as a log line")
	}
}
