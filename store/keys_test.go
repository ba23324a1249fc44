package store_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/tenant"
)

func ptr[T any](v T) *T { return &v }

// ownerActor is the actor the owner role (the harness's superuser) may
// claim: its own role.
func ownerActor(t *testing.T, b *testBundle) string {
	t.Helper()
	var role string
	if err := b.pool.QueryRow(b.ctx, "SELECT current_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	return "role:" + role
}

type adminRow struct {
	actor, action, tenant, detail string
}

func adminLog(t *testing.T, b *testBundle) []adminRow {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, "SELECT actor, action, coalesce(tenant_id, ''), detail::text FROM admin_audit ORDER BY action_id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []adminRow
	for rows.Next() {
		var r adminRow
		if err := rows.Scan(&r.actor, &r.action, &r.tenant, &r.detail); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTenantCreateSetQuotasAndLog: a tenant is created with its quotas,
// changed, read back; each change is one admin_action row naming the actor,
// and a second create is ErrTenantExists with nothing written.
func TestTenantCreateSetQuotasAndLog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := store.NewKeys(b.pool, nil)
	actor := ownerActor(t, b)
	tn, err := keys.CreateTenant(b.ctx, actor, "acme", tenant.Quotas{MaxRunTokens: ptr[int64](50_000), KeyRequestsPerMinute: ptr[int32](60)})
	if err != nil {
		t.Fatal(err)
	}
	if tn.ID != "acme" || *tn.MaxRunTokens != 50_000 || tn.MaxConcurrentRuns != nil || *tn.KeyRequestsPerMinute != 60 {
		t.Errorf("created tenant = %+v", tn)
	}
	if _, err := keys.CreateTenant(b.ctx, actor, "acme", tenant.Quotas{}); !errors.Is(err, tenant.ErrTenantExists) {
		t.Errorf("second create: %v; want ErrTenantExists", err)
	}
	if _, err := keys.SetQuotas(b.ctx, actor, "acme", tenant.Quotas{MaxConcurrentRuns: ptr[int32](3), MaxTasksInFlight: ptr[int32](20),
		Headroom: ptr(0.5)}); err != nil {
		t.Fatal(err)
	}
	got, err := keys.Tenant(b.ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if got.MaxRunTokens != nil || *got.MaxConcurrentRuns != 3 || *got.MaxTasksInFlight != 20 || got.KeyRequestsPerMinute != nil ||
		got.Headroom == nil || *got.Headroom != 0.5 {
		t.Errorf("tenant after SetQuotas = %+v; want exactly the quotas set (nil: no cap)", got)
	}
	if _, err := keys.SetQuotas(b.ctx, actor, "nobody", tenant.Quotas{}); !errors.Is(err, tenant.ErrTenantNotFound) {
		t.Errorf("SetQuotas on an unknown tenant: %v; want ErrTenantNotFound", err)
	}
	if _, err := keys.Tenant(b.ctx, "nobody"); !errors.Is(err, tenant.ErrTenantNotFound) {
		t.Errorf("Tenant(nobody): %v; want ErrTenantNotFound", err)
	}
	log := adminLog(t, b)
	if len(log) != 2 || log[0].action != "tenant.create" || log[1].action != "tenant.set_quotas" ||
		log[0].actor != actor || log[1].tenant != "acme" || !strings.Contains(log[1].detail, `"max_concurrent_runs": 3`) {
		t.Errorf("admin log = %+v; want tenant.create and tenant.set_quotas by %s", log, actor)
	}
}

// TestTenantAndKeyValidation: every out-of-range argument is refused with
// ErrAdminInvalid naming the field, and nothing is written.
func TestTenantAndKeyValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := store.NewKeys(b.pool, nil)
	actor := ownerActor(t, b)
	if _, err := keys.CreateTenant(b.ctx, actor, "acme", tenant.Quotas{}); err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256([]byte("x"))
	okKey := tenant.CreateKeyParams{Actor: actor, KeyID: "fk_0123456789abcdef", TenantID: "acme", Scopes: []string{"run"}, SecretSHA256: digest[:]}
	tenantCases := []struct {
		name, id, field string
		q               tenant.Quotas
	}{
		{"empty id", "", "tenant_id", tenant.Quotas{}},
		{"long id", strings.Repeat("é", 65), "tenant_id", tenant.Quotas{}}, // 130 bytes, 65 characters
		{"run tokens", "t1", "max_run_tokens", tenant.Quotas{MaxRunTokens: ptr[int64](0)}},
		{"concurrent", "t1", "max_concurrent_runs", tenant.Quotas{MaxConcurrentRuns: ptr[int32](-1)}},
		{"tasks", "t1", "max_tasks_in_flight", tenant.Quotas{MaxTasksInFlight: ptr[int32](10_000)}},
		{"rpm", "t1", "key_requests_per_minute", tenant.Quotas{KeyRequestsPerMinute: ptr[int32](0)}},
		{"no headroom", "t1", "headroom", tenant.Quotas{Headroom: ptr(0.0)}},
		{"more than the limit", "t1", "headroom", tenant.Quotas{Headroom: ptr(1.01)}},
	}
	for _, c := range tenantCases {
		_, err := keys.CreateTenant(b.ctx, actor, c.id, c.q)
		var ae *tenant.AdminError
		if !errors.As(err, &ae) || !errors.Is(err, tenant.ErrAdminInvalid) || ae.Field != c.field {
			t.Errorf("%s: CreateTenant: %v; want ErrAdminInvalid naming %s", c.name, err, c.field)
		}
	}
	keyCases := []struct {
		name, field string
		edit        func(*tenant.CreateKeyParams)
	}{
		{"bad id", "key_id", func(p *tenant.CreateKeyParams) { p.KeyID = "fk_XYZ" }},
		{"long name", "name", func(p *tenant.CreateKeyParams) { p.Name = strings.Repeat("n", 129) }},
		{"no scopes", "scopes", func(p *tenant.CreateKeyParams) { p.Scopes = nil }},
		{"admin scope on tenant key", "scopes", func(p *tenant.CreateKeyParams) { p.Scopes = []string{"run", "admin"} }},
		{"repeated scope", "scopes", func(p *tenant.CreateKeyParams) { p.Scopes = []string{"run", "run"} }},
		{"admin key with run", "scopes", func(p *tenant.CreateKeyParams) { p.TenantID = ""; p.Scopes = []string{"run"} }},
		{"short digest", "secret_sha256", func(p *tenant.CreateKeyParams) { p.SecretSHA256 = digest[:16] }},
		{"rpm", "requests_per_minute", func(p *tenant.CreateKeyParams) { p.RequestsPerMinute = -1 }},
		{"expired", "expires_at", func(p *tenant.CreateKeyParams) { p.ExpiresAt = time.Now().Add(-time.Hour) }},
		{"actor", "actor", func(p *tenant.CreateKeyParams) { p.Actor = "" }},
	}
	for _, c := range keyCases {
		p := okKey
		c.edit(&p)
		_, err := keys.CreateKey(b.ctx, p)
		var ae *tenant.AdminError
		if !errors.As(err, &ae) || !errors.Is(err, tenant.ErrAdminInvalid) || ae.Field != c.field {
			t.Errorf("%s: CreateKey: %v; want ErrAdminInvalid naming %s", c.name, err, c.field)
		}
	}
	p := okKey
	p.TenantID = "nobody"
	if _, err := keys.CreateKey(b.ctx, p); !errors.Is(err, tenant.ErrTenantNotFound) {
		t.Errorf("key of an unknown tenant: %v; want ErrTenantNotFound", err)
	}
	if n := len(adminLog(t, b)); n != 1 {
		t.Errorf("admin log holds %d rows; want only the tenant.create (nothing written by a refusal)", n)
	}
	if ks, err := keys.ListKeys(b.ctx, ""); err != nil || len(ks) != 0 {
		t.Errorf("ListKeys = %v, %v; want none", ks, err)
	}
}

// TestKeyLifecycle: create, list (no digest), look up (digest, live), a
// duplicate id refused, revoke (notified, logged once, dead), expiry on the
// database's clock, and an unknown id not live in KeyStates.
func TestKeyLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := store.NewKeys(b.pool, b.notifier(t, store.NotifierConfig{}))
	actor := ownerActor(t, b)
	if _, err := keys.CreateTenant(b.ctx, actor, "acme", tenant.Quotas{KeyRequestsPerMinute: ptr[int32](30)}); err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256([]byte("canary-secret"))
	p := tenant.CreateKeyParams{Actor: actor, KeyID: "fk_00000000000000a1", TenantID: "acme", Name: "ci",
		Scopes: []string{"run", "read"}, SecretSHA256: digest[:]}
	if _, err := keys.CreateKey(b.ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.CreateKey(b.ctx, p); !errors.Is(err, tenant.ErrKeyExists) {
		t.Errorf("second key with one id: %v; want ErrKeyExists", err)
	}
	admin := tenant.CreateKeyParams{Actor: actor, KeyID: "fk_00000000000000ad", Scopes: []string{"admin"}, SecretSHA256: digest[:], RequestsPerMinute: 5}
	if _, err := keys.CreateKey(b.ctx, admin); err != nil {
		t.Fatal(err)
	}
	list, err := keys.ListKeys(b.ctx, "acme")
	if err != nil || len(list) != 1 || list[0].ID != p.KeyID || !slices.Equal(list[0].Scopes, p.Scopes) || list[0].CreatedBy != actor {
		t.Fatalf("ListKeys(acme) = %+v, %v; want the one acme key", list, err)
	}
	if all, err := keys.ListKeys(b.ctx, ""); err != nil || len(all) != 2 {
		t.Errorf("ListKeys(\"\") = %+v, %v; want both keys", all, err)
	}
	rec, err := keys.LookupKey(b.ctx, p.KeyID)
	if err != nil || !bytes.Equal(rec.SecretSHA256, digest[:]) || !rec.Live || rec.EffectiveRequestsPerMinute != 30 {
		t.Errorf("LookupKey = %+v, %v; want the digest, live, the tenant's 30 rpm", rec, err)
	}
	if rec, err := keys.LookupKey(b.ctx, admin.KeyID); err != nil || rec.EffectiveRequestsPerMinute != 5 || rec.TenantID != "" {
		t.Errorf("LookupKey(admin) = %+v, %v; want its own 5 rpm and no tenant", rec, err)
	}
	if _, err := keys.LookupKey(b.ctx, "fk_ffffffffffffffff"); !errors.Is(err, tenant.ErrKeyNotFound) {
		t.Errorf("LookupKey(unknown): %v; want ErrKeyNotFound", err)
	}

	// Revocation is signalled on KeyRevokedChannel.
	lctx, cancel := context.WithCancel(b.ctx)
	ready, got, done := make(chan struct{}), make(chan string, 4), make(chan error, 1)
	go func() {
		done <- keys.ListenRevocations(lctx, func() { close(ready) }, func(id string) { got <- id })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("listen: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("listen: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("listener not ready within 10s")
	}
	revoked, err := keys.WithActorSecret("canary-secret").RevokeKey(b.ctx, "key:"+admin.KeyID, p.KeyID)
	if err != nil || revoked.RevokedAt == nil || revoked.RevokedBy != "key:"+admin.KeyID {
		t.Fatalf("RevokeKey = %+v, %v", revoked, err)
	}
	select {
	case id := <-got:
		if id != p.KeyID {
			t.Errorf("notified %q; want %q", id, p.KeyID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no revocation notice within 10s")
	}
	if again, err := keys.RevokeKey(b.ctx, actor, p.KeyID); err != nil || !again.RevokedAt.Equal(*revoked.RevokedAt) {
		t.Errorf("second revoke = %+v, %v; want the first revocation kept", again, err)
	}
	if _, err := keys.RevokeKey(b.ctx, actor, "fk_ffffffffffffffff"); !errors.Is(err, tenant.ErrKeyNotFound) {
		t.Errorf("revoke unknown: %v; want ErrKeyNotFound", err)
	}
	if rec, err := keys.LookupKey(b.ctx, p.KeyID); err != nil || rec.Live {
		t.Errorf("LookupKey after revoke = %+v, %v; want not live", rec, err)
	}

	// Expiry on the database's clock: a key whose expires_at has passed.
	e := p
	e.KeyID = "fk_00000000000000e1"
	e.ExpiresAt = time.Now().Add(time.Hour)
	if _, err := keys.CreateKey(b.ctx, e); err != nil {
		t.Fatal(err)
	}
	live := "fk_00000000000000b2"
	l := p
	l.KeyID = live
	if _, err := keys.CreateKey(b.ctx, l); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, "UPDATE api_key SET expires_at = now() - interval '1 second' WHERE key_id = $1", e.KeyID); err != nil {
		t.Fatal(err)
	}
	if rec, err := keys.LookupKey(b.ctx, e.KeyID); err != nil || rec.Live {
		t.Errorf("LookupKey(expired) = %+v, %v; want not live", rec, err)
	}
	states, err := keys.KeyStates(b.ctx, []string{p.KeyID, e.KeyID, live, "fk_ffffffffffffffff"})
	var dead []string
	for _, st := range states {
		if !st.Live {
			dead = append(dead, st.ID)
		}
	}
	slices.Sort(dead)
	want := []string{p.KeyID, e.KeyID, "fk_ffffffffffffffff"}
	slices.Sort(want)
	if err != nil || len(states) != 4 || !slices.Equal(dead, want) {
		t.Errorf("KeyStates = %+v, %v; want %v not live (revoked, expired, unknown; not the live one)", states, err, want)
	}

	// The log: every change, never the digest.
	log := adminLog(t, b)
	var actions []string
	for _, r := range log {
		actions = append(actions, r.action)
		for _, form := range []string{string(digest[:]), hexString(digest[:]), "canary-secret"} {
			if strings.Contains(r.detail, form) {
				t.Errorf("admin log detail %s holds the secret or its digest", r.detail)
			}
		}
	}
	wantActions := []string{"tenant.create", "key.create", "key.create", "key.revoke", "key.create", "key.create"}
	if !slices.Equal(actions, wantActions) {
		t.Errorf("admin log actions = %v; want %v (one revoke: the second changed nothing)", actions, wantActions)
	}
}

func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// TestAdminActorChecked: AdminService's login (fanout_admin) may act as a
// live admin key whose secret it presents (never by its id alone), never as
// a revoked admin key or a database role it is not; and it cannot write
// api_key or tenant except through the functions.
func TestAdminActorChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := store.NewKeys(b.pool, nil)
	owner := ownerActor(t, b)
	digest := sha256.Sum256([]byte("s"))
	adminID := "fk_00000000000000ad"
	if _, err := keys.CreateKey(b.ctx, tenant.CreateKeyParams{Actor: owner, KeyID: adminID, Scopes: []string{"admin"}, SecretSHA256: digest[:]}); err != nil {
		t.Fatal(err)
	}
	nodePool, err := store.Open(b.ctx, storetest.AdminURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nodePool.Close)
	node := store.NewKeys(nodePool, nil)
	if _, err := node.CreateTenant(b.ctx, "key:"+adminID, "acme", tenant.Quotas{}); !errors.Is(err, tenant.ErrActorRefused) {
		t.Errorf("node acting as a live admin key without its secret: %v; want ErrActorRefused", err)
	}
	if _, err := node.WithActorSecret("s").CreateTenant(b.ctx, "key:"+adminID, "acme", tenant.Quotas{}); err != nil {
		t.Errorf("node acting as a live admin key with its secret: %v", err)
	}
	if _, err := node.CreateTenant(b.ctx, owner, "globex", tenant.Quotas{}); !errors.Is(err, tenant.ErrActorRefused) {
		t.Errorf("node claiming %s: %v; want ErrActorRefused", owner, err)
	}
	if _, err := node.CreateTenant(b.ctx, "key:fk_ffffffffffffffff", "globex", tenant.Quotas{}); !errors.Is(err, tenant.ErrActorRefused) {
		t.Errorf("node acting as an unknown key: %v; want ErrActorRefused", err)
	}
	if _, err := keys.RevokeKey(b.ctx, owner, adminID); err != nil {
		t.Fatal(err)
	}
	if _, err := node.WithActorSecret("s").UpdateTenant(b.ctx, tenant.UpdateTenantParams{Actor: "key:" + adminID, TenantID: "acme",
		Quotas: &tenant.Quotas{}}); !errors.Is(err, tenant.ErrActorRefused) {
		t.Errorf("node acting as a revoked admin key: %v; want ErrActorRefused", err)
	}
	for _, stmt := range []string{
		"UPDATE api_key SET revoked_at = NULL, revoked_by = NULL",
		"INSERT INTO api_key (key_id, scopes, secret_sha256, created_by) VALUES ('fk_1111111111111111', '{admin}', '\\x00', 'x')",
		"DELETE FROM api_key",
		"UPDATE tenant SET max_run_tokens = NULL",
		"INSERT INTO admin_action (actor, action) VALUES ('x', 'a.b')",
		"SELECT admin_log('x', 'a.b', NULL, NULL)",
	} {
		if _, err := nodePool.Exec(b.ctx, stmt); sqlState(err) != "42501" {
			t.Errorf("as the admin role, %s: %v; want insufficient_privilege", stmt, err)
		}
	}
}

// TestKeyRateBucket: a key's bucket starts full (its burst passes at once)
// and then refuses, fleet-wide, in database time.
func TestKeyRateBucket(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys := store.NewKeys(b.pool, nil)
	id := "fk_00000000000000c1"
	if err := keys.DefineKeyRate(b.ctx, id, 3); err != nil {
		t.Fatal(err)
	}
	if err := keys.DefineKeyRate(b.ctx, id, 3); err != nil { // idempotent: no refill
		t.Fatal(err)
	}
	for i := range 3 {
		if wait, err := keys.TakeKeyRequest(b.ctx, id); err != nil || wait != 0 {
			t.Fatalf("request %d: wait %s, %v; want granted (a full bucket of 3)", i+1, wait, err)
		}
	}
	if wait, err := keys.TakeKeyRequest(b.ctx, id); err != nil || wait <= 0 {
		t.Errorf("request 4: wait %s, %v; want refused with a wait", wait, err)
	}
	if err := keys.DefineKeyRate(b.ctx, id, 0); err == nil {
		t.Error("DefineKeyRate(0) accepted; want an error naming requests_per_minute")
	}
}
