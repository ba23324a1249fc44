package store_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// workerToolCache returns the result cache as a worker uses it: on a pool
// of the worker role, which must present its attempt's secret.
func workerToolCache(t *testing.T, b *testBundle) *store.ToolCache {
	t.Helper()
	pool, err := store.OpenPool(b.ctx, storetest.WorkerURL(t, b.url), store.PoolConfig{MaxConns: 2})
	if err != nil {
		t.Fatalf("open a worker's pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return store.NewToolCache(pool, slog.New(slog.DiscardHandler))
}

// cachedCall is a call of crm's read tool by task key ("tenant/run/task").
func cachedCall(ts tasks, key, args string) runs.CachedCall {
	c := map[string]runs.CachedCall{
		"acme/r1/t1":   {TenantID: "acme", RunID: "r1", TaskID: "t1"},
		"acme/r1/t2":   {TenantID: "acme", RunID: "r1", TaskID: "t2"},
		"globex/g1/t1": {TenantID: "globex", RunID: "g1", TaskID: "t1"},
	}[key]
	c.Account = int64(ts[key])
	c.Server, c.Tool, c.ArgsHash = "crm", "crm__get_ticket", digest(args)
	return c
}

// TestToolCacheIsTheTenants (docs/mcp.md#the-result-cache-for-read-tools):
// a read's result stored by one task of a tenant answers another task of
// that tenant, with other arguments it is a miss, and another tenant's call
// of the same tool with the same arguments never sees it. A worker's login
// uses the cache only as a task dispatched to it: with no secret, another
// attempt's, or its own task's account under another tenant's name, it is
// refused ErrToolCacheDenied and nothing is stored.
func TestToolCacheIsTheTenants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tc := workerToolCache(t, b)
	ts := openTasks(t, b)
	secret := map[string]string{}
	for _, key := range []string{"acme/r1/t1", "acme/r1/t2", "globex/g1/t1"} {
		parts := strings.SplitN(key, "/", 3)
		a, err := b.ledger.BeginAttempt(b.ctx, ts[key], parts[1], parts[0])
		if err != nil {
			t.Fatal(err)
		}
		secret[key] = a.Secret
	}
	const args = `{"id":7}`
	result := json.RawMessage(`{"text":"ticket 7: open","sources":["crm://7"]}`)
	stored, err := tc.PutToolResult(b.ctx, cachedCall(ts, "acme/r1/t1", args), secret["acme/r1/t1"], result, time.Hour)
	if err != nil || !stored {
		t.Fatalf("acme's t1 stores its read: stored %v, %v", stored, err)
	}
	got, ok, err := tc.GetToolResult(b.ctx, cachedCall(ts, "acme/r1/t2", args), secret["acme/r1/t2"])
	if err != nil || !ok {
		t.Fatalf("acme's t2 reads the same call: ok %v, %v; want a hit", ok, err)
	}
	var want, have any
	_ = json.Unmarshal(result, &want)
	if err := json.Unmarshal(got, &have); err != nil || !jsonEqual(want, have) {
		t.Errorf("acme's t2 got %s, want %s", got, result)
	}
	if _, ok, err := tc.GetToolResult(b.ctx, cachedCall(ts, "acme/r1/t2", `{"id":8}`), secret["acme/r1/t2"]); err != nil || ok {
		t.Errorf("acme reads the call with other arguments: ok %v, %v; want a miss", ok, err)
	}
	if _, ok, err := tc.GetToolResult(b.ctx, cachedCall(ts, "globex/g1/t1", args), secret["globex/g1/t1"]); err != nil || ok {
		t.Errorf("globex reads the same call: ok %v, %v; want a miss (tenants never share entries)", ok, err)
	}

	// Globex's worker names acme: its account is globex's.
	forged := cachedCall(ts, "globex/g1/t1", args)
	forged.TenantID, forged.RunID = "acme", "r1"
	for _, c := range []struct {
		what   string
		call   runs.CachedCall
		secret string
	}{
		{"no secret", cachedCall(ts, "acme/r1/t1", args), ""},
		{"another attempt's secret", cachedCall(ts, "acme/r1/t1", args), secret["acme/r1/t2"]},
		{"its own account under acme's name", forged, secret["globex/g1/t1"]},
	} {
		if _, _, err := tc.GetToolResult(b.ctx, c.call, c.secret); !errors.Is(err, store.ErrToolCacheDenied) {
			t.Errorf("get with %s: %v; want ErrToolCacheDenied", c.what, err)
		}
		if _, err := tc.PutToolResult(b.ctx, c.call, c.secret, json.RawMessage(`{"text":"forged"}`), time.Hour); !errors.Is(err, store.ErrToolCacheDenied) {
			t.Errorf("put with %s: %v; want ErrToolCacheDenied", c.what, err)
		}
	}
	got, _, err = tc.GetToolResult(b.ctx, cachedCall(ts, "acme/r1/t1", args), secret["acme/r1/t1"])
	if err != nil {
		t.Fatalf("acme reads its entry after the refused puts: %v", err)
	}
	if err := json.Unmarshal(got, &have); err != nil || !jsonEqual(want, have) {
		t.Errorf("after the refused puts acme reads %s, %v; want its own result %s", got, err, result)
	}
	if n := b.count(t, "tool_result_cache"); n != 1 {
		t.Errorf("%d cache entries, want 1", n)
	}
	// Once the run has ended, its tasks' secrets read and write nothing.
	if _, err := b.ledger.CloseRun(b.ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tc.GetToolResult(b.ctx, cachedCall(ts, "acme/r1/t1", args), secret["acme/r1/t1"]); !errors.Is(err, store.ErrToolCacheDenied) {
		t.Errorf("get with the secret of a task whose run ended: %v; want ErrToolCacheDenied", err)
	}
	if _, err := tc.PutToolResult(b.ctx, cachedCall(ts, "acme/r1/t1", `{"id":9}`), secret["acme/r1/t1"], result, time.Hour); !errors.Is(err, store.ErrToolCacheDenied) {
		t.Errorf("put with the secret of a task whose run ended: %v; want ErrToolCacheDenied", err)
	}
}

// TestToolCacheExpiry (docs/mcp.md#the-result-cache-for-read-tools): an
// entry answers until its expires_at, database time; a get at expires_at
// or later is a miss and deletes it. Checked in one transaction of the
// owner (not asked for a secret), where now() stands still.
func TestToolCacheExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ts := openTasks(t, b)
	c := cachedCall(ts, "acme/r1/t1", `{"id":7}`)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	put := `SELECT fanout.tool_cache_put($1, $2, $3, $4, NULL, $5, $6, $7, '{"text":"x"}', 60000)`
	if _, err := tx.Exec(b.ctx, put, c.Account, c.TenantID, c.RunID, c.TaskID, c.Server, c.Tool, c.ArgsHash); err != nil {
		t.Fatal(err)
	}
	get := func(expiresIn string) (hit bool, rows int) {
		t.Helper()
		if _, err := tx.Exec(b.ctx, `UPDATE fanout.tool_result_cache
		    SET created_at = now() - interval '1 hour', expires_at = now() + $1::interval`, expiresIn); err != nil {
			t.Fatal(err)
		}
		var res []byte
		if err := tx.QueryRow(b.ctx, `SELECT fanout.tool_cache_get($1, $2, $3, $4, NULL, $5, $6, $7)`,
			c.Account, c.TenantID, c.RunID, c.TaskID, c.Server, c.Tool, c.ArgsHash).Scan(&res); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(b.ctx, `SELECT count(*) FROM fanout.tool_result_cache`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		return res != nil, rows
	}
	if hit, rows := get("1 microsecond"); !hit || rows != 1 {
		t.Errorf("a microsecond before expires_at: hit %v, %d rows; want a hit, the entry kept", hit, rows)
	}
	if hit, rows := get("0"); hit || rows != 0 {
		t.Errorf("at expires_at: hit %v, %d rows; want a miss, the entry deleted", hit, rows)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
