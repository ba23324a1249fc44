package node

import (
	"context"
	"errors"
	"strings"
)

// Config is what one process serves: a backend, its workers and, when set,
// an orchestrator.
type Config struct {
	Backend BackendConfig
	Workers []WorkerConfig
	// Orchestrator is served when not nil; with Workers empty it
	// dispatches to this process's workers.
	Orchestrator *OrchestratorConfig
}

// Main is one fanout process, as each server subcommand of cmd/fanout
// runs it: `fanout worker` is a Main with one worker, `fanout
// orchestrator` one with an orchestrator, `fanout dev` one with both.
type Main struct {
	cfg     Config
	backend *Backend
	workers []*Worker
	orch    *Orchestrator
	exited  chan error
}

// NewMain returns a Main that serves cfg once opened.
func NewMain(cfg Config) *Main {
	return &Main{cfg: cfg, exited: make(chan error, len(cfg.Workers)+1)}
}

// Open opens the backend, starts the workers, then the orchestrator, and
// returns once they serve. When one fails it stops what it started.
func (m *Main) Open(ctx context.Context) (err error) {
	if m.backend != nil {
		return errors.New("node: Main opened twice")
	}
	bc := m.cfg.Backend
	bc.WorkersOnly = m.cfg.Orchestrator == nil
	if m.backend, err = OpenBackend(ctx, bc); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			m.Close(context.WithoutCancel(ctx)) //nolint:errcheck // the error that stopped Open is the one to report
		}
	}()
	addrs := make([]string, 0, len(m.cfg.Workers))
	for _, wc := range m.cfg.Workers {
		w, err := openWorker(ctx, m.backend, wc, m.exited, m.cfg.Orchestrator == nil)
		if err != nil {
			return err
		}
		m.workers = append(m.workers, w)
		addrs = append(addrs, w.Addr())
	}
	if m.cfg.Orchestrator != nil {
		oc := *m.cfg.Orchestrator
		if oc.Workers == "" {
			oc.Workers = strings.Join(addrs, ",")
		}
		if m.orch, err = openOrchestrator(ctx, m.backend, oc, m.exited); err != nil {
			return err
		}
	}
	return nil
}

// Backend is the backend the process's nodes share; nil before Open.
func (m *Main) Backend() *Backend { return m.backend }

// Workers are the process's workers, in the order of Config.Workers.
func (m *Main) Workers() []*Worker { return m.workers }

// Orchestrator is the process's orchestrator; nil if it serves none.
func (m *Main) Orchestrator() *Orchestrator { return m.orch }

// Err delivers the error of the first server that stopped serving by
// itself (a failed listener); after Close, the servers' nil.
func (m *Main) Err() <-chan error { return m.exited }

// Close stops the orchestrator first (it ends the runs it drives), then
// the workers, then the backend, each drained within ctx. It returns the
// drains' errors.
func (m *Main) Close(ctx context.Context) error {
	var errs []error
	if m.orch != nil {
		errs = append(errs, m.orch.Close(ctx))
		m.orch = nil
	}
	for _, w := range m.workers {
		errs = append(errs, w.Close(ctx))
	}
	m.workers = nil
	if m.backend != nil {
		m.backend.Close()
	}
	return errors.Join(errs...)
}
