package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// chromiumPath is the headless browser the console test drives: the
// distribution's Chromium ($FANOUT_CHROMIUM to name another). A machine
// without one fails the test saying how to get it; it never skips.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("FANOUT_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("the console test needs Chromium: apt-get install -y chromium (Debian/Ubuntu; .ci/run installs it), " +
		"or set FANOUT_CHROMIUM to a Chrome or Chromium binary")
	return ""
}

// axeSource is axe-core's script, pinned in console/web/package.json and
// installed by make console (npm ci); the test fails saying so without it.
func axeSource(t *testing.T) string {
	t.Helper()
	path := filepath.Join("..", "..", "console", "web", "node_modules", "axe-core", "axe.min.js")
	if p := os.Getenv("FANOUT_AXE"); p != "" {
		path = p
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the console test checks accessibility with axe-core: run make console (npm ci in console/web) first: %v", err)
	}
	return string(b)
}

// browser is one headless Chromium tab, with a screenshot on failure.
type browser struct {
	t   *testing.T
	ctx context.Context
	dir string // screenshots
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	opts := append(append([]chromedp.ExecAllocatorOption{}, chromedp.DefaultExecAllocatorOptions[:]...),
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1500))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	b := &browser{t: t, ctx: ctx, dir: screenshotDir(t)}
	if err := chromedp.Do(ctx); err != nil { // starts the browser, on a context with no deadline
		t.Fatalf("start Chromium: %v", err)
	}
	return b
}

// screenshotDir is where the test leaves its screenshots when it fails:
// $FANOUT_SCREENSHOTS, else .tmp/console-screenshots in the checkout.
func screenshotDir(t *testing.T) string {
	if d := os.Getenv("FANOUT_SCREENSHOTS"); d != "" {
		return d
	}
	return filepath.Join("..", "..", ".tmp", "console-screenshots")
}

// run runs actions with a deadline of its own; on failure it writes a
// screenshot named for what and fails the test.
// screenshotTo writes the window to path, if path is set.
func (b *browser) screenshotTo(t *testing.T, path string) {
	t.Helper()
	if path == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

func (b *browser) run(what string, timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v (screenshot: %s)", what, err, b.screenshot(what))
	}
}

// screenshot writes the page as PNG under the screenshot directory.
func (b *browser) screenshot(what string) string {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		return "none: " + err.Error()
	}
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(b.t.Name()+"-"+what)) + ".png"
	path := filepath.Join(b.dir, name)
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		return "none: " + err.Error()
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		return "none: " + err.Error()
	}
	abs, _ := filepath.Abs(path)
	return abs
}

// failed screenshots the page and fails the test with msg.
func (b *browser) failed(what, format string, args ...any) {
	b.t.Helper()
	b.t.Errorf("%s: %s (screenshot: %s)", what, fmt.Sprintf(format, args...), b.screenshot(what))
}

// waitFor polls the page with js (an expression) until it is true, within
// timeout; on timeout it fails with what and a screenshot.
func (b *browser) waitFor(what, js string, timeout time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: not within %s (last error %v; screenshot: %s)", what, timeout, err, b.screenshot(what))
		}
		time.Sleep(100 * time.Millisecond) // a poll of the page, not synchronization: every wait has its deadline above
	}
}

// text is what js evaluates to, as a string.
func (b *browser) text(js string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
	if err != nil {
		b.t.Fatalf("read %s: %v (screenshot: %s)", js, err, b.screenshot("read"))
	}
	return s
}

// signIn opens the console at base and signs in with key.
func (b *browser) signIn(base, key string) {
	b.t.Helper()
	b.run("open the console", 30*time.Second,
		chromedp.Navigate(base+"/console/"),
		chromedp.WaitVisible(chromedp.CSS("#sign-in-key")),
		chromedp.SendKeys(chromedp.CSS("#sign-in-key"), key),
		chromedp.Click(chromedp.CSS("#sign-in-submit")))
	b.waitFor("the runs page after sign-in", `!!document.querySelector("#runs-table, #runs-status")`, 20*time.Second)
}

// axeFindings runs axe-core on the page and returns its serious and
// critical violations, one line each.
func (b *browser) axeFindings(axe string) []string {
	b.t.Helper()
	type finding struct {
		ID     string `json:"id"`
		Impact string `json:"impact"`
		Help   string `json:"help"`
		Nodes  int    `json:"nodes"`
	}
	js := axe + `;
(async () => {
  const r = await axe.run(document, {resultTypes: ["violations"]});
  return r.violations.filter(v => v.impact === "serious" || v.impact === "critical")
    .map(v => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.length}));
})()`
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	found, err := chromedp.Run(ctx, chromedp.Evaluate[[]finding](js, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("axe-core: %v (screenshot: %s)", err, b.screenshot("axe"))
	}
	var out []string
	for _, f := range found {
		out = append(out, fmt.Sprintf("%s (%s): %s, %d nodes", f.ID, f.Impact, f.Help, f.Nodes))
	}
	return out
}

// TestConsoleInABrowser (issue 29): the web console in headless Chromium,
// against a real orchestrator with API keys, its HTTP listener and two
// workers: sign in; start the demo run from the console and watch it live
// (RUNNING seen, then BUDGET_EXHAUSTED), the exhaustion marker drawn across
// the timeline, the joined facts; cancel a second run from its page;
// approve one waiting write and deny another from a third run's page (the
// approved one sent, the denied one not, with its reason); spend in USD; a
// second tenant's key sees neither run (not in its list, NOT_FOUND by id);
// axe-core finds nothing serious or critical on the sign-in, runs, run and
// spend pages. On failure it leaves screenshots (.tmp/console-screenshots
// or $FANOUT_SCREENSHOTS); with FANOUT_CONSOLE_SCREENSHOT=FILE it writes the
// finished run's page there (docs/http.md's picture, make console-screenshot).
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	axe := axeSource(t)
	b := newBrowser(t)
	// The built-in write (note) waits for approval: decided from the run page.
	cfg := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(cfg, []byte("builtin:\n  - {name: note, approval: required, approval_timeout: 2m}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wf := []string{"--sim-latency", "150ms", "--mcp-config", cfg}
	c := startWorkers(t, [][]string{wf, wf})
	o := startOrchestratorMain(t, c.url, c.workers, "--auth", "keys", "--http-listen", "127.0.0.1:0", "--console", "--mcp-config", cfg)
	admin(t, c.url, "tenant", "create", "acme")
	admin(t, c.url, "tenant", "create", "globex")
	acme := newKey(t, c.url, "--tenant", "acme", "--scopes", "run,read,cancel,audit,approve")
	globex := newKey(t, c.url, "--tenant", "globex", "--scopes", "run,read,cancel,audit")
	if _, err := c.pool.Exec(t.Context(), `SELECT price_set('role:' || current_user, 'sim', now() - interval '1 day', 3, 15, 'USD', 'test price')`); err != nil {
		t.Fatal(err)
	}

	b.signIn(o.http, acme)
	if f := b.axeFindings(axe); len(f) > 0 {
		b.failed("axe on the runs page", "serious or critical findings:\n%s", strings.Join(f, "\n"))
	}

	// The demo run, started from the console's New run page (its spec is
	// the demo's), watched live until its budget runs out.
	b.run("start the demo run", 30*time.Second,
		chromedp.Navigate(o.http+"/console/#/new"),
		chromedp.WaitVisible(chromedp.CSS("#new-run-spec")),
		chromedp.Click(chromedp.CSS("#new-run-submit")))
	b.waitFor("the run page", `!!document.querySelector("#run-state") && location.hash.startsWith("#/runs/")`, 30*time.Second)
	runID := strings.TrimPrefix(b.text(`location.hash`), "#/runs/")
	b.waitFor("the run seen RUNNING, live", `document.querySelector("#run-state").dataset.state === "RUN_STATE_RUNNING"`, 30*time.Second)
	b.waitFor("the run seen BUDGET_EXHAUSTED", `document.querySelector("#run-state").dataset.state === "RUN_STATE_BUDGET_EXHAUSTED"`, 120*time.Second)
	b.waitFor("the exhaustion marker across the timeline", `!!document.querySelector("#budget-exhausted-marker")`, 20*time.Second)
	b.waitFor("the joined facts", `document.querySelectorAll("#facts li").length > 0`, 20*time.Second)
	run, err := keyClient(t, o.addr, acme).GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	if got := run.GetRun().GetState(); got != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
		t.Errorf("the run the console watched is %s over gRPC; want BUDGET_EXHAUSTED", got)
	}
	if f := b.axeFindings(axe); len(f) > 0 {
		b.failed("axe on the run page", "serious or critical findings:\n%s", strings.Join(f, "\n"))
	}
	// The window (1280×1500): the run's state, its tasks and the timeline.
	b.screenshotTo(t, os.Getenv("FANOUT_CONSOLE_SCREENSHOT"))

	// A run that leaves its concurrency unset, on a model whose provider
	// stated 600 RPM and 200,000 TPM: the run page says what it chose and why
	// (docs/operations.md#concurrency-from-the-rate-limits).
	if _, err := c.pool.Exec(t.Context(), `INSERT INTO provider_limit (bucket, model, provider, provider_default, model_default,
		limit_requests, limit_tokens) VALUES ('sim:console', '', 'sim', true, true, 600, 200000)`); err != nil {
		t.Fatal(err)
	}
	cspec := e2eSpec("console-concurrency", 40, 10_000_000)
	cspec.TenantId = "acme"
	cspec.Limits.MaxConcurrency = 0
	cstarted, err := keyClient(t, o.addr, acme).StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: cspec})
	if err != nil {
		t.Fatal(err)
	}
	b.run("open the run sized from the rate limits", 30*time.Second,
		chromedp.Navigate(o.http+"/console/#/runs/"+cstarted.GetRunId()),
		chromedp.WaitVisible(chromedp.CSS("#run-state")))
	b.waitFor("the concurrency chosen from the stated limits", `/\d+ = (600 RPM|200000 TPM) × 0\.7/.test(document.querySelector("#run-concurrency")?.textContent ?? "")`, 30*time.Second)
	b.screenshotTo(t, os.Getenv("FANOUT_CONCURRENCY_SCREENSHOT"))

	// A second run, long (120 tasks one at a time: about a minute, longer
	// than the browser takes to open its page and cancel it on a loaded
	// machine; 40 ended in 20 s before the click), cancelled from its page.
	spec := e2eSpec("console-cancel", 120, 10_000_000)
	spec.TenantId = "acme"
	spec.Limits.MaxConcurrency = 1
	started, err := keyClient(t, o.addr, acme).StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	second := started.GetRunId()
	b.run("open the second run", 30*time.Second,
		chromedp.Navigate(o.http+"/console/#/runs/"+second),
		chromedp.WaitVisible(chromedp.CSS("#cancel-run")),
		chromedp.SendKeys(chromedp.CSS("#cancel-reason"), "from the browser"),
		press("#cancel-run"))
	b.waitFor("the second run CANCELLED", `document.querySelector("#run-state").dataset.state === "RUN_STATE_CANCELLED"`, 60*time.Second)
	got, err := keyClient(t, o.addr, acme).GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: second})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got.GetRun().GetCancelCause(), "from the browser") {
		t.Errorf("the second run's cause %q; want the browser's reason", got.GetRun().GetCancelCause())
	}

	// Writes waiting for approval, decided from the run's page: one
	// approved (sent: done), one denied with a reason (never sent).
	wspec := e2eSpec("console-approvals", 1, 1_000_000)
	wspec.TenantId = "acme"
	wspec.Tasks[0].AllowedTools = []string{"note"}
	wrun, err := keyClient(t, o.addr, acme).StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: wspec})
	if err != nil {
		t.Fatal(err)
	}
	b.run("open the run with writes", 30*time.Second, chromedp.Navigate(o.http+"/console/#/runs/"+wrun.GetRunId()))
	b.waitFor("a write waiting for approval", `!!document.querySelector("#approvals-list li[data-call-id]")`, 60*time.Second)
	approved := b.text(`document.querySelector("#approvals-list li[data-call-id]").dataset.callId`)
	b.run("approve it", 20*time.Second, press(`[data-testid=approve][data-call-id="`+approved+`"]`))
	b.waitFor("the approved write sent", `document.querySelector('#tool-calls-table tr[data-call-id="`+approved+`"]')?.dataset.state === "done"`, 60*time.Second)
	b.waitFor("a second write waiting", `[...document.querySelectorAll("#approvals-list li[data-call-id]")].some(li => li.dataset.callId !== "`+approved+`")`, 60*time.Second)
	denied := b.text(`[...document.querySelectorAll("#approvals-list li[data-call-id]")].find(li => li.dataset.callId !== "` + approved + `").dataset.callId`)
	b.run("deny it", 20*time.Second,
		chromedp.SendKeys(chromedp.CSS("#deny-reason-"+denied), "not in the browser test"),
		press(`[data-testid=deny][data-call-id="`+denied+`"]`))
	b.waitFor("the denied write", `document.querySelector('#tool-calls-table tr[data-call-id="`+denied+`"]')?.dataset.state === "denied"`, 60*time.Second)
	if f := b.axeFindings(axe); len(f) > 0 {
		b.failed("axe on a run page with approvals", "serious or critical findings:\n%s", strings.Join(f, "\n"))
	}
	writes, err := keyClient(t, o.addr, acme).ListToolCalls(t.Context(), &fanoutv1.ListToolCallsRequest{RunId: wrun.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range writes.GetCalls() {
		switch w.GetCallId() {
		case approved:
			if w.GetState() != "done" || !w.GetDecision().GetApproved() {
				t.Errorf("the write approved in the browser: %v; want done, approved", w)
			}
		case denied:
			if w.GetState() != "denied" || w.GetDecision().GetReason() != "not in the browser test" {
				t.Errorf("the write denied in the browser: %v; want denied with its reason", w)
			}
		}
	}
	if _, err := keyClient(t, o.addr, acme).CancelRun(t.Context(), &fanoutv1.CancelRunRequest{RunId: wrun.GetRunId()}); err != nil {
		t.Fatal(err)
	}

	// Spend in money (audit scope).
	b.run("the spend page", 30*time.Second, chromedp.Navigate(o.http+"/console/#/spend"))
	b.waitFor("the day's spend in USD", `(document.querySelector("#spend-table")||{}).textContent?.includes("USD") === true`, 30*time.Second)
	if f := b.axeFindings(axe); len(f) > 0 {
		b.failed("axe on the spend page", "serious or critical findings:\n%s", strings.Join(f, "\n"))
	}

	// Another tenant sees neither run.
	b.run("sign out", 20*time.Second, chromedp.Navigate(o.http+"/console/"), chromedp.WaitVisible(chromedp.CSS("#sign-out")),
		chromedp.Click(chromedp.CSS("#sign-out")), chromedp.WaitVisible(chromedp.CSS("#sign-in-key")))
	if f := b.axeFindings(axe); len(f) > 0 {
		b.failed("axe on the sign-in page", "serious or critical findings:\n%s", strings.Join(f, "\n"))
	}
	b.signIn(o.http, globex)
	b.waitFor("globex's runs list", `!!document.querySelector("#runs-table") || /no runs/i.test(document.querySelector("#runs-status")?.textContent || "")`, 20*time.Second)
	for _, id := range []string{runID, second} {
		if html := b.text(`document.body.innerHTML`); strings.Contains(html, id) {
			b.failed("globex's runs list", "shows acme's run %s", id)
		}
	}
	b.run("globex opens acme's run", 30*time.Second, chromedp.Navigate(o.http+"/console/#/runs/"+runID))
	b.waitFor("acme's run refused to globex", `/not.?found/i.test(document.querySelector("#error")?.textContent || "")`, 20*time.Second)
	if html := b.text(`document.body.innerHTML`); strings.Contains(html, "from the browser") || strings.Contains(html, "RUN_STATE_BUDGET_EXHAUSTED") {
		b.failed("globex on acme's run", "the page shows acme's run")
	}

	// The key never left memory and session storage: not in the URL, not in
	// local storage, not in a cookie.
	type kept struct {
		URL, Local, Cookie string
	}
	lctx, lcancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer lcancel()
	leaks, err := chromedp.Run(lctx, chromedp.Evaluate[kept](
		`({URL: location.href, Local: JSON.stringify(localStorage), Cookie: document.cookie})`))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{acme, globex} {
		secret := strings.SplitN(key, "_", 4)[3]
		raw, _ := json.Marshal(leaks)
		if strings.Contains(string(raw), secret) {
			t.Errorf("a key's secret is in the URL, local storage or a cookie: %s", raw)
		}
	}
	if written := o.logs.all(); strings.Contains(written, strings.SplitN(acme, "_", 4)[3]) {
		t.Error("acme's key is in the orchestrator's log")
	}
}

// press clicks the element sel selects on a page that changes as a run
// runs: the click is dispatched to the element itself once it is visible.
// (chromedp.Click clicks at the element's coordinates, read a moment
// before: a live page whose tables grow meanwhile moves the element, and
// the click lands beside it; make test lost an approval so on a loaded
// machine.)
func press(sel string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		if _, err := chromedp.WaitVisible(chromedp.CSS(sel))(ctx, t); err != nil {
			return chromedp.Void{}, err
		}
		_, err := chromedp.Evaluate[any](fmt.Sprintf(`document.querySelector(%s).click()`, strconv.Quote(sel)))(ctx, t)
		return chromedp.Void{}, err
	}
}

// TestConsoleWithAuthOffOpensOnTheRuns: against a server with
// authentication off (fanout dev's --auth none) the console asks the server
// and opens on the runs page — no sign-in form, no sign-out button, the
// note that authentication is off shown.
func TestConsoleWithAuthOffOpensOnTheRuns(t *testing.T) {
	t.Parallel()
	b := newBrowser(t)
	c := startWorkers(t, [][]string{nil})
	o := startOrchestratorMain(t, c.url, c.workers, "--auth", "none", "--http-listen", "127.0.0.1:0", "--console")
	b.run("open the console", 30*time.Second, chromedp.Navigate(o.http+"/console/"))
	b.waitFor("the runs page", `!!document.querySelector("#runs-table, #runs-status")`, 20*time.Second)
	if got := b.text(`String(!!document.querySelector("#sign-in-key")) + " " +
		String(document.getElementById("sign-out").hidden) + " " + String(document.getElementById("auth-note").hidden)`); got != "false true false" {
		t.Errorf("sign-in form shown, sign-out hidden, auth note hidden = %s, want false true false", got)
	}
}
