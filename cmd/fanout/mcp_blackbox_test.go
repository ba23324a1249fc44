package main

// The black-box test of issue 13: subagents on two worker processes call a
// real MCP server nobody here wrote (@modelcontextprotocol/server-memory,
// pinned in .ci/mcp), through a shim that records every tools/call.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"sigs.k8s.io/yaml"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent/mcp"
)

// The shim's environment (set through the MCP config's env entries: a
// stdio server's environment is PATH, HOME and those only).
const (
	// envMCPShim, when set in the environment of this test binary, makes
	// it the recording shim in front of the Node.js MCP server script it
	// names (TestMain) instead of running the tests.
	envMCPShim = "FANOUT_MCP_SHIM"
	// envMCPShimDir is the directory where each shim process appends its
	// records, to shim-PID.jsonl.
	envMCPShimDir = "FANOUT_MCP_SHIM_DIR"
	// envMCPShimDelay holds back the server's answers to some tools:
	// "tool=duration,tool=duration". It is the server's latency, not a
	// synchronization: the test asserts nothing about it.
	envMCPShimDelay = "FANOUT_MCP_SHIM_DELAY"
)

// serverMemoryScript is where scripts/ensure-mcp-servers.sh installs
// server-memory, relative to the repository's root.
const serverMemoryScript = ".ci/mcp/node_modules/@modelcontextprotocol/server-memory/dist/index.js"

// shimRecord is one line of a shim's record: a tools/call request from
// the worker, or the server's answer to one.
type shimRecord struct {
	Shim int    `json:"shim"` // the shim's process id: one per session
	Kind string `json:"kind"` // "request" or "response"
	ID   string `json:"id"`   // the JSON-RPC id, as JSON
	Tool string `json:"tool"`
	// At is when the shim read the request from the worker, or when it
	// forwarded the answer to the worker (Unix nanoseconds; one machine,
	// one clock for every shim).
	At        int64           `json:"at"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	Meta      map[string]any  `json:"meta,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`  // the result's isError
	RPCError  string          `json:"rpc_error,omitempty"` // a JSON-RPC error's message
}

// mcpShimMain is the shim: it starts `node SCRIPT` (server-memory), copies
// the worker's stdin to it and its stdout to the worker line by line
// (stdio MCP is newline-delimited JSON-RPC), and appends a record of each
// tools/call request and of each answer to one. It returns the server's
// exit code.
func mcpShimMain() int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "mcp shim: "+format+"\n", args...)
		return 2
	}
	delays, err := parseShimDelays(os.Getenv(envMCPShimDelay))
	if err != nil {
		return fail("%s: %v", envMCPShimDelay, err)
	}
	rec, err := os.OpenFile(filepath.Join(os.Getenv(envMCPShimDir), fmt.Sprintf("shim-%d.jsonl", os.Getpid())),
		os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fail("open the record: %v", err)
	}
	defer func() { _ = rec.Close() }() // Every record was written with its own write.
	cmd := exec.Command("node", os.Getenv(envMCPShim))
	cmd.Stderr = os.Stderr // the worker logs it
	// The server must not outlive the shim, however the shim ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	toServer, err := cmd.StdinPipe()
	if err != nil {
		return fail("%v", err)
	}
	fromServer, err := cmd.StdoutPipe()
	if err != nil {
		return fail("%v", err)
	}
	if err := cmd.Start(); err != nil {
		return fail("start node %s: %v", os.Getenv(envMCPShim), err)
	}
	s := &shim{rec: rec, pid: os.Getpid(), pending: map[string]string{}}

	// The worker's requests, to the server; its EOF closes the server's stdin.
	go func() {
		defer func() { _ = toServer.Close() }() // The server sees EOF and exits.
		r := bufio.NewReader(os.Stdin)
		for {
			line, err := r.ReadBytes('\n')
			if len(line) > 0 {
				s.request(line)
				if _, werr := toServer.Write(line); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()

	// The server's answers, to the worker, some held back.
	var held sync.WaitGroup
	r := bufio.NewReader(fromServer)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			if d := delays[s.toolOf(line)]; d > 0 {
				held.Go(func() {
					time.Sleep(d) // the server's simulated latency for this tool
					s.forward(line)
				})
			} else {
				s.forward(line)
			}
		}
		if err != nil {
			break
		}
	}
	held.Wait()
	if err := cmd.Wait(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		return fail("wait for node: %v", err)
	}
	return 0
}

// shim is the state of a recording shim.
type shim struct {
	rec *os.File
	pid int

	mu      sync.Mutex        // the record, stdout and pending
	pending map[string]string // id -> tool of the calls not answered yet
}

// request records line if it is a tools/call.
func (s *shim) request(line []byte) {
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
			Meta      map[string]any  `json:"_meta"`
		} `json:"params"`
	}
	if json.Unmarshal(line, &msg) != nil || msg.Method != "tools/call" {
		return
	}
	at := time.Now().UnixNano()
	id := compactJSON(msg.ID)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending[id] = msg.Params.Name
	s.write(shimRecord{Shim: s.pid, Kind: "request", ID: id, Tool: msg.Params.Name, At: at,
		Arguments: msg.Params.Arguments, Meta: msg.Params.Meta})
}

// toolOf returns the tool of the call line answers, "" if it answers none.
func (s *shim) toolOf(line []byte) string {
	var msg struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(line, &msg) != nil || len(msg.ID) == 0 {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending[compactJSON(msg.ID)]
}

// forward writes line to the worker, recording it first if it answers a
// tools/call (so the record's time is before the worker can have it).
func (s *shim) forward(line []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Result *struct {
			IsError bool `json:"isError"`
		} `json:"result"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(line, &msg) == nil && len(msg.ID) > 0 {
		id := compactJSON(msg.ID)
		if tool, ok := s.pending[id]; ok {
			delete(s.pending, id)
			r := shimRecord{Shim: s.pid, Kind: "response", ID: id, Tool: tool, At: time.Now().UnixNano()}
			if msg.Result != nil {
				r.IsError = msg.Result.IsError
			}
			if msg.Error != nil {
				r.RPCError = msg.Error.Message
			}
			s.write(r)
		}
	}
	_, _ = os.Stdout.Write(line) // A worker that went away is the server's EOF too.
}

func (s *shim) write(r shimRecord) {
	b, err := json.Marshal(r)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mcp shim: record: %v\n", err)
		return
	}
	if _, err := s.rec.Write(append(b, '\n')); err != nil {
		fmt.Fprintf(os.Stderr, "mcp shim: record: %v\n", err)
	}
}

func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

func parseShimDelays(spec string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, kv := range strings.Split(spec, ",") {
		if kv == "" {
			continue
		}
		tool, d, ok := strings.Cut(kv, "=")
		dur, err := time.ParseDuration(d)
		if !ok || err != nil {
			return nil, fmt.Errorf("%q is not tool=duration", kv)
		}
		out[tool] = dur
	}
	return out, nil
}

// readShimRecords reads every shim's records in dir.
func readShimRecords(t *testing.T, dir string) []shimRecord {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "shim-*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []shimRecord
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			var r shimRecord
			if err := json.Unmarshal(line, &r); err != nil {
				t.Fatalf("%s line %d: %v", f, i+1, err)
			}
			out = append(out, r)
		}
	}
	return out
}

// maxOutstanding returns the most calls of tool that were between their
// request and their answer at once, over every shim. At equal times an
// answer counts first, so a tie never makes two.
func maxOutstanding(recs []shimRecord, tool string) int {
	type ev struct {
		at    int64
		delta int
	}
	var evs []ev
	for _, r := range recs {
		if r.Tool != tool {
			continue
		}
		d := 1
		if r.Kind == "response" {
			d = -1
		}
		evs = append(evs, ev{r.At, d})
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at != evs[j].at {
			return evs[i].at < evs[j].at
		}
		return evs[i].delta < evs[j].delta
	})
	n, most := 0, 0
	for _, e := range evs {
		n += e.delta
		most = max(most, n)
	}
	return most
}

// repoRoot is the repository's root (the tests run in cmd/fanout).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// serverMemory returns the path of server-memory's script, failing (never
// skipping) with what to run if it is not installed, or if Node.js is not.
// memoryServerConfig writes an MCP configuration of one server, "memory":
// server-memory over stdio behind the recording shim (this test binary),
// with tools and extra environment entries, and returns its path, the
// directory the shim records each tools/call in, and server-memory's file.
func memoryServerConfig(t *testing.T, tools []any, env ...map[string]string) (cfg, shimDir, memoryFile string) {
	t.Helper()
	script := serverMemory(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	shimDir = filepath.Join(dir, "calls")
	if err := os.Mkdir(shimDir, 0o700); err != nil {
		t.Fatal(err)
	}
	memoryFile = filepath.Join(dir, "memory.jsonl")
	entries := []any{
		map[string]string{"name": envMCPShim, "value": script},
		map[string]string{"name": envMCPShimDir, "value": shimDir},
		map[string]string{"name": "MEMORY_FILE_PATH", "value": memoryFile},
	}
	for _, e := range env {
		entries = append(entries, e)
	}
	cfg = writeYAML(t, dir, "mcp.yaml", map[string]any{"servers": []any{map[string]any{
		"name": "memory", "transport": "stdio", "command": exe, "args": []string{"-test.run=^$"},
		"env": entries, "connect_timeout": "30s", "tools": tools,
	}}})
	return cfg, shimDir, memoryFile
}

func serverMemory(t *testing.T) string {
	t.Helper()
	script := filepath.Join(repoRoot(t), serverMemoryScript)
	if _, err := os.Stat(script); err != nil {
		t.Fatalf("the MCP black-box test runs @modelcontextprotocol/server-memory from npm, which is not installed "+
			"(%v): run scripts/ensure-mcp-servers.sh (make test runs it)", err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("the MCP black-box test runs server-memory with Node.js, which is not on PATH (%v): "+
			"install Node.js 18 or later (Debian: sudo apt-get install -y nodejs npm)", err)
	}
	return script
}

// writeYAML writes v as YAML to dir/name and returns its path.
func writeYAML(t *testing.T, dir, name string, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The black-box run's shape: each task's sim calls the two tools
// round-robin, sim-tool-calls a reply for sim-finish-after - 1 replies,
// so each reply is write, read, write, read.
const (
	bbTasks        = 12
	bbCallsPerTurn = 4
	bbFinishAfter  = 3
	bbWrites       = bbTasks * (bbFinishAfter - 1) * bbCallsPerTurn / 2
	bbReads        = bbWrites
	// bbReadDelay is server-memory's latency for search_nodes (it answers
	// in about a millisecond): long enough that the reads of subagents
	// whose turns come together overlap at the server whatever the
	// scheduling of a small machine, short enough not to matter.
	bbReadDelay = 250 * time.Millisecond
)

// TestMCPBlackBoxServerMemory is issue 13's black box: 12 subagents on two
// worker processes call server-memory's create_entities (a write, with
// max_in_flight: 1) and search_nodes (a read) over stdio, each worker
// through a shim that records every tools/call. The run succeeds; every
// write reached the server exactly once, with the idempotency key of a
// tool_call row that is done and whose digest is of the arguments the
// server got, in each task's call order; never two writes were outstanding
// at once across both workers (the bound is the fleet's), while reads were
// (the positive control: the shims see overlap when there is some); the
// entities are in the server's memory file; the ledger is conserved.
func TestMCPBlackBoxServerMemory(t *testing.T) {
	t.Parallel()
	// One memory file for both workers' server processes: the fleet-wide
	// bound on writes is what keeps server-memory's read-modify-write of
	// it from losing an entity.
	cfg, shimDir, memoryFile := memoryServerConfig(t, []any{
		map[string]any{"name": "create_entities", "effect": "write", "max_in_flight": 1},
		map[string]any{"name": "search_nodes", "effect": "read"},
	}, map[string]string{"name": envMCPShimDelay, "value": "search_nodes=" + bbReadDelay.String()})

	url := storetest.NewDB(t)
	pool := openPool(t, url)
	flags := []string{"--mcp-config", cfg, "--sim-tool-calls", fmt.Sprint(bbCallsPerTurn),
		"--sim-finish-after", fmt.Sprint(bbFinishAfter), "--sim-latency", "50ms",
		"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep}
	w1 := startWorkerProc(t, url, "w1", flags...)
	w2 := startWorkerProc(t, url, "w2", flags...)
	o := startOrchestratorMain(t, url, []*workerProc{w1, w2}, "--mcp-config", cfg,
		"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep)
	waitFleetConnected(t, o.client, 2) // the claim needs tasks on both workers

	write, read := mcp.ModelName("memory", "create_entities"), mcp.ModelName("memory", "search_nodes")
	s := e2eSpec("mcp-black-box", bbTasks, 5_000_000)
	for _, task := range s.GetTasks() {
		task.AllowedTools = []string{write, read}
	}
	started := time.Now()
	evs := runAll(t, o.client, s)
	t.Logf("the run took %s", time.Since(started).Round(time.Millisecond))
	runID := evs[0].GetRunId()
	fin := evs[len(evs)-1].GetRunFinished()
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("run ended %s (%s), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	checkOutcomes(t, s, fin.GetResult().GetTasks())
	workers := map[string]int{}
	for _, o := range fin.GetResult().GetTasks() {
		workers[o.GetWorker()]++
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || len(o.GetSummary().GetFailed()) > 0 {
			t.Errorf("task %s ended %s (%s), failed calls %q; want SUCCEEDED with none failed", o.GetTaskId(),
				o.GetStatus(), o.GetSummary().GetError(), o.GetSummary().GetFailed())
		}
	}

	recs := readShimRecords(t, shimDir)
	checkAnswered(t, recs)
	var writes, reads []shimRecord
	shims := map[int]int{} // shim -> writes it saw
	for _, r := range recs {
		switch {
		case r.Kind != "request":
		case r.Tool == "create_entities":
			writes = append(writes, r)
			shims[r.Shim]++
		case r.Tool == "search_nodes":
			reads = append(reads, r)
		default:
			t.Errorf("the server was called with tool %q, which no task may call", r.Tool)
		}
	}
	t.Logf("%d writes, %d reads through %d shims; tasks per worker %v", len(writes), len(reads), len(shims), workers)
	if len(writes) != bbWrites || len(reads) != bbReads {
		t.Errorf("the server got %d create_entities and %d search_nodes calls, want %d and %d", len(writes), len(reads), bbWrites, bbReads)
	}
	if len(shims) != 2 || len(workers) != 2 {
		t.Errorf("writes went through %d shims (%v) from tasks on %d workers (%v), want 2 each: "+
			"the fleet-wide bound was not put to the test", len(shims), shims, len(workers), workers)
	}
	for _, r := range reads {
		if _, ok := r.Meta[mcp.MetaIdempotencyKey]; ok {
			t.Errorf("read %s %s carries an idempotency key: %v", r.Tool, r.Arguments, r.Meta)
		}
	}
	checkWritesOnce(t, pool, runID, writes)

	if n := maxOutstanding(recs, "create_entities"); n != 1 {
		t.Errorf("create_entities calls outstanding at once at the server, over both workers: at most %d, want exactly 1 (max_in_flight: 1)", n)
	}
	if n := maxOutstanding(recs, "search_nodes"); n < 2 {
		t.Errorf("search_nodes calls outstanding at once: at most %d, want at least 2 (reads run in parallel)", n)
	} else {
		t.Logf("search_nodes calls outstanding at once: up to %d", n)
	}
	// And on one session: a worker runs its subagents' reads in parallel
	// over its one session, not one at a time.
	byShim := map[int][]shimRecord{}
	for _, r := range recs {
		byShim[r.Shim] = append(byShim[r.Shim], r)
	}
	for shim, rs := range byShim {
		if n := maxOutstanding(rs, "search_nodes"); n < 2 {
			t.Errorf("search_nodes calls outstanding at once on the session of shim %d: at most %d, want at least 2", shim, n)
		}
	}
	checkMemoryFile(t, memoryFile, writes)
	checkConserved(t, pool, runID)
}

// checkAnswered checks that every recorded call was answered once, and
// not as an error.
func checkAnswered(t *testing.T, recs []shimRecord) {
	t.Helper()
	type call struct {
		shim int
		id   string
	}
	asked := map[call]int{}
	for _, r := range recs {
		c := call{r.Shim, r.ID}
		switch r.Kind {
		case "request":
			asked[c]++
		case "response":
			asked[c]--
			if r.IsError || r.RPCError != "" {
				t.Errorf("server-memory answered call %s (%s) with an error: isError %v, %q", r.ID, r.Tool, r.IsError, r.RPCError)
			}
		}
	}
	for c, n := range asked {
		if n != 0 {
			t.Errorf("call %s of shim %d: %d requests more than answers", c.id, c.shim, n)
		}
	}
}

// checkWritesOnce checks that each write the server got carries the key of
// a tool_call row of the run, one request per row: done, of the server's
// tool, its digest that of the arguments the server got; and that each
// task's writes reached the server in call order.
func checkWritesOnce(t *testing.T, pool *store.Pool, runID string, writes []shimRecord) {
	t.Helper()
	type row struct {
		Key, Server, Tool, State, ArgsDigest, TaskID string
		Attempt                                      int64
		Iteration, CallIndex                         int32
	}
	rows, err := pool.Query(context.Background(), `SELECT key, server, tool, state, args_digest, task_id, attempt, iteration, call_index
		FROM tool_calls WHERE run_id = $1`, runID)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != bbWrites {
		t.Errorf("tool_calls has %d rows of the run, want %d (one per write)", len(rs), bbWrites)
	}
	byKey := map[string]row{}
	for _, r := range rs {
		byKey[r.Key] = r
		if r.State != "done" || r.Server != "memory" || r.Tool != mcp.ModelName("memory", "create_entities") {
			t.Errorf("tool_call %s: server %q tool %q state %q, want memory, %s, done", r.Key, r.Server, r.Tool, r.State,
				mcp.ModelName("memory", "create_entities"))
		}
	}
	sent := map[string]int{}
	byTask := map[string][]shimRecord{}
	for _, w := range writes {
		key, _ := w.Meta[mcp.MetaIdempotencyKey].(string)
		if key == "" {
			t.Errorf("write %s reached the server without an idempotency key in _meta[%q]: %v", w.Arguments, mcp.MetaIdempotencyKey, w.Meta)
			continue
		}
		sent[key]++
		r, ok := byKey[key]
		if !ok {
			t.Errorf("write %s reached the server with key %q, which no tool_call row of the run has", w.Arguments, key)
			continue
		}
		if d := canonicalDigest(t, w.Arguments); d != r.ArgsDigest {
			t.Errorf("write %s: the server got arguments %s (digest %s), its tool_call row has digest %s", key, w.Arguments, d, r.ArgsDigest)
		}
		byTask[r.TaskID] = append(byTask[r.TaskID], w)
	}
	for key, n := range sent {
		if n != 1 {
			t.Errorf("write %s reached the server %d times, want once", key, n)
		}
	}
	for key := range byKey {
		if sent[key] == 0 {
			t.Errorf("tool_call %s is done but never reached the server", key)
		}
	}
	for task, ws := range byTask {
		sort.Slice(ws, func(i, j int) bool { return ws[i].At < ws[j].At })
		var order []string
		for _, w := range ws {
			r := byKey[w.Meta[mcp.MetaIdempotencyKey].(string)]
			order = append(order, fmt.Sprintf("a%d/i%d/c%d", r.Attempt, r.Iteration, r.CallIndex))
		}
		if !slices.IsSortedFunc(ws, func(a, b shimRecord) int {
			ra, rb := byKey[a.Meta[mcp.MetaIdempotencyKey].(string)], byKey[b.Meta[mcp.MetaIdempotencyKey].(string)]
			return cmpCalls(ra.Attempt, ra.Iteration, ra.CallIndex, rb.Attempt, rb.Iteration, rb.CallIndex)
		}) {
			t.Errorf("task %s's writes reached the server in the order %v, not in call order", task, order)
		}
	}
}

func cmpCalls(a1 int64, i1, c1 int32, a2 int64, i2, c2 int32) int {
	switch {
	case a1 != a2:
		return int(a1 - a2)
	case i1 != i2:
		return int(i1 - i2)
	}
	return int(c1 - c2)
}

// canonicalDigest is the hex SHA-256 of a call's arguments with keys
// sorted and no spaces, as tool_call.args_digest is documented.
func canonicalDigest(t *testing.T, args json.RawMessage) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(args, &v); err != nil {
		t.Fatalf("arguments %s: %v", args, err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// checkMemoryFile checks that every entity a write created is in
// server-memory's file.
func checkMemoryFile(t *testing.T, path string, writes []shimRecord) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("server-memory's memory file: %v", err)
	}
	have := map[string]bool{}
	for _, line := range bytes.Split(b, []byte("\n")) {
		var item struct{ Type, Name string }
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if err := json.Unmarshal(line, &item); err != nil {
			t.Fatalf("memory file line %q: %v", line, err)
		}
		if item.Type == "entity" {
			have[item.Name] = true
		}
	}
	sent := map[string]bool{}
	for _, w := range writes {
		var args struct {
			Entities []struct{ Name string } `json:"entities"`
		}
		if err := json.Unmarshal(w.Arguments, &args); err != nil || len(args.Entities) == 0 {
			t.Errorf("write %s: arguments %s hold no entities (%v)", w.Meta[mcp.MetaIdempotencyKey], w.Arguments, err)
		}
		for _, e := range args.Entities {
			sent[e.Name] = true
			if !have[e.Name] {
				t.Errorf("entity %q (write %s) is not in the memory file", e.Name, w.Meta[mcp.MetaIdempotencyKey])
			}
		}
	}
	if len(sent) == 0 || len(have) != len(sent) {
		t.Errorf("the memory file has %d entities, the writes sent %d distinct ones", len(have), len(sent))
	}
}
