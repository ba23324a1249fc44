package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/encoding/protojson"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// TestCanaryKeyNeverWritten starts a real `fanout worker` process with a
// canary OPENAI_API_KEY in its environment, pointed at an in-repo
// OpenAI-compatible server, with everything a deployment could turn on:
// debug logs, content capture on spans, spans and metrics exported to
// stdout, the Prometheus endpoint and the fleet's rate limiter (its buckets
// live in Postgres). A run makes it call the provider: an attempt answered
// 500 and retried, an answer, a compression call answered 400 and a task
// answered 403, each error echoing the key. Then it greps, for any 8-byte
// piece of the key, everything the worker wrote: its stderr and stdout to
// the end (after a graceful stop flushes the exporters), its /metrics, every
// table of the database, and what it sent back (the run's events and the
// orchestrator's logs).
func TestCanaryKeyNeverWritten(t *testing.T) {
	t.Parallel()
	// No 8-byte piece of it is hexadecimal only: it cannot pass for a
	// trace, span or key id.
	const canary = "sk-canary-proc-Vx7Qm2Wz9Kp4Rt6Hn3Lb8Jd"
	var mu sync.Mutex
	seen := map[string]int{} // requests per task
	srv := llmtest.New(llmtest.Config{Provider: llmtest.OpenAI, Key: canary, Script: func(r llmtest.Request) llmtest.Reply {
		b, _ := json.Marshal(r.Messages) // a []map[string]any always marshals
		task := "t00"
		if strings.Contains(string(b), "look up item 1") {
			task = "t01"
		}
		mu.Lock()
		seen[task]++
		n := seen[task]
		mu.Unlock()
		switch {
		case task == "t01":
			return llmtest.Reply{Status: http.StatusForbidden, Message: "key " + canary + " is not allowed here"}
		case n == 1: // retried by the provider, which logs the retry with the key's id
			return llmtest.Reply{Status: http.StatusInternalServerError, Message: "overloaded, key " + canary}
		case r.Schema != "": // the compression call: the task keeps its local facts and says why
			return llmtest.Reply{Status: http.StatusBadRequest, Message: "bad request for key " + canary}
		}
		return llmtest.Reply{Text: `{"facts": [{"text": "a fact about item 0", "sources": ["https://example.test/0"]}]}`}
	}})
	t.Cleanup(srv.Close)

	url := storetest.NewDB(t)
	pool := openPool(t, url)
	w := startWorkerProcEnv(t, url, "w1",
		[]string{"OPENAI_API_KEY=" + canary, "OPENAI_BASE_URL=" + srv.BaseURL(),
			"OTEL_TRACES_EXPORTER=console", "OTEL_METRICS_EXPORTER=console"},
		"--provider", "openai", "--openai-model", "test-model", "--log-level", "debug", "--capture-content",
		"--metrics-listen", "127.0.0.1:0", "--rpm", "6000", "--tpm", "6000000", "--retry-attempts", "3")
	o := startOrchestratorMain(t, url, []*workerProc{w})

	s := e2eSpec("canary", 2, 1_000_000)
	s.Model = &fanoutv1.ModelSettings{Provider: "openai", Model: "test-model", MaxOutputTokens: 200}
	evs := runAll(t, o.client, s)
	fin := evs[len(evs)-1].GetRunFinished()
	checkOutcomes(t, s, fin.GetResult().GetTasks())
	want := []fanoutv1.TaskStatus{fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, fanoutv1.TaskStatus_TASK_STATUS_FAILED}
	for i, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != want[i] {
			t.Errorf("task %s ended %s (%s), want %s", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError(), want[i])
		}
	}
	// The worker called the provider with the canary key: what it wrote
	// had the key to leak.
	reqs := srv.Requests()
	if len(reqs) < 4 {
		t.Errorf("the provider saw %d requests, want at least 4 (500 and its retry, compression, 403)", len(reqs))
	}
	for _, r := range reqs {
		if !r.AuthOK {
			t.Errorf("request %d to the provider did not carry the canary key", r.N)
		}
	}

	// Where the worker wrote, each with a positive control: the text must
	// hold what it is known to hold, or a grep of it would prove nothing.
	type written struct{ where, text, mustHold string }
	var out []written
	metrics := scrapeMetrics(t, w.logs.all())
	out = append(out, written{"the worker's /metrics", metrics, "fanout_"})
	out = append(out, written{"the database (every table)", dumpTables(t, pool), "[REDACTED]"})
	var events strings.Builder
	for _, ev := range evs {
		b, err := protojson.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		events.Write(b)
		events.WriteByte('\n')
	}
	out = append(out, written{"the run's events", events.String(), "[REDACTED]"})
	out = append(out, written{"the orchestrator's logs", o.logs.all(), "orchestrator serving"})
	// Stop the worker as a deployment does (SIGTERM): the exporters flush
	// their spans and metrics to stdout on the way out.
	w.stop(t)
	select {
	case <-w.exited:
	default:
		t.Fatal("the worker was stopped but has not exited")
	}
	out = append(out,
		written{"the worker's stderr", w.logs.all(), "model call retried"},
		written{"the worker's stdout (spans)", w.stdout.String(), "gen_ai.input.messages"},
		written{"the worker's stdout (metrics)", w.stdout.String(), "fanout.subagent"})
	for _, wr := range out {
		t.Logf("searched %s: %d bytes", wr.where, len(wr.text))
		if !strings.Contains(wr.text, wr.mustHold) {
			t.Errorf("%s does not hold %q: grepping it for the key would prove nothing (%d bytes)", wr.where, wr.mustHold, len(wr.text))
		}
		if p, ok := llmtest.LeakedPiece(wr.text, canary); ok {
			t.Errorf("%s holds a piece of the API key (%q):\n%s", wr.where, p, llmtest.LinesHolding(wr.text, p))
		}
	}
}

// scrapeMetrics GETs the /metrics endpoint a node announced in its logs.
func scrapeMetrics(t *testing.T, logs string) string {
	t.Helper()
	var addr string
	for _, line := range strings.Split(logs, "\n") {
		var rec struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "metrics" && rec.Addr != "" {
			addr = rec.Addr
			break
		}
	}
	if addr == "" {
		t.Fatalf("the worker announced no /metrics address:\n%s", logs)
	}
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", addr, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", addr, resp.Status, err)
	}
	return string(b)
}

// dumpTables returns every row of every table of the database as text,
// and the raw bytes of every bytea column (a bytea's text form is hex,
// which no grep would match; runs, tasks and events are jsonb since schema
// 7, searched as their text).
func dumpTables(t *testing.T, pool *store.Pool) string {
	t.Helper()
	ctx := context.Background()
	type column struct{ Table, Column string }
	rows, err := pool.Query(ctx, `SELECT format('%I.%I', c.table_schema, c.table_name),
			coalesce(string_agg(format('%I', c.column_name), ',') FILTER (WHERE c.data_type = 'bytea'), '')
		  FROM information_schema.columns c JOIN information_schema.tables t USING (table_schema, table_name)
		 WHERE t.table_type = 'BASE TABLE' AND t.table_schema NOT IN ('pg_catalog', 'information_schema')
		 GROUP BY 1 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowToStructByPos[column])
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) == 0 {
		t.Fatal("the database has no tables to search")
	}
	var b strings.Builder
	for _, tc := range tables {
		// Names come from the catalog, quoted by format('%I').
		var text string
		if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(t::text, E'\n'), '') FROM `+tc.Table+` t`).Scan(&text); err != nil {
			t.Fatalf("read %s: %v", tc.Table, err)
		}
		fmt.Fprintf(&b, "-- %s\n%s\n", tc.Table, text)
		for _, col := range strings.Split(tc.Column, ",") {
			if col == "" {
				continue
			}
			rows, err := pool.Query(ctx, `SELECT `+col+` FROM `+tc.Table+` WHERE `+col+` IS NOT NULL`)
			if err != nil {
				t.Fatal(err)
			}
			raws, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
			if err != nil {
				t.Fatalf("read %s.%s: %v", tc.Table, col, err)
			}
			fmt.Fprintf(&b, "-- %s.%s, raw\n", tc.Table, col)
			for _, raw := range raws {
				b.Write(raw)
				b.WriteByte('\n')
			}
		}
	}
	return b.String()
}
