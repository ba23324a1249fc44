package orchestrator

import (
	"errors"
	"sync/atomic"

	"google.golang.org/grpc/connectivity"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// Worker is one way to reach subagent workers: a client on one worker's
// address, or on a load-balanced target (dns:/// with round_robin) that
// stands for many.
type Worker struct {
	Addr   string // what to report until the worker names itself
	Client fanoutv1.SubagentServiceClient
	// Conn, when set, reports the state of the channel Client calls on, so
	// that dispatch prefers a worker it is connected to over one it would
	// have to wait for (for a dns:/// target the channel is READY while
	// any of its addresses is). A *grpc.ClientConn is one. Unset: the
	// worker counts as connected.
	Conn ConnState
}

// ConnState reports the connectivity state of a gRPC channel.
type ConnState interface {
	GetState() connectivity.State
}

// connected reports whether a call to w would be sent at once, without
// waiting for its channel to (re)connect.
func (w Worker) connected() bool {
	return w.Conn == nil || w.Conn.GetState() == connectivity.Ready
}

// WorkerPool hands out workers round-robin. It is safe for concurrent use.
type WorkerPool struct {
	workers []Worker
	next    atomic.Uint64
}

// NewWorkerPool returns a pool over workers. It needs at least one.
func NewWorkerPool(workers ...Worker) (*WorkerPool, error) {
	if len(workers) == 0 {
		return nil, errors.New("worker pool: no workers")
	}
	for _, w := range workers {
		if w.Client == nil {
			return nil, errors.New("worker pool: worker " + w.Addr + " has no client")
		}
	}
	return &WorkerPool{workers: workers}, nil
}

// Next returns the next worker in turn.
func (p *WorkerPool) Next() Worker {
	n := p.next.Add(1) - 1
	return p.workers[n%uint64(len(p.workers))]
}

// After returns the worker that follows w in the pool, so that a task
// refused by w walks the whole pool rather than drawing from the shared
// round-robin, where concurrent dispatches could hand it the same refusing
// workers again and again.
func (p *WorkerPool) After(w Worker) Worker {
	for i := range p.workers {
		if p.workers[i].Addr == w.Addr {
			return p.workers[(i+1)%len(p.workers)]
		}
	}
	return p.Next()
}

// Connected returns the first worker whose channel is connected, looking
// from w on in pool order (w itself first), and reports whether there was
// one; when there is none it returns w.
func (p *WorkerPool) Connected(w Worker) (Worker, bool) {
	from := 0
	for i := range p.workers {
		if p.workers[i].Addr == w.Addr {
			from = i
			break
		}
	}
	if w.connected() {
		return w, true
	}
	for i := 1; i <= len(p.workers); i++ {
		if c := p.workers[(from+i)%len(p.workers)]; c.connected() {
			return c, true
		}
	}
	return w, false
}

// Len reports how many workers the pool has.
func (p *WorkerPool) Len() int { return len(p.workers) }
