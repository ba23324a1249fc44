package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a child process whose output is kept (the last lines, for error
// messages) and scanned line by line while it runs.
type proc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	tail  *tail
	done  chan struct{} // closed when the process has exited and its output is drained
	err   error         // the exit error; read after done
}

// startProc starts bin with args and env, feeding every line of its
// stdout and stderr to onLine (which may be nil; stderr says which stream)
// from one goroutine per stream. The child gets SIGKILL if this process
// dies first (Pdeathsig), so that a killed driver leaves no servers behind.
func startProc(name string, env []string, onLine func(line string, stderr bool), bin string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, stdin: stdin, tail: &tail{max: 40}, done: make(chan struct{})}
	var wg sync.WaitGroup
	for i, r := range []io.Reader{stdout, stderr} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
			for sc.Scan() {
				p.tail.add(sc.Text())
				if onLine != nil {
					onLine(sc.Text(), i == 1)
				}
			}
			_, _ = io.Copy(io.Discard, r) // a line too long for the scanner: keep the child unblocked
		}()
	}
	go func() {
		wg.Wait() // Wait closes the pipes: drain them first.
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM, waits up to grace for the process to exit, then
// kills it. It returns at once if the process has already exited.
func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		fmt.Fprintf(os.Stderr, "bench-compare: %s did not stop within %v after SIGTERM; killing it\n", p.name, grace)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exited returns an error describing how the process ended, with its last
// output, if it has ended; nil while it runs.
func (p *proc) exited() error {
	select {
	case <-p.done:
		if p.err == nil {
			return fmt.Errorf("%s exited with status 0; its last output:\n%s", p.name, p.tail)
		}
		return fmt.Errorf("%s exited: %w; its last output:\n%s", p.name, p.err, p.tail)
	default:
		return nil
	}
}

// waitFor waits until got delivers a value, the process exits, or ctx or
// timeout ends, whichever comes first.
func waitFor[T any](ctx context.Context, p *proc, what string, timeout time.Duration, got <-chan T) (T, error) {
	var zero T
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case v := <-got:
		return v, nil
	case <-p.done:
		return zero, p.exited()
	case <-t.C:
		return zero, fmt.Errorf("%s: no %s within %v; its last output:\n%s", p.name, what, timeout, p.tail)
	case <-ctx.Done():
		return zero, fmt.Errorf("%s: wait for %s: %w", p.name, what, context.Cause(ctx))
	}
}

// tail keeps the last max lines written to it.
type tail struct {
	mu    sync.Mutex
	max   int
	lines []string
}

func (t *tail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, line)
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return "  (nothing)"
	}
	return "  " + strings.Join(t.lines, "\n  ")
}

// childEnv is this process's environment without the variables that would
// change a child's configuration behind the benchmark's back (FANOUT_*
// flags, DATABASE_URL, LangSmith tracing), plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FANOUT_") || k == "DATABASE_URL" || strings.HasPrefix(k, "LANGSMITH_") ||
			strings.HasPrefix(k, "LANGCHAIN_") || strings.HasPrefix(k, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}
