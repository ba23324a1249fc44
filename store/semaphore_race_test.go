package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/store/storetest"
)

// TestSemaphoreSlotIsNeverTakenTwice is the deterministic form of the race
// TestSemaphoreBoundAcrossNodes presses on (operations.md "Semaphores": two
// nodes never hold one slot): node A's acquire of the only slot of a key is
// left uncommitted, holding the slot's row; node B's acquire of the same
// key, as the node role calls it, must be refused at once (the slot is
// taken) — neither wait for A's transaction nor, once A commits, take the
// slot A holds.
func TestSemaphoreSlotIsNeverTakenTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nodeURL := storetest.NodeURL(t, b.url)
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(b.ctx, nodeURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	const acquire = `SELECT fanout.semaphore_acquire($1::bigint, $2::text, ARRAY['mcp:srv'], ARRAY[1], interval '30 seconds')`
	// The key's slot exists already (it was used before): the first
	// acquire of a new key creates its slots, and a second acquirer then
	// waits for that insert by design.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO fanout.semaphore_slot (key, slot) VALUES ('mcp:srv', 0)`); err != nil {
		t.Fatal(err)
	}
	a, bconn := connect(), connect()
	tx, err := a.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // committed below; a rollback after it is a no-op
	var refused *string
	if err := tx.QueryRow(b.ctx, acquire, int64(1), "node-a").Scan(&refused); err != nil || refused != nil {
		t.Fatalf("A's acquire of a free key: refused %v, %v; want it granted", refused, err)
	}

	type result struct {
		refused *string
		err     error
	}
	got := make(chan result, 1)
	go func() {
		var r result
		r.err = bconn.QueryRow(b.ctx, acquire, int64(2), "node-b").Scan(&r.refused)
		got <- r
	}()
	const wait = 3 * time.Second
	select {
	case r := <-got:
		if r.err != nil || r.refused == nil || *r.refused != "mcp:srv" {
			t.Errorf("B's acquire while A holds the only slot: refused %v, %v; want refused naming mcp:srv", deref(r.refused), r.err)
		}
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(wait):
		t.Errorf("B's acquire waited %v on A's uncommitted slot; want it refused at once", wait)
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if r.err == nil && r.refused == nil {
				t.Errorf("once A committed, B was granted the slot A holds: two holders of a slot of limit 1")
			}
		case <-time.After(patience):
			t.Fatalf("B's acquire did not end within %v of A's commit", patience)
		}
	}
	var holders int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM fanout.semaphore_slot WHERE key = 'mcp:srv' AND expires_at > now()`).Scan(&holders); err != nil || holders != 1 {
		t.Errorf("held slots of mcp:srv = %d, %v; want 1 (A's)", holders, err)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<granted>"
	}
	return *s
}
