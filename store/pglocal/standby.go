package pglocal

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StartStandby makes a streaming standby of primary in cfg.DataDir (a base
// backup with pg_basebackup -R: standby.signal and primary_conninfo), starts
// it and waits until it accepts (read-only) connections. cfg.BinDir and
// cfg.OSUser are the primary's; set cluster_name in cfg.Conf to name the
// standby in the primary's synchronous_standby_names. The caller must call
// Stop.
func StartStandby(ctx context.Context, primary *Server, cfg Config) (*Server, error) {
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("start standby: %w", err)
	}
	s := &Server{dataDir: dataDir, binDir: primary.binDir, cred: primary.cred, tail: new(tailBuffer)}
	if err := os.MkdirAll(filepath.Dir(dataDir), 0o755); err != nil {
		return nil, fmt.Errorf("start standby %s: %w", dataDir, err)
	}
	if err := os.Mkdir(dataDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("start standby %s: %w", dataDir, err)
	}
	if err := s.chown(dataDir); err != nil {
		return nil, fmt.Errorf("start standby %s: %w", dataDir, err)
	}
	if err := s.checkTraversable(); err != nil {
		return nil, fmt.Errorf("start standby %s: %w", dataDir, err)
	}
	// pg_basebackup sits beside the real pg_ctl, not always beside a link
	// to it (/usr/local/bin/pg_ctl on some machines).
	if real, err := filepath.EvalSymlinks(filepath.Join(s.binDir, "pg_ctl")); err == nil {
		s.binDir = filepath.Dir(real)
	}
	out, err := s.command(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres",
		"-D", dataDir, "-R", "-X", "stream", "-c", "fast", "--no-sync").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("pg_basebackup of 127.0.0.1:%d into %s: %w: %s", primary.port, dataDir, err, tail(out))
	}
	// postmaster.pid and the primary's log settings are not copied; its
	// fanout.conf is, and start writes the standby's own over it.
	if err := s.openLog(cfg.Log); err != nil {
		return nil, err
	}
	if s.port, err = freePort(); err != nil {
		return nil, errors.Join(err, s.closeLog())
	}
	if err := s.start(ctx, cfg.Fast, cfg.Conf); err != nil {
		return nil, errors.Join(err, s.closeLog())
	}
	if err := waitReady(ctx, s.URL("postgres")); err != nil {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return nil, errors.Join(fmt.Errorf("wait for standby in %s: %w", dataDir, err), s.Stop(stopCtx))
	}
	return s, nil
}

// Promote makes a standby the primary (pg_ctl promote) and waits until it
// takes writes.
func (s *Server) Promote(ctx context.Context) error {
	out, err := s.command(ctx, "pg_ctl", "promote", "-D", s.dataDir, "-w", "-t", "30", "-s").CombinedOutput()
	if err != nil {
		return fmt.Errorf("promote postgres in %s: %w: %s", s.dataDir, err, tail(out))
	}
	return nil
}

// PID is the postmaster's process id, from postmaster.pid.
func (s *Server) PID() (int, error) {
	raw, err := os.ReadFile(filepath.Join(s.dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("read the postmaster's pid in %s: %w", s.dataDir, err)
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid in %s: %w", s.dataDir, err)
	}
	return pid, nil
}

// Kill kills the postmaster with SIGKILL, as a crash of its machine would
// end it (its backends exit when they notice), and waits until it is gone.
// Stop then has nothing to stop; the data directory is left as the crash
// left it.
func (s *Server) Kill(ctx context.Context) error {
	pid, err := s.PID()
	if err != nil {
		return err
	}
	// The whole process group at once (pg_ctl starts the postmaster in a
	// session of its own): no backend outlives it to acknowledge one more
	// commit, as none would on a machine that crashed.
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill -9 postmaster %d and its processes: %w", pid, err)
	}
	for postmasterRunning(pid, s.dataDir) && !zombie(pid) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("postmaster %d still running after SIGKILL: %w", pid, context.Cause(ctx))
		case <-time.After(10 * time.Millisecond):
		}
	}
	s.killed = true
	return nil
}

// zombie reports whether pid has exited and waits to be reaped (by
// whichever process adopted the daemonized postmaster).
func zombie(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(raw), ") ")
	return ok && strings.HasPrefix(rest, "Z")
}
