package auth_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	"github.com/fanout/fanout/auth"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// TestForgedNotificationsEndNothing (issue 23, from its review): any
// database login may NOTIFY, so a notification on store.KeyRevokedChannel
// or store.TenantQuotasChannel is only a hint to read the keys' states
// again. A worker's login notifies that a live key was revoked and that
// its tenant's quotas changed: the key's open stream stays open. Then a
// real revocation of another key (its NOTIFY sent after the forged ones,
// on the same channel) ends that key's stream, so the replica has handled
// the forged ones by then; the live key's stream must still be open a
// second after.
func TestForgedNotificationsEndNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, _ := b.replica(t, auth.Config{}) // LISTEN on, the default poll
	victim, victimToken := b.key(t, "acme", []string{"read"}, 0)
	probe, probeToken := b.key(t, "acme", []string{"read"}, 0)
	open := func(token string) <-chan error {
		s, err := c.WatchRun(withToken(b.ctx, token), &fanoutv1.WatchRunRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil { // open and authenticated
			t.Fatal(err)
		}
		ended := make(chan error, 1)
		go func() {
			_, err := s.Recv()
			ended <- err
		}()
		return ended
	}
	victimEnded, probeEnded := open(victimToken), open(probeToken)

	conn, err := pgx.Connect(b.ctx, storetest.WorkerURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx) //nolint:errcheck // test connection
	if _, err := conn.Exec(b.ctx, `SELECT pg_notify($1, $2), pg_notify($3, 'acme')`,
		store.KeyRevokedChannel, victim, store.TenantQuotasChannel); err != nil {
		t.Fatalf("a worker's login notifies: %v", err)
	}
	if _, err := b.keys.RevokeKey(b.ctx, b.owner, probe); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-probeEnded:
		if code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), probe+" was revoked") {
			t.Fatalf("the revoked key's stream ended with %v; want UNAUTHENTICATED naming %s", err, probe)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the revoked key's stream still open after 5s")
	}
	select {
	case err := <-victimEnded:
		t.Errorf("a forged notification ended the stream of live key %s: %v", victim, err)
	case <-time.After(time.Second):
	}
	if err := getRunWith(b.ctx, c, victimToken); err != nil {
		t.Errorf("the live key after the forged notifications: %v", err)
	}
}
