package auth_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fanout/fanout/auth"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
)

// revocationPromise is the bound docs/api.md states (§ Credentials): "A
// revoked key stops on every replica within half a second". It is written
// out here, not taken from auth.MaxPollInterval, so that a slower poll
// cannot move the bound with it.
const revocationPromise = 500 * time.Millisecond

// revocationMargin is what the test allows above the promise for
// scheduling on a loaded 2-core machine: the poll's query of DeadKeys, the
// cancel reaching the stream's goroutine and the client, the test's own
// goroutines and its 5 ms polling of the unary call. The poll runs every
// auth.MaxPollInterval (400 ms), and the test revokes right after a poll,
// so a replica left to its poll takes nearly a whole interval: measured
// 400-450 ms here. 100 ms above the promise still fails a poll of 600 ms.
const revocationMargin = 100 * time.Millisecond

// notifyBound is the bound of the NOTIFY path: a NOTIFY round trip
// (milliseconds) plus 250 ms for scheduling. It is below the poll's
// interval: the test revokes right after a poll, so a replica that missed
// or ignored the NOTIFY takes nearly the whole 400 ms, which is above it.
const notifyBound = 250 * time.Millisecond

// TestRevokedKeyStopsWithinHalfASecond measures docs/api.md's bound on
// replicas wired as node.OpenOrchestrator wires its authenticator
// (auth.NewAuthenticator with Config{Logger}: the default poll interval,
// LISTEN on), from the commit of the revocation to the moment a cached key's
// unary call is refused and to the moment a stream open on it ends
// UNAUTHENTICATED, on each of two replicas:
//
//   - notify: revoked by admin_revoke_key, whose NOTIFY the replicas hear;
//     within notifyBound;
//   - notify-lost: revoked with the NOTIFY lost (the row changed as
//     admin_revoke_key changes it, with no NOTIFY sent), so the poll alone
//     stops it; within revocationPromise + revocationMargin.
//
// Each revocation is committed right after the replica's poll (the poll is
// seen evicting a probe key revoked without a NOTIFY), the worst moment for
// the poll: a replica that relies on its poll takes nearly a whole interval.
func TestRevokedKeyStopsWithinHalfASecond(t *testing.T) {
	// Not parallel: the other tests of the package would only add load to a
	// measurement of time.
	for _, tc := range []struct {
		name   string
		notify bool
		bound  time.Duration
	}{
		{"notify", true, notifyBound},
		{"notify-lost", false, revocationPromise + revocationMargin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t)
			owner, err := store.Open(b.ctx, b.url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(owner.Close)
			// As node.OpenOrchestrator builds it: auth.Config{Logger: ...}.
			c1, _ := b.replica(t, auth.Config{})
			c2, _ := b.replica(t, auth.Config{})
			for i, c := range []fanoutv1.OrchestratorServiceClient{c1, c2} {
				r := measureRevocation(t, b, owner, c, tc.notify)
				t.Logf("replica %d: unary refused %s, stream ended %s after the commit (COMMIT took %s; the poll was at most %s before it)",
					i+1, r.unary, r.stream, r.commit, r.sincePoll)
				if r.unary > tc.bound {
					t.Errorf("replica %d: a cached key's unary call still served %s after the revocation's commit; want within %s", i+1, r.unary, tc.bound)
				}
				if r.stream > tc.bound {
					t.Errorf("replica %d: a stream on the revoked key still open %s after the revocation's commit; want within %s", i+1, r.stream, tc.bound)
				}
			}
		})
	}
}

type revocationLatency struct {
	unary, stream time.Duration // from just before COMMIT
	commit        time.Duration // COMMIT's round trip
	sincePoll     time.Duration // from the poll that evicted the probe, at most
}

// The deadlines of the waits. Each is far above the bound so that a slow
// replica's latency is measured and reported rather than cut off.
const (
	callTimeout  = 2 * time.Second // one GetRun or the stream's first message
	probeTimeout = 5 * time.Second // the poll evicting the probe: a poll of 2 s is seen in time
	stopTimeout  = 5 * time.Second // the revoked key refused, its stream ended
	callEvery    = 5 * time.Millisecond
)

// measureRevocation caches a key on the replica behind client (a unary call)
// and opens a stream on it, revokes it (with its NOTIFY when notify) in a
// transaction left open, waits for the replica's poll to evict a probe key
// revoked without a NOTIFY, then commits the key's revocation and measures
// from just before its COMMIT is sent (so the measure is never below the
// true latency) to the first refused call and to the stream's end.
func measureRevocation(t *testing.T, b *bundle, owner *store.Pool, client fanoutv1.OrchestratorServiceClient, notify bool) revocationLatency {
	t.Helper()
	probeID, probeToken := b.key(t, "acme", []string{"read"}, 0)
	id, token := b.key(t, "acme", []string{"read"}, 0)
	getRun := func(token string) error {
		ctx, cancel := context.WithTimeout(withToken(b.ctx, token), callTimeout)
		defer cancel()
		_, err := client.GetRun(ctx, &fanoutv1.GetRunRequest{})
		return err
	}
	for _, tok := range []string{probeToken, token} { // both cached now
		if err := getRun(tok); err != nil {
			t.Fatalf("GetRun with a live key: %v", err)
		}
	}
	sctx, scancel := context.WithTimeout(withToken(b.ctx, token), callTimeout+stopTimeout)
	defer scancel()
	s, err := client.WatchRun(sctx, &fanoutv1.WatchRunRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { _, err := s.Recv(); first <- err }()
	select {
	case err := <-first:
		if err != nil {
			t.Fatalf("WatchRun on a live key: %v", err)
		}
	case <-time.After(callTimeout):
		t.Fatalf("WatchRun: no first message within %s", callTimeout)
	}
	type end struct {
		err error
		at  time.Time
	}
	ended := make(chan end, 1)
	go func() { _, err := s.Recv(); ended <- end{err, time.Now()} }()

	// The key's revocation, ready to commit.
	commit := revoke(t, b, owner, id, notify)
	// Find the poll: the probe, revoked without a NOTIFY, is refused right
	// after a poll evicted it.
	// served is when the last call the probe was served in began (or its
	// revocation's commit): the poll evicted it after that.
	_, served := revoke(t, b, owner, probeID, false)()
	pollUntil(t, probeTimeout, "the poll evicting the probe key "+probeID, func() bool {
		start := time.Now()
		err := getRun(probeToken)
		if err != nil && code(err) != codes.Unauthenticated {
			t.Fatalf("GetRun with the probe key: %v; want OK or UNAUTHENTICATED", err)
		}
		if err == nil {
			served = start
		}
		return err != nil
	})

	// Commit the key's revocation now, right after the poll.
	beforeCommit, committed := commit()
	var r revocationLatency
	r.commit, r.sincePoll = committed.Sub(beforeCommit), beforeCommit.Sub(served)
	pollUntil(t, stopTimeout, "the revoked key "+id+" refused", func() bool {
		err := getRun(token)
		if err != nil && code(err) != codes.Unauthenticated {
			t.Fatalf("GetRun with the revoked key: %v; want OK until the replica stops it, then UNAUTHENTICATED", err)
		}
		r.unary = time.Since(beforeCommit)
		return err != nil
	})
	var e end
	select {
	case e = <-ended:
	case <-time.After(stopTimeout):
		t.Fatalf("a stream on the revoked key %s still open %s after the key was refused", id, stopTimeout)
	}
	r.stream = e.at.Sub(beforeCommit)
	if code(e.err) != codes.Unauthenticated || !strings.Contains(e.err.Error(), id+" was revoked") {
		t.Errorf("the stream ended with %v; want UNAUTHENTICATED naming %s", e.err, id)
	}
	return r
}

// revoke revokes key id as the owner in a transaction, left open: by
// admin_revoke_key when notify (its NOTIFY reaches every LISTENing replica
// at the commit), or by the same change of the row without a NOTIFY (a
// NOTIFY lost). Until the returned commit is called, every replica still
// reads the key live. commit returns the times just before the COMMIT was
// sent and once it returned.
func revoke(t *testing.T, b *bundle, owner *store.Pool, id string, notify bool) (commit func() (before, after time.Time)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, callTimeout+probeTimeout)
	tx, err := owner.Begin(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = tx.Rollback(context.WithoutCancel(ctx)) // a no-op after the commit
		cancel()
	})
	if notify {
		_, err = tx.Exec(ctx, `SELECT admin_revoke_key($1, $2)`, b.owner, id)
	} else {
		_, err = tx.Exec(ctx, `UPDATE api_key SET revoked_at = now(), revoked_by = $1 WHERE key_id = $2 AND revoked_at IS NULL`, b.owner, id)
	}
	if err != nil {
		t.Fatalf("revoke %s: %v", id, err)
	}
	return func() (before, after time.Time) {
		before = time.Now()
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("commit the revocation of %s: %v", id, err)
		}
		return before, time.Now()
	}
}

// pollUntil calls ok every callEvery until it is true, failing the test
// once d has passed.
func pollUntil(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(callEvery)
	defer tick.Stop()
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		<-tick.C
	}
}
