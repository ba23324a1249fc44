package store_test

import (
	"testing"
	"time"

	"github.com/fanout/fanout/store"
)

// TestNotifierReconnectsAndSaysSo: the process's one LISTEN connection is
// killed; the Notifier connects again (backoff 10 ms), tells every
// subscriber it is back (so each polls for what it missed), and hands a
// notification sent after that to the subscribers of its channel only.
func TestNotifierReconnectsAndSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.notifier(t, store.NotifierConfig{MinBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	connected := make(chan struct{}, 4)
	revoked := make(chan string, 4)
	quotas := make(chan string, 4)
	defer n.Subscribe(store.KeyRevokedChannel, store.Handler{
		Connected: func() { connected <- struct{}{} },
		Notify:    func(p string) { revoked <- p },
	})()
	defer n.Subscribe(store.TenantQuotasChannel, store.Handler{Notify: func(p string) { quotas <- p }})()
	wait := func(what string) {
		t.Helper()
		select {
		case <-connected:
		case <-time.After(10 * time.Second):
			t.Fatalf("the notifier did not say it was %s within 10s", what)
		}
	}
	wait("listening")
	var killed bool
	if err := b.pool.QueryRow(b.ctx, `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false)
		FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`,
		store.ListenerApplicationName).Scan(&killed); err != nil || !killed {
		t.Fatalf("kill the listening connection: %v, %v", killed, err)
	}
	wait("listening again")
	if _, err := b.pool.Exec(b.ctx, `SELECT pg_notify($1, 'fk_x')`, store.KeyRevokedChannel); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-revoked:
		if got != "fk_x" {
			t.Errorf("revocation payload %q; want fk_x", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no revocation heard after the reconnect")
	}
	select {
	case got := <-quotas:
		t.Errorf("a subscriber of %s heard %q from %s", store.TenantQuotasChannel, got, store.KeyRevokedChannel)
	default:
	}
}
