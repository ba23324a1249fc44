// Command memprobe measures the memory of running subagents: one run of -n
// one-call tasks (sim calls of -latency) over -workers worker processes and
// one orchestrator, real processes of the fanout binary against a
// throwaway PostgreSQL. It samples each process's RSS and goroutines (and
// the orchestrator's heap) while the run is in flight and prints their
// growth over idle per subagent; with -profiles DIR it saves each
// process's heap and goroutine profiles at the peak of running subagents.
//
//	go build -o .tmp/fanout ./cmd/fanout && go run ./scripts/memprobe -bin .tmp/fanout -n 10000
//
// It is a quick probe for the memory work of issue 44, not the official
// scale figures (those are bench/scale's).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/orchestrator"
	"github.com/fanout/fanout/peer"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/pglocal"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "memprobe:", err)
		os.Exit(1)
	}
}

type config struct {
	bin, pgBin, profiles, tmp string
	n, workers                int
	latency, every            time.Duration
}

func run() error {
	var c config
	flag.StringVar(&c.bin, "bin", ".tmp/fanout", "the fanout binary")
	flag.StringVar(&c.pgBin, "pg-bin-dir", "", "directory of initdb/pg_ctl/postgres (default: found)")
	flag.StringVar(&c.profiles, "profiles", "", "directory to save heap and goroutine profiles at the peak (empty: none)")
	flag.StringVar(&c.tmp, "tmp-dir", "", "where the throwaway PostgreSQL lives (default: the system's)")
	flag.IntVar(&c.n, "n", 1000, "tasks of the run, one sim call each")
	flag.IntVar(&c.workers, "workers", 3, "worker processes")
	flag.DurationVar(&c.latency, "latency", 4*time.Second, "latency of each sim call")
	flag.DurationVar(&c.every, "every", time.Second, "sampling interval")
	flag.Parse()
	// Under --auth none the caller names its tenant in metadata.
	ctx := metadata.AppendToOutgoingContext(context.Background(), orchestrator.TenantMetadataKey, "memprobe")

	tmp, err := os.MkdirTemp(c.tmp, "fanout-memprobe-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if err := os.Chmod(tmp, 0o755); err != nil { // PostgreSQL runs unprivileged when we are root
		return err
	}
	srv, err := pglocal.Start(ctx, pglocal.Config{DataDir: filepath.Join(tmp, "pg"), BinDir: c.pgBin, Fast: true})
	if err != nil {
		return err
	}
	defer func() { _ = srv.Stop(context.WithoutCancel(ctx)) }()
	// Fast is fsync off: the servers started below inherit the variable
	// that lets them run on it (--allow-unsafe-durability).
	if err := os.Setenv("FANOUT_ALLOW_UNSAFE_DURABILITY", "1"); err != nil {
		return err
	}
	if err := store.CreateDatabase(ctx, srv.URL("postgres"), "fanout"); err != nil {
		return err
	}
	owner := srv.URL("fanout")
	if out, err := exec.CommandContext(ctx, c.bin, "migrate", "--database-url", owner).CombinedOutput(); err != nil {
		return fmt.Errorf("migrate: %w: %s", err, out)
	}
	if err := store.CreateLoginRole(ctx, owner, "fanout_node", "fanout_app"); err != nil {
		return err
	}
	u, err := url.Parse(owner)
	if err != nil {
		return err
	}
	u.User = url.User("fanout_node")
	nodeURL := u.String()
	files, err := peer.GenerateDev(filepath.Join(tmp, "peer"))
	if err != nil {
		return err
	}

	capacity := (c.n + c.workers - 1) / c.workers
	common := []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--pprof", "--database-url", nodeURL,
		"--peer-tls-ca", files.CA}
	var procs []*proc
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].stop()
		}
	}()
	var addrs []string
	for i := range c.workers {
		args := append([]string{"worker"}, common...)
		args = append(args, "--name", fmt.Sprintf("w%d", i+1), "--capacity", strconv.Itoa(capacity),
			"--peer-tls-cert", files.Worker.Cert, "--peer-tls-key", files.Worker.Key, "--peer-verify-keys", files.VerifyKey,
			"--sim-latency", c.latency.String(), "--sim-finish-after", "1", "--sim-tool-calls", "0", "--sim-output-tokens", "64")
		p, err := start(fmt.Sprintf("worker %d", i+1), "worker serving", c.bin, args...)
		if p != nil {
			procs = append(procs, p)
		}
		if err != nil {
			return err
		}
		addrs = append(addrs, p.addr)
	}
	args := append([]string{"orchestrator"}, common...)
	args = append(args, "--name", "orch", "--auth", "none", "--workers", strings.Join(addrs, ","),
		"--max-tasks", strconv.Itoa(c.n), "--max-concurrency", strconv.Itoa(c.n),
		"--peer-tls-cert", files.Orchestrator.Cert, "--peer-tls-key", files.Orchestrator.Key, "--peer-signing-key", files.SigningKey)
	orch, err := start("orchestrator", "orchestrator serving", c.bin, args...)
	if orch != nil {
		procs = append(procs, orch)
	}
	if err != nil {
		return err
	}
	workers := procs[:c.workers]

	conn, err := grpc.NewClient(orch.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	client := fanoutv1.NewOrchestratorServiceClient(conn)

	// Idle first: a forced GC and a heap profile's rendering (live) leave
	// their buffers in the process's RSS.
	idle := make([]sample, len(procs))
	for i, p := range procs {
		if idle[i], err = p.sample(); err != nil {
			return err
		}
	}
	idleLive, err := live(procs)
	if err != nil {
		return err
	}
	var peakLive []int64 // at the capture, with its subagents running
	capturedRunning := 0
	spec := &fanoutv1.RunSpec{
		IdempotencyKey: fmt.Sprintf("memprobe-%d", os.Getpid()),
		TenantId:       "memprobe",
		Goal:           "memprobe",
		Budget:         &fanoutv1.Budget{LimitTokens: int64(c.n) * 10_000, MinReservationTokens: 1},
		Limits:         &fanoutv1.Limits{MaxConcurrency: int32(c.n), RunTimeout: durationpb.New(30 * time.Minute)}, //nolint:gosec // a flag
		Model:          &fanoutv1.ModelSettings{Provider: "sim", MaxOutputTokens: 256, Seed: 7},
	}
	for i := range c.n {
		spec.Tasks = append(spec.Tasks, &fanoutv1.TaskSpec{Id: fmt.Sprintf("t%05d", i),
			Instruction: fmt.Sprintf("look up item %d", i), TokenBudget: 5_000, MaxIterations: 1})
	}
	cpu := make(chan error, 1) // the CPU profiles taken while the run starts, with -profiles
	if c.profiles != "" {
		go func() { cpu <- cpuProfiles(c.profiles, procs, c.latency) }()
	} else {
		cpu <- nil
	}
	began := time.Now()
	started, err := client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: spec})
	if err != nil {
		return err
	}
	runID := started.GetRunId()

	peak := make([]sample, len(procs)) // each field's maximum over the run
	peakRunning, captured := 0, false
	for {
		running := 0
		for i, p := range procs {
			s, err := p.sample()
			if err != nil {
				return err
			}
			peak[i] = peak[i].max(s)
			if i < c.workers {
				running += s.running
			}
		}
		peakRunning = max(peakRunning, running)
		if !captured && running >= c.n*80/100 {
			captured, capturedRunning = true, running
			if peakLive, err = live(procs); err != nil {
				return err
			}
			if c.profiles != "" {
				if err := capture(c.profiles, procs); err != nil {
					return err
				}
			}
		}
		if running == 0 && time.Since(began) > c.latency {
			r, err := client.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: runID})
			if err != nil {
				return err
			}
			if st := r.GetRun().GetState(); st != fanoutv1.RunState_RUN_STATE_RUNNING {
				fmt.Printf("run %s: %s in %v\n", runID, st, time.Since(began).Round(time.Millisecond))
				break
			}
		}
		time.Sleep(c.every)
	}

	if err := <-cpu; err != nil {
		return err
	}
	fmt.Printf("n=%d workers=%d latency=%v; at most %d subagents running at once (workers' fanout_subagents_running)\n",
		c.n, c.workers, c.latency, peakRunning)
	per := func(b int64) string { return fmt.Sprintf("%.1f KiB", float64(b)/1024/float64(c.n)) }
	var wRSS, wIdle, wHeap, wHeapIdle, wStack, wStackIdle int64
	var wG, wGIdle int
	for i := range workers {
		wRSS += peak[i].rss
		wHeap += peak[i].heap
		wHeapIdle += idle[i].heap
		wStack += peak[i].stack
		wStackIdle += idle[i].stack
		wIdle += idle[i].rss
		wG += peak[i].goroutines
		wGIdle += idle[i].goroutines
	}
	o, oi := peak[c.workers], idle[c.workers]
	fmt.Printf("%-34s %12s %12s %12s\n", "per subagent (peak-idle)/n", "idle", "peak", "per subagent")
	fmt.Printf("%-34s %10.1fMB %10.1fMB %12s\n", "orchestrator heap in use", mb(oi.heap), mb(o.heap), per(o.heap-oi.heap))
	fmt.Printf("%-34s %10.1fMB %10.1fMB %12s\n", "orchestrator stacks", mb(oi.stack), mb(o.stack), per(o.stack-oi.stack))
	fmt.Printf("%-34s %10.1fMB %10.1fMB %12s\n", "orchestrator RSS", mb(oi.rss), mb(o.rss), per(o.rss-oi.rss))
	fmt.Printf("%-34s %10.1fMB %10.1fMB %12s\n", "workers' heap in use", mb(wHeapIdle), mb(wHeap), per(wHeap-wHeapIdle))
	fmt.Printf("%-34s %10.1fMB %10.1fMB %12s\n", "workers' stacks", mb(wStackIdle), mb(wStack), per(wStack-wStackIdle))
	fmt.Printf("%-34s %10.1fMB %10.1fMB %12s\n", "workers' RSS", mb(wIdle), mb(wRSS), per(wRSS-wIdle))
	fmt.Printf("%-34s %10.1fMB %10.1fMB %12s\n", "together (orchestrator + workers RSS)", mb(oi.rss+wIdle), mb(o.rss+wRSS), per(o.rss+wRSS-oi.rss-wIdle))
	if captured {
		var w, wi int64
		for i := range workers {
			w += peakLive[i]
			wi += idleLive[i]
		}
		o, oi := peakLive[c.workers], idleLive[c.workers]
		perRun := func(b int64) string { return fmt.Sprintf("%.1f KiB", float64(b)/1024/float64(capturedRunning)) }
		fmt.Printf("live heap after a GC, %d running:  orchestrator %s, workers %s per running subagent\n",
			capturedRunning, perRun(o-oi), perRun(w-wi))
	}
	fmt.Printf("%-34s %12d %12d %12.2f\n", "orchestrator goroutines", oi.goroutines, o.goroutines, float64(o.goroutines-oi.goroutines)/float64(c.n))
	fmt.Printf("%-34s %12d %12d %12.2f\n", "workers' goroutines", wGIdle, wG, float64(wG-wGIdle)/float64(c.n))
	return nil
}

func mb(b int64) float64 { return float64(b) / 1e6 }

// proc is a server process with its metrics listener.
type proc struct {
	name, addr, metrics string
	cmd                 *exec.Cmd
}

// start starts a server and waits for its log line msg (its address) and
// its metrics address.
func start(name, msg, bin string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = os.Stdout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			var l struct{ Msg, Addr, Level string }
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				continue
			}
			switch {
			case l.Msg == "metrics":
				p.metrics = strings.TrimSuffix(strings.TrimPrefix(l.Addr, "http://"), "/metrics")
			case l.Msg == msg:
				p.addr = l.Addr
				close(ready)
			case l.Level == "WARN" || l.Level == "ERROR":
				fmt.Fprintf(os.Stderr, "%s: %s\n", name, sc.Text())
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case <-ready:
		if p.metrics == "" {
			return p, fmt.Errorf("%s: no metrics address logged", name)
		}
		return p, nil
	case <-time.After(60 * time.Second):
		return p, fmt.Errorf("%s: not serving within 60s", name)
	}
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
	}
}

// sample is what one look at a process saw.
type sample struct {
	rss, heap, stack    int64 // bytes: resident set, heap spans in use, goroutine stacks
	goroutines, running int   // running: the worker's fanout_subagents_running
}

func (s sample) max(o sample) sample {
	return sample{rss: max(s.rss, o.rss), heap: max(s.heap, o.heap), stack: max(s.stack, o.stack), goroutines: max(s.goroutines, o.goroutines),
		running: max(s.running, o.running)}
}

var (
	vmRSS      = regexp.MustCompile(`(?m)^VmRSS:\s+(\d+) kB`)
	heapInuse  = regexp.MustCompile(`(?m)^# HeapInuse = (\d+)`)
	heapAlloc  = regexp.MustCompile(`(?m)^# HeapAlloc = (\d+)`)
	stackInuse = regexp.MustCompile(`(?m)^# Stack = (\d+)`)
	goroutines = regexp.MustCompile(`^goroutine profile: total (\d+)`)
	running    = regexp.MustCompile(`(?m)^fanout_subagents_running(?:\{[^}]*\})? (\S+)`)
)

func (p *proc) sample() (sample, error) {
	var s sample
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return s, fmt.Errorf("%s: %w", p.name, err)
	}
	s.rss = int64(atoi(vmRSS.FindSubmatch(status))) << 10
	// debug=1 ends with the runtime's MemStats; gc=0 does not force a GC.
	heap, err := p.get("/debug/pprof/heap?debug=1")
	if err != nil {
		return s, err
	}
	s.heap = int64(atoi(heapInuse.FindSubmatch(heap)))
	s.stack = int64(atoi(stackInuse.FindSubmatch(heap)))
	g, err := p.get("/debug/pprof/goroutine?debug=1")
	if err != nil {
		return s, err
	}
	s.goroutines = atoi(goroutines.FindSubmatch(g))
	m, err := p.get("/metrics")
	if err != nil {
		return s, err
	}
	for _, v := range running.FindAllSubmatch(m, -1) {
		f, _ := strconv.ParseFloat(string(v[1]), 64)
		s.running += int(f)
	}
	return s, nil
}

func atoi(m [][]byte) int {
	if len(m) < 2 {
		return 0
	}
	v, _ := strconv.Atoi(string(m[1]))
	return v
}

func (p *proc) get(path string) ([]byte, error) {
	resp, err := http.Get("http://" + p.metrics + path) //nolint:gosec,noctx // loopback, our own child
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: GET %s: %s", p.name, path, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// live is each process's heap after a forced GC: what is live.
func live(procs []*proc) ([]int64, error) {
	out := make([]int64, len(procs))
	for i, p := range procs {
		if _, err := p.get("/debug/pprof/heap?gc=1"); err != nil {
			return nil, err
		}
		b, err := p.get("/debug/pprof/heap?debug=1")
		if err != nil {
			return nil, err
		}
		out[i] = int64(atoi(heapAlloc.FindSubmatch(b)))
	}
	return out, nil
}

// capture saves each process's heap profile and goroutine stacks in dir.
func capture(dir string, procs []*proc) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var errs []error
	for _, p := range procs {
		name := strings.ReplaceAll(p.name, " ", "")
		for file, path := range map[string]string{name + ".heap.pb.gz": "/debug/pprof/heap?gc=1", name + ".heap.txt": "/debug/pprof/heap?debug=1",
			name + ".goroutine.txt": "/debug/pprof/goroutine?debug=1"} {
			b, err := p.get(path)
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, file), b, 0o644) //nolint:gosec // a profile
			}
			errs = append(errs, err)
		}
	}
	fmt.Printf("profiles saved in %s\n", dir)
	return errors.Join(errs...)
}

// cpuProfiles saves each process's CPU profile over d (at most 10s) in dir:
// its samples' stacks show how deep a subagent's goroutines go.
func cpuProfiles(dir string, procs []*proc, d time.Duration) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	secs := max(1, min(10, int(d.Seconds())))
	errs := make(chan error, len(procs))
	for _, p := range procs {
		go func() {
			b, err := p.get(fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs))
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, strings.ReplaceAll(p.name, " ", "")+".cpu.pb.gz"), b, 0o644) //nolint:gosec // a profile
			}
			errs <- err
		}()
	}
	var all []error
	for range procs {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}
