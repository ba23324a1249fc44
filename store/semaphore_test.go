package store_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// semNode is one node's view of the fleet's semaphores: its own pool, as
// the node role, and its own Semaphore.
type semNode struct {
	pool *pgxpool.Pool
	sem  *store.Semaphore
}

func newSemNode(t *testing.T, b *testBundle) semNode {
	t.Helper()
	pool, err := store.OpenPool(b.ctx, storetest.NodeURL(t, b.url), store.PoolConfig{MaxConns: 4})
	if err != nil {
		t.Fatalf("open a node's pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return semNode{pool: pool, sem: store.NewSemaphore(pool, store.SemaphoreConfig{
		Logger: slog.New(slog.DiscardHandler), PollMin: time.Millisecond, PollMax: 20 * time.Millisecond,
	})}
}

func slots(reqs ...any) []store.SlotRequest {
	var out []store.SlotRequest
	for i := 0; i < len(reqs); i += 2 {
		out = append(out, store.SlotRequest{Key: reqs[i].(string), Limit: reqs[i+1].(int)})
	}
	return out
}

// mustTake acquires want at once or fails t.
func mustTake(t *testing.T, s *store.Semaphore, holder string, want []store.SlotRequest, leaseTTL time.Duration) store.SlotLease {
	t.Helper()
	lease, ok, err := s.TryAcquire(t.Context(), holder, want, leaseTTL)
	if err != nil || !ok {
		t.Fatalf("try to acquire %v: ok %v, err %v; want granted", want, ok, err)
	}
	return lease
}

// refused checks that want is not granted now.
func refused(t *testing.T, s *store.Semaphore, what string, want []store.SlotRequest) {
	t.Helper()
	lease, ok, err := s.TryAcquire(t.Context(), "probe", want, time.Minute)
	if err != nil {
		t.Fatalf("%s: try to acquire %v: %v", what, want, err)
	}
	if ok {
		t.Errorf("%s: %v granted (lease %d); want refused", what, want, lease.ID)
	}
}

func inFlight(t *testing.T, s *store.Semaphore, key string) int {
	t.Helper()
	n, err := s.InFlight(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// slotTimes returns, as the owner reads them, when lease's slot of key was
// granted and when it expires.
func slotTimes(t *testing.T, b *testBundle, lease store.SlotLease, key string) (acquired, expires time.Time) {
	t.Helper()
	err := b.pool.QueryRow(b.ctx, `SELECT acquired_at, expires_at FROM semaphore_slot WHERE lease_id = $1 AND key = $2`,
		lease.ID, key).Scan(&acquired, &expires)
	if err != nil {
		t.Fatalf("slot of lease %d on %s: %v", lease.ID, key, err)
	}
	return acquired, expires
}

// pollUntil calls cond every 10ms until it reports true, failing t after
// within.
func pollUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSemaphoreBoundAcrossNodes: 12 callers on 3 nodes (each its own pool
// and Semaphore) take a server's slot (limit 3) and one of two tools' slots
// (limit 2) together, 10 times each; the callers themselves count who is
// inside, as the tool server would, and never see more than the limits,
// which they do reach.
func TestSemaphoreBoundAcrossNodes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const (
		nodes, callers, rounds = 3, 4, 10
		serverLimit, toolLimit = 3, 2
	)
	tools := []string{"srv__a", "srv__b"}
	var inServer atomic.Int32
	inTool := make([]atomic.Int32, len(tools))
	var maxServer, maxTool atomic.Int32
	var mu sync.Mutex
	over := "" // the first time a bound was passed
	raise := func(m *atomic.Int32, v int32) {
		for {
			old := m.Load()
			if v <= old || m.CompareAndSwap(old, v) {
				return
			}
		}
	}
	var grants atomic.Int32
	var wg sync.WaitGroup
	for n := range nodes {
		node := newSemNode(t, b)
		for c := range callers {
			wg.Go(func() {
				holder := fmt.Sprintf("node-%d/caller-%d", n, c)
				for r := range rounds {
					tool := (c + r) % len(tools)
					ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
					lease, err := node.sem.Acquire(ctx, holder, slots("srv", serverLimit, tools[tool], toolLimit), 30*time.Second)
					if err != nil {
						cancel()
						t.Errorf("%s: %v", holder, err)
						return
					}
					grants.Add(1)
					s, k := inServer.Add(1), inTool[tool].Add(1)
					raise(&maxServer, s)
					raise(&maxTool, k)
					if s > serverLimit || k > toolLimit {
						mu.Lock()
						if over == "" {
							over = fmt.Sprintf("%d callers inside srv (limit %d), %d inside %s (limit %d)",
								s, serverLimit, k, tools[tool], toolLimit)
						}
						mu.Unlock()
					}
					time.Sleep(3 * time.Millisecond) // the call's duration, not a synchronization
					inServer.Add(-1)
					inTool[tool].Add(-1)
					if err := node.sem.Release(ctx, lease, 0); err != nil {
						t.Errorf("%s: %v", holder, err)
					}
					cancel()
				}
			})
		}
	}
	wg.Wait()
	if over != "" {
		t.Errorf("bound passed: %s", over)
	}
	if g := grants.Load(); g != nodes*callers*rounds {
		t.Errorf("%d grants, want %d", g, nodes*callers*rounds)
	}
	// The positive control: the callers did press on both bounds.
	if maxServer.Load() != serverLimit || maxTool.Load() != toolLimit {
		t.Errorf("at most %d callers inside srv and %d inside one tool; want the limits %d and %d reached",
			maxServer.Load(), maxTool.Load(), serverLimit, toolLimit)
	}
	check := newSemNode(t, b)
	for _, k := range append([]string{"srv"}, tools...) {
		if n := inFlight(t, check.sem, k); n != 0 {
			t.Errorf("%s: %d slots held after every caller released, want 0", k, n)
		}
	}
}

// TestSemaphoreAllOrNone: a full key refuses the whole request and the
// other key gives nothing, whichever of the two sorts first.
func TestSemaphoreAllOrNone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := newSemNode(t, b)
	for _, c := range []struct{ full, free string }{{"a-tool", "b-server"}, {"b-tool", "a-server"}} {
		held := mustTake(t, n.sem, "other", slots(c.full, 1), time.Minute)
		refused(t, n.sem, c.full+" full", slots(c.free, 3, c.full, 1))
		refused(t, n.sem, c.full+" full, asked first", slots(c.full, 1, c.free, 3))
		if got := inFlight(t, n.sem, c.free); got != 0 {
			t.Errorf("%s full: %d slots of %s taken by refused requests, want 0", c.full, got, c.free)
		}
		if err := n.sem.Release(b.ctx, held, 0); err != nil {
			t.Fatal(err)
		}
		both := mustTake(t, n.sem, "n", slots(c.free, 3, c.full, 1), time.Minute)
		if f, g := inFlight(t, n.sem, c.full), inFlight(t, n.sem, c.free); f != 1 || g != 1 {
			t.Errorf("granted together: %d of %s and %d of %s held, want 1 each", f, c.full, g, c.free)
		}
		if len(both.Keys) != 2 || both.Keys[0] != c.free || both.Keys[1] != c.full {
			t.Errorf("lease keys %v, want [%s %s]", both.Keys, c.free, c.full)
		}
	}
}

// TestSemaphoreLoweredLimit: a lowered limit grants nothing while as many
// slots as it allows are held, counting holders of slots above it (granted
// under the old limit) until they release; a raised one grants at once.
func TestSemaphoreLoweredLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := newSemNode(t, b)
	var leases []store.SlotLease
	for i := range 3 {
		leases = append(leases, mustTake(t, n.sem, fmt.Sprintf("h%d", i), slots("k", 3), time.Minute))
	}
	refused(t, n.sem, "3 of 3 held", slots("k", 3))
	refused(t, n.sem, "3 held, limit lowered to 2", slots("k", 2))
	// Free slot 0: two are held (slots 1 and 2), as many as the new limit.
	if err := n.sem.Release(b.ctx, leases[0], 0); err != nil {
		t.Fatal(err)
	}
	refused(t, n.sem, "slots 1 and 2 held, limit 2", slots("k", 2))
	// Free slot 2, above the new limit: one held, one more may come.
	if err := n.sem.Release(b.ctx, leases[2], 0); err != nil {
		t.Fatal(err)
	}
	mustTake(t, n.sem, "new", slots("k", 2), time.Minute)
	if got := inFlight(t, n.sem, "k"); got != 2 {
		t.Errorf("%d held, want 2 (the lowered limit)", got)
	}
	refused(t, n.sem, "2 held, limit 2", slots("k", 2))
	// Raised to 4: its new slots exist from this acquire on.
	mustTake(t, n.sem, "new", slots("k", 4), time.Minute)
	mustTake(t, n.sem, "new", slots("k", 4), time.Minute)
	refused(t, n.sem, "4 held, limit 4", slots("k", 4))
	if got := inFlight(t, n.sem, "k"); got != 4 {
		t.Errorf("%d held, want 4", got)
	}
}

// TestSemaphoreExpiryFreesADeadHoldersSlot: a holder that stops (its pool
// closed, nothing renewed) keeps its slot until its lease ends in database
// time, and not a moment longer than it takes another node to ask again.
func TestSemaphoreExpiryFreesADeadHoldersSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dead, live := newSemNode(t, b), newSemNode(t, b)
	const leaseTTL = 700 * time.Millisecond
	lease := mustTake(t, dead.sem, "dead", slots("k", 1), leaseTTL)
	_, deadEnds := slotTimes(t, b, lease, "k")
	dead.pool.Close()
	refused(t, live.sem, "the dead holder's lease runs", slots("k", 1))
	var got store.SlotLease
	pollUntil(t, 20*leaseTTL, "the dead holder's slot freed", func() bool {
		l, ok, err := live.sem.TryAcquire(b.ctx, "live", slots("k", 1), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		got = l
		return ok
	})
	if granted, _ := slotTimes(t, b, got, "k"); granted.Before(deadEnds) {
		t.Errorf("granted at %s, before the dead holder's lease ended at %s", granted, deadEnds)
	}
}

// TestSemaphoreReleaseGrace: a release with a grace keeps the slot held
// until the grace ends (database time); one without frees it at once; a
// lease that lost its slot to another releases nothing of the other's.
func TestSemaphoreReleaseGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := newSemNode(t, b)
	lease := mustTake(t, n.sem, "n", slots("k", 1), time.Minute)
	const grace = 700 * time.Millisecond
	if err := n.sem.Release(b.ctx, lease, grace); err != nil {
		t.Fatal(err)
	}
	_, graceEnds := slotTimes(t, b, lease, "k")
	if got := inFlight(t, n.sem, "k"); got != 1 {
		t.Errorf("%d held during the grace, want 1", got)
	}
	refused(t, n.sem, "during the grace", slots("k", 1))
	var next store.SlotLease
	pollUntil(t, 20*grace, "the slot freed after its grace", func() bool {
		l, ok, err := n.sem.TryAcquire(b.ctx, "next", slots("k", 1), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		next = l
		return ok
	})
	if granted, _ := slotTimes(t, b, next, "k"); granted.Before(graceEnds) {
		t.Errorf("granted at %s, before the grace ended at %s", granted, graceEnds)
	}
	// The first lease's late release leaves the new holder alone.
	if err := n.sem.Release(b.ctx, lease, 0); err != nil {
		t.Fatal(err)
	}
	if got := inFlight(t, n.sem, "k"); got != 1 {
		t.Errorf("an old lease's release freed the new holder's slot: %d held, want 1", got)
	}
	if err := n.sem.Release(b.ctx, next, 0); err != nil {
		t.Fatal(err)
	}
	mustTake(t, n.sem, "after", slots("k", 1), time.Minute)
}

// TestSemaphoreRenew: a renewal extends the lease from now (database time)
// and moves Asked; after the lease ended it is ErrSlotLost, whether or not
// another holder took the slot meanwhile.
func TestSemaphoreRenew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := newSemNode(t, b)
	const leaseTTL = 500 * time.Millisecond
	lease := mustTake(t, n.sem, "n", slots("a", 2, "b", 2), leaseTTL)
	_, firstEnd := slotTimes(t, b, lease, "a")
	asked := lease.Asked
	if err := n.sem.Renew(b.ctx, &lease); err != nil {
		t.Fatalf("renew a live lease: %v", err)
	}
	if !lease.Asked.After(asked) {
		t.Errorf("Asked %s not moved on by the renewal (was %s)", lease.Asked, asked)
	}
	if _, end := slotTimes(t, b, lease, "b"); !end.After(firstEnd) {
		t.Errorf("renewed lease ends at %s, not after %s", end, firstEnd)
	}
	pollUntil(t, 20*leaseTTL, "the lease expired", func() bool { return inFlight(t, n.sem, "a") == 0 })
	if err := n.sem.Renew(b.ctx, &lease); !errors.Is(err, store.ErrSlotLost) {
		t.Errorf("renew an expired lease: %v, want ErrSlotLost", err)
	}

	// Taken by another after it expired.
	lease = mustTake(t, n.sem, "n", slots("c", 1), leaseTTL)
	pollUntil(t, 20*leaseTTL, "the lease expired", func() bool { return inFlight(t, n.sem, "c") == 0 })
	other := mustTake(t, n.sem, "other", slots("c", 1), time.Minute)
	if err := n.sem.Renew(b.ctx, &lease); !errors.Is(err, store.ErrSlotLost) {
		t.Errorf("renew a lease whose slot another took: %v, want ErrSlotLost", err)
	}
	if err := n.sem.Renew(b.ctx, &other); err != nil {
		t.Errorf("the new holder's renewal: %v", err)
	}
}

// TestSemaphoreHold: Hold keeps a lease held past its TTL while fn runs,
// and cancels fn with ErrSlotLost before the lease ends when it cannot
// renew it (the node's pool is gone) or at once when the lease was lost.
func TestSemaphoreHold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	t.Run("renewed", func(t *testing.T) {
		t.Parallel()
		n := newSemNode(t, b)
		const leaseTTL = 1500 * time.Millisecond
		lease := mustTake(t, n.sem, "n", slots("renewed", 1), leaseTTL)
		_, firstEnd := slotTimes(t, b, lease, "renewed")
		err := n.sem.Hold(b.ctx, &lease, func(ctx context.Context) error {
			// Held by this lease after its first TTL ran out in database time.
			pollUntil(t, 30*leaseTTL, "the lease held past its first end", func() bool {
				var held bool
				if err := b.pool.QueryRow(ctx, `SELECT now() > $2 AND expires_at > now() FROM semaphore_slot WHERE lease_id = $1`,
					lease.ID, firstEnd).Scan(&held); err != nil {
					t.Fatal(err)
				}
				return held
			})
			return ctx.Err()
		})
		if err != nil {
			t.Errorf("Hold: %v", err)
		}
	})
	t.Run("cut off", func(t *testing.T) {
		t.Parallel()
		n := newSemNode(t, b)
		const leaseTTL = 3 * time.Second // margin TTL/10 = 300ms
		lease := mustTake(t, n.sem, "n", slots("cut", 1), leaseTTL)
		var stillHeld bool
		err := n.sem.Hold(b.ctx, &lease, func(ctx context.Context) error {
			n.pool.Close() // every renewal fails from now on
			select {
			case <-ctx.Done():
			case <-time.After(10 * leaseTTL):
				return errors.New("fn not cancelled within 10 TTLs")
			}
			// The database still holds the lease: fn stopped before it ended.
			if err := b.pool.QueryRow(b.ctx, `SELECT expires_at > now() FROM semaphore_slot WHERE lease_id = $1`,
				lease.ID).Scan(&stillHeld); err != nil {
				t.Fatal(err)
			}
			if cause := context.Cause(ctx); !errors.Is(cause, store.ErrSlotLost) {
				t.Errorf("fn's cause %v, want ErrSlotLost", cause)
			}
			return ctx.Err()
		})
		if !errors.Is(err, store.ErrSlotLost) || !errors.Is(err, context.Canceled) {
			t.Errorf("Hold: %v, want ErrSlotLost wrapping fn's error", err)
		}
		if !stillHeld {
			t.Errorf("fn was cancelled after its lease ended in the database; want a margin before")
		}
	})
	t.Run("lost", func(t *testing.T) {
		t.Parallel()
		n := newSemNode(t, b)
		const leaseTTL = time.Minute
		lease := mustTake(t, n.sem, "n", slots("lost", 1), leaseTTL)
		// Its first renewal (after TTL/3) finds the lease ended.
		lease.Asked = lease.Asked.Add(-leaseTTL / 3)
		if _, err := b.pool.Exec(b.ctx, `UPDATE semaphore_slot SET expires_at = now() WHERE lease_id = $1`, lease.ID); err != nil {
			t.Fatal(err)
		}
		err := n.sem.Hold(b.ctx, &lease, func(ctx context.Context) error {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(leaseTTL / 2):
				return errors.New("fn not cancelled at the first renewal")
			}
		})
		if !errors.Is(err, store.ErrSlotLost) {
			t.Errorf("Hold: %v, want ErrSlotLost", err)
		}
	})
}

// TestSemaphoreAcquireWaitsUntilTheDeadline: a waiter on a full key
// returns when its context ends, naming the full key and its limit and
// wrapping the context's cause, having taken nothing; a waiter gets the
// slot once it is released.
func TestSemaphoreAcquireWaitsUntilTheDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := newSemNode(t, b)
	held := mustTake(t, n.sem, "holder", slots("tool", 1), time.Minute)

	ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
	_, err := n.sem.Acquire(ctx, "waiter", slots("server", 5, "tool", 1), time.Minute)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "key tool had no free slot (limit 1)") {
		t.Errorf("Acquire at its deadline: %v; want DeadlineExceeded, naming key tool and its limit", err)
	}
	if got := inFlight(t, n.sem, "server"); got != 0 {
		t.Errorf("the waiter holds %d slots of server, want 0", got)
	}

	why := errors.New("the run was cancelled")
	cctx, ccancel := context.WithCancelCause(b.ctx)
	done := make(chan error, 1)
	go func() {
		_, err := n.sem.Acquire(cctx, "waiter", slots("tool", 1), time.Minute)
		done <- err
	}()
	ccancel(why)
	select {
	case err := <-done:
		if !errors.Is(err, why) {
			t.Errorf("Acquire cancelled: %v, want the cause %v", err, why)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Acquire did not return within 30s of its cancel")
	}

	wctx, wcancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer wcancel()
	go func() {
		_, err := n.sem.Acquire(wctx, "waiter", slots("tool", 1), time.Minute)
		done <- err
	}()
	if err := n.sem.Release(b.ctx, held, 0); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Acquire after the slot was released: %v", err)
	}
}

// TestSemaphoreRetriedAcquireFindsItsGrant: semaphore_acquire run twice
// for one lease (a retry after a lost reply) grants one slot, not two.
func TestSemaphoreRetriedAcquireFindsItsGrant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := newSemNode(t, b)
	acquire := func(lease int64) *string {
		t.Helper()
		var full *string
		if err := n.pool.QueryRow(b.ctx, `SELECT semaphore_acquire($1, 'n', '{k}', '{2}', '1 minute')`, lease).Scan(&full); err != nil {
			t.Fatal(err)
		}
		return full
	}
	if acquire(42) != nil {
		t.Fatal("lease 42 refused")
	}
	if acquire(42) != nil { // the retry
		t.Fatal("lease 42 refused when asked again")
	}
	if got := inFlight(t, n.sem, "k"); got != 1 {
		t.Errorf("lease 42 acquired twice holds %d slots, want 1", got)
	}
	if acquire(43) != nil {
		t.Fatal("lease 43 refused with one of 2 slots free")
	}
	if full := acquire(44); full == nil || *full != "k" {
		t.Errorf("lease 44 on a full key: %v, want k", full)
	}
}

// TestSemaphoreBadInput: every malformed request is refused naming the
// field and the bound, before anything is sent; the database refuses them
// too.
func TestSemaphoreBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := newSemNode(t, b)
	many := make([]store.SlotRequest, store.MaxSlotKeys+1)
	for i := range many {
		many[i] = store.SlotRequest{Key: fmt.Sprintf("k%d", i), Limit: 1}
	}
	for _, c := range []struct {
		name   string
		holder string
		want   []store.SlotRequest
		ttl    time.Duration
		msg    string
	}{
		{"no holder", "", slots("k", 1), time.Minute, "holder is empty"},
		{"no keys", "n", nil, time.Minute, "no keys asked for"},
		{"too many keys", "n", many, time.Minute, "17 keys asked for, more than 16"},
		{"empty key", "n", slots("k", 1, "", 1), time.Minute, "want[1].Key is empty"},
		{"long key", "n", slots(strings.Repeat("k", 257), 1), time.Minute, "want[0].Key is 257 bytes, more than 256"},
		{"limit 0", "n", slots("k", 0), time.Minute, "want[0].Limit (key k) is 0: must be 1 to 10000"},
		{"limit too high", "n", slots("k", 10001), time.Minute, "want[0].Limit (key k) is 10001: must be 1 to 10000"},
		{"duplicate key", "n", slots("k", 1, "j", 1, "k", 2), time.Minute, "want[2].Key k is asked for twice (also want[0])"},
		{"ttl 0", "n", slots("k", 1), 0, "ttl 0s out of range"},
		{"ttl over an hour", "n", slots("k", 1), 2 * time.Hour, "ttl 2h0m0s out of range: must be more than 0 and at most 1h0m0s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, ok, err := n.sem.TryAcquire(b.ctx, c.holder, c.want, c.ttl)
			if ok || err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("TryAcquire: ok %v, err %v; want an error saying %q", ok, err, c.msg)
			}
			if _, err := n.sem.Acquire(b.ctx, c.holder, c.want, c.ttl); err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("Acquire: %v; want an error saying %q", err, c.msg)
			}
		})
	}
	if err := n.sem.Release(b.ctx, store.SlotLease{ID: 1, Holder: "n"}, -time.Second); err == nil || !strings.Contains(err.Error(), "grace -1s out of range") {
		t.Errorf("Release with a negative grace: %v", err)
	}
	if err := n.sem.Renew(b.ctx, &store.SlotLease{}); err == nil || !strings.Contains(err.Error(), "not granted") {
		t.Errorf("Renew of a zero lease: %v", err)
	}
	if _, err := n.sem.InFlight(b.ctx, ""); err == nil || !strings.Contains(err.Error(), "key is empty") {
		t.Errorf("InFlight of no key: %v", err)
	}
	for _, sql := range []string{
		`SELECT semaphore_acquire(1, 'n', '{k}', '{0}', '1 minute')`,
		`SELECT semaphore_acquire(1, 'n', '{k,k}', '{1,1}', '1 minute')`,
		`SELECT semaphore_acquire(1, 'n', '{k}', '{1,2}', '1 minute')`,
		`SELECT semaphore_acquire(1, '', '{k}', '{1}', '1 minute')`,
		`SELECT semaphore_acquire(1, 'n', '{}', '{}', '1 minute')`,
		`SELECT semaphore_acquire(1, 'n', '{k}', '{1}', '0')`,
		`SELECT semaphore_renew(1, 'n', '2 hours')`,
		`SELECT semaphore_release(1, 'n', '-1 second')`,
	} {
		if _, err := n.pool.Exec(b.ctx, sql); sqlState(err) != "22023" {
			t.Errorf("%s: %v, want invalid_parameter_value", sql, err)
		}
	}
}

// TestSemaphoreSlotsGauge: the health check publishes the slots held per
// key, fleet-wide, 0 for a key none holds.
func TestSemaphoreSlotsGauge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := newSemNode(t, b)
	mustTake(t, n.sem, "n", slots("srv", 3, "srv__a", 2), time.Minute)
	mustTake(t, n.sem, "n", slots("srv", 3), time.Minute)
	idle := mustTake(t, n.sem, "n", slots("idle", 1), time.Minute)
	if err := n.sem.Release(b.ctx, idle, 0); err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		store.MonitorHealth(ctx, n.pool, store.HealthConfig{Interval: 50 * time.Millisecond, Meter: mp.Meter("test"),
			Logger: slog.New(slog.DiscardHandler)})
	})
	defer func() { cancel(); wg.Wait() }()
	want := map[string]int64{"srv": 2, "srv__a": 1, "idle": 0}
	var got map[string]int64
	pollUntil(t, 30*time.Second, "the gauge", func() bool {
		got = slotGauge(t, reader)
		return fmt.Sprint(got) == fmt.Sprint(want)
	})
}

// slotGauge returns fanout.semaphore.slots.held by key.
func slotGauge(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			g, ok := m.Data.(metricdata.Gauge[int64])
			if !ok || m.Name != "fanout.semaphore.slots.held" {
				continue
			}
			for _, p := range g.DataPoints {
				k, _ := p.Attributes.Value(store.AttrSemaphoreKey)
				out[k.AsString()] = p.Value
			}
		}
	}
	return out
}

// TestSemaphoreSlotsChangeOnlyThroughItsFunctions: the node role reads the
// slots but changes them only through semaphore_acquire, _renew and
// _release.
func TestSemaphoreSlotsChangeOnlyThroughItsFunctions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := newSemNode(t, b)
	mustTake(t, n.sem, "n", slots("k", 2), time.Minute)
	node := nodeConn(t, b)
	for _, stmt := range []string{
		"UPDATE semaphore_slot SET expires_at = '-infinity'",
		"INSERT INTO semaphore_slot (key, slot) VALUES ('k', 5)",
		"DELETE FROM semaphore_slot",
		"TRUNCATE semaphore_slot",
	} {
		if _, err := node.Exec(b.ctx, stmt); sqlState(err) != "42501" {
			t.Errorf("node role: %s: %v, want insufficient_privilege", stmt, err)
		}
	}
	var rows int
	if err := node.QueryRow(b.ctx, "SELECT count(*) FROM semaphore_slot").Scan(&rows); err != nil || rows != 2 {
		t.Errorf("node role reads %d slot rows (%v), want 2", rows, err)
	}
}

// BenchmarkSemaphore measures acquire+release pairs per second on one key
// (two keys together with keys=2) by 1 and 16 clients whose limit leaves
// each a slot, beside a raw baseline in the same run: two bare single-row
// UPDATEs per pair (one commit each, as an acquire and a release are), each
// client on its own row.
func BenchmarkSemaphore(b *testing.B) {
	for _, clients := range []int{1, 16} {
		for _, keys := range []int{1, 2} {
			b.Run(fmt.Sprintf("semaphore/clients=%d/keys=%d", clients, keys), func(b *testing.B) {
				pool := benchPool(b, clients)
				sem := store.NewSemaphore(pool, store.SemaphoreConfig{Logger: slog.New(slog.DiscardHandler)})
				want := slots("srv", clients)
				if keys == 2 {
					want = append(want, store.SlotRequest{Key: "srv__tool", Limit: clients})
				}
				ctx := context.Background()
				rate, p99 := benchClients(b, clients, func() error {
					lease, err := sem.Acquire(ctx, "bench", want, time.Minute)
					if err != nil {
						return err
					}
					return sem.Release(ctx, lease, 0)
				})
				b.ReportMetric(rate, "pairs/s")
				b.ReportMetric(p99, "p99-ms")
			})
		}
		b.Run(fmt.Sprintf("raw/clients=%d", clients), func(b *testing.B) {
			pool := benchPool(b, clients)
			ctx := context.Background()
			if _, err := pool.Exec(ctx, `INSERT INTO semaphore_slot (key, slot) SELECT 'raw', g FROM generate_series(0, $1 - 1) g`, clients); err != nil {
				b.Fatal(err)
			}
			var next atomic.Int64
			rate, p99 := benchClients(b, clients, func() error {
				slot := next.Add(1) % int64(clients)
				if _, err := pool.Exec(ctx, `UPDATE semaphore_slot SET expires_at = now() + interval '1 minute' WHERE key = 'raw' AND slot = $1`, slot); err != nil {
					return err
				}
				_, err := pool.Exec(ctx, `UPDATE semaphore_slot SET expires_at = '-infinity' WHERE key = 'raw' AND slot = $1`, slot)
				return err
			})
			b.ReportMetric(rate, "pairs/s")
			b.ReportMetric(p99, "p99-ms")
		})
	}
}
