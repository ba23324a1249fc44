package fleet

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a child process whose output is kept (the last lines, for error
// messages) and scanned line by line while it runs.
type Proc struct {
	Name  string
	Cmd   *exec.Cmd
	Stdin io.WriteCloser
	Tail  *Tail
	done  chan struct{} // closed when the process has exited and its output is drained
	err   error         // the exit error; read after done
}

// StartProc starts bin with args and env, feeding every line of its
// stdout and stderr to onLine (which may be nil; stderr says which stream)
// from one goroutine per stream. The child gets SIGKILL if this process
// dies first (Pdeathsig), so that a killed driver leaves no servers behind.
func StartProc(name string, env []string, onLine func(line string, stderr bool), bin string, args ...string) (*Proc, error) {
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
	p := &Proc{Name: name, Cmd: cmd, Stdin: stdin, Tail: &Tail{max: 40}, done: make(chan struct{})}
	var wg sync.WaitGroup
	for i, r := range []io.Reader{stdout, stderr} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
			for sc.Scan() {
				p.Tail.add(sc.Text())
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

// Pid is the process's id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited and its output is drained.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Stop sends SIGTERM, waits up to grace for the process to exit, then
// kills it. It returns at once if the process has already exited.
func (p *Proc) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		fmt.Fprintf(os.Stderr, "bench: %s did not stop within %v after SIGTERM; killing it\n", p.Name, grace)
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// Exited returns an error describing how the process ended, with its last
// output, if it has ended; nil while it runs.
func (p *Proc) Exited() error {
	select {
	case <-p.done:
		if p.err == nil {
			return fmt.Errorf("%s exited with status 0; its last output:\n%s", p.Name, p.Tail)
		}
		return fmt.Errorf("%s exited: %w; its last output:\n%s", p.Name, p.err, p.Tail)
	default:
		return nil
	}
}

// WaitFor waits until got delivers a value, the process exits, or ctx or
// timeout ends, whichever comes first.
func WaitFor[T any](ctx context.Context, p *Proc, what string, timeout time.Duration, got <-chan T) (T, error) {
	var zero T
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case v := <-got:
		return v, nil
	case <-p.done:
		return zero, p.Exited()
	case <-t.C:
		return zero, fmt.Errorf("%s: no %s within %v; its last output:\n%s", p.Name, what, timeout, p.Tail)
	case <-ctx.Done():
		return zero, fmt.Errorf("%s: wait for %s: %w", p.Name, what, context.Cause(ctx))
	}
}

// Tail keeps the last max lines written to it.
type Tail struct {
	mu    sync.Mutex
	max   int
	lines []string
}

func (t *Tail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, line)
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
}

func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return "  (nothing)"
	}
	return "  " + strings.Join(t.lines, "\n  ")
}

// ChildEnv is this process's environment without the variables that would
// change a child's configuration behind the benchmark's back (FANOUT_*
// flags, DATABASE_URL, LangSmith tracing), plus extra.
func ChildEnv(extra ...string) []string {
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

// Sleep waits d, or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Names parses a flag's comma-separated names, each one of known, in the
// order given and without repeats; kind names them in the error.
func Names(s, kind string, known []string) ([]string, error) {
	var out []string
	for n := range strings.SplitSeq(s, ",") {
		n = strings.TrimSpace(n)
		if !slices.Contains(known, n) {
			return nil, fmt.Errorf("no %s %q (there are: %s)", kind, n, strings.Join(known, ", "))
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// Ints parses a flag's comma-separated positive integers.
func Ints(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, v)
	}
	return out, nil
}
