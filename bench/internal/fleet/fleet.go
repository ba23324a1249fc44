// Package fleet starts and reads a fanout fleet for the benches (bench/compare,
// bench/scale): a private PostgreSQL from the local server binaries, the real
// binary's workers and orchestrators as separate OS processes with peer mTLS
// and signed dispatches as `fanout dev` sets them up, API keys made as an
// operator makes them, and what /proc and /metrics say about the processes.
package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fanout/fanout/peer"
)

// Config is a fleet: Workers worker processes, then Orchestrators
// orchestrators that dispatch to all of them.
type Config struct {
	Bin     string        // the fanout binary
	Peer    peer.DevFiles // the peer credentials, as `fanout dev` makes them
	NodeURL string        // the migrated database, as a member of fanout_app
	Prefix  string        // of the nodes' names: <Prefix>-worker-1, <Prefix>-orchestrator
	Workers int
	// Orchestrators: 0 is 1.
	Orchestrators int
	// WorkerArgs are worker i's own flags (from 0); OrchestratorArgs an
	// orchestrator's (--auth keys and --workers are set here).
	WorkerArgs       func(i int) []string
	OrchestratorArgs func(i int) []string
	// Metrics serves each node's /metrics on a port of its own (Node.Metrics);
	// off, --metrics-listen is empty.
	Metrics bool
	// Env is added to each node's environment (ChildEnv).
	Env []string
	// OnLine, if set, sees every line a node writes.
	OnLine     func(node, line string, stderr bool)
	StartLimit time.Duration // for each process to start serving
}

// Node is a running fanout server.
type Node struct {
	*Proc
	Addr    string // its gRPC address
	Metrics string // its /metrics URL, or ""
}

// Fleet is the running processes of a Config.
type Fleet struct {
	Orchestrators, Workers []*Node
}

// Start starts cfg's workers, then its orchestrators. On an error it stops
// what it started.
func Start(ctx context.Context, cfg Config) (_ *Fleet, err error) {
	f := &Fleet{}
	defer func() {
		if err != nil {
			f.Stop()
		}
	}()
	files := cfg.Peer
	metrics := ""
	if cfg.Metrics {
		metrics = "127.0.0.1:0"
	}
	common := []string{"--listen", "127.0.0.1:0", "--metrics-listen", metrics, "--database-url", cfg.NodeURL,
		"--peer-tls-ca", files.CA}
	var addrs []string
	for i := range cfg.Workers {
		name := fmt.Sprintf("%s-worker-%d", cfg.Prefix, i+1)
		args := append([]string{"worker"}, common...)
		args = append(args, "--name", name,
			"--peer-tls-cert", files.Worker.Cert, "--peer-tls-key", files.Worker.Key, "--peer-verify-keys", files.VerifyKey)
		if cfg.WorkerArgs != nil {
			args = append(args, cfg.WorkerArgs(i)...)
		}
		n, err := startNode(ctx, cfg, name, "worker serving", args)
		if n != nil {
			f.Workers = append(f.Workers, n)
		}
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, n.Addr)
	}
	for i := range max(1, cfg.Orchestrators) {
		name := cfg.Prefix + "-orchestrator"
		if cfg.Orchestrators > 1 {
			name += "-" + strconv.Itoa(i+1)
		}
		args := append([]string{"orchestrator"}, common...)
		// --auth keys is the default; it is named so that the bench
		// measures the production path whatever the default becomes.
		args = append(args, "--name", name, "--auth", "keys", "--workers", strings.Join(addrs, ","),
			"--peer-tls-cert", files.Orchestrator.Cert, "--peer-tls-key", files.Orchestrator.Key, "--peer-signing-key", files.SigningKey)
		if cfg.OrchestratorArgs != nil {
			args = append(args, cfg.OrchestratorArgs(i)...)
		}
		n, err := startNode(ctx, cfg, name, "orchestrator serving", args)
		if n != nil {
			f.Orchestrators = append(f.Orchestrators, n)
		}
		if err != nil {
			return nil, err
		}
	}
	return f, nil
}

// logLine is the message and address of a server's JSON log line. The
// line may start with what the Go runtime wrote to the same stderr at the
// same moment (GODEBUG=gctrace=1's "gc " before a log line's "{"): the
// JSON is read from its first '{'.
func logLine(line string) (msg, addr string, ok bool) {
	i := strings.IndexByte(line, '{')
	if i < 0 {
		return "", "", false
	}
	var l struct{ Msg, Addr string }
	if json.Unmarshal([]byte(line[i:]), &l) != nil {
		return "", "", false
	}
	return l.Msg, l.Addr, true
}

// startNode starts one fanout server and waits for its log line msg, which
// carries the address it serves on (and, before it, the "metrics" line with
// its /metrics URL).
func startNode(ctx context.Context, cfg Config, name, msg string, args []string) (*Node, error) {
	addrs := make(chan string, 1)
	n := &Node{}
	metrics := make(chan string, 1)
	p, err := StartProc(name, ChildEnv(cfg.Env...), func(line string, stderr bool) {
		if cfg.OnLine != nil {
			cfg.OnLine(name, line, stderr)
		}
		m, addr, ok := logLine(line)
		if !ok {
			return
		}
		switch m {
		case msg:
			select {
			case addrs <- addr:
			default:
			}
		case "metrics":
			select {
			case metrics <- addr:
			default:
			}
		}
	}, cfg.Bin, args...)
	if err != nil {
		return nil, err
	}
	n.Proc = p
	if n.Addr, err = WaitFor(ctx, p, fmt.Sprintf("%q log line", msg), cfg.StartLimit, addrs); err != nil {
		return n, err
	}
	if cfg.Metrics {
		select {
		case n.Metrics = <-metrics: // logged before msg
		default:
			return n, fmt.Errorf("%s: no \"metrics\" log line before %q: is its /metrics port taken?", name, msg)
		}
	}
	return n, nil
}

// Stop stops the orchestrators first (they drain their runs), then the
// workers.
func (f *Fleet) Stop() {
	for _, n := range append(append([]*Node(nil), f.Orchestrators...), f.Workers...) {
		if n != nil && n.Proc != nil {
			n.Stop(15 * time.Second)
		}
	}
}

// Alive returns an error if a process of the fleet has exited.
func (f *Fleet) Alive() error {
	for _, n := range append(append([]*Node(nil), f.Orchestrators...), f.Workers...) {
		if err := n.Exited(); err != nil {
			return err
		}
	}
	return nil
}
