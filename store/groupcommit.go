package store

import (
	"context"
	"errors"
	"sync"
	"time"
)

// committer hands items to a batch function, which does the work of each
// item and closes its done channel. groupCommit batches the items that
// arrive together; inlineCommit runs each item alone in its caller's
// goroutine. Either way the batch function is the one code path.
type committer[T any] interface {
	// do runs item and returns it once its batch ran; an error means the
	// item never reached the batch function.
	do(ctx context.Context, item T) (T, error)
	// close stops the committer; later calls of do fail.
	close()
}

// pending is one submitted item; the batch function must close done when it
// is finished with it.
type pending[T any] struct {
	item T
	done chan struct{}
}

// batchFunc does the work of a batch. ctx bounds the whole batch.
type batchFunc[T any] func(ctx context.Context, batch []*pending[T])

// inlineCommit runs every item as a batch of one, in the caller's goroutine
// and under the caller's context: no goroutines, nothing to close.
type inlineCommit[T any] struct{ run batchFunc[T] }

func (c inlineCommit[T]) do(ctx context.Context, item T) (T, error) {
	if err := ctx.Err(); err != nil {
		return item, context.Cause(ctx)
	}
	p := &pending[T]{item: item, done: make(chan struct{})}
	c.run(ctx, []*pending[T]{p})
	return p.item, nil
}

func (inlineCommit[T]) close() {}

// groupCommit runs work that arrives together as one batch: committer
// goroutines each take the first waiting item and every item that arrived
// with it (up to maxBatch) and hand them to run at once. It is how the
// ledger and the event log pay for one transaction per batch instead of one
// per call on a hot row.
type groupCommit[T any] struct {
	items     chan *pending[T]
	stop      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
	maxBatch  int
	run       batchFunc[T]
}

// errClosed: work reached a group committer after close.
var errClosed = errors.New("store closed")

// batchTimeout bounds one group transaction; it runs detached from any one
// caller's context, since it carries other callers' work too.
const batchTimeout = 30 * time.Second

func newGroupCommit[T any](committers, maxBatch int, run batchFunc[T]) *groupCommit[T] {
	g := &groupCommit[T]{
		items:    make(chan *pending[T]),
		stop:     make(chan struct{}),
		maxBatch: maxBatch,
		run:      run,
	}
	g.wg.Add(committers)
	for range committers {
		go g.commit()
	}
	return g
}

// do submits item and waits until its batch ran. Once a committer has taken
// the item the caller waits for the outcome even if ctx ends, so that work
// done in the database is never done without its caller knowing.
func (g *groupCommit[T]) do(ctx context.Context, item T) (T, error) {
	p := &pending[T]{item: item, done: make(chan struct{})}
	select {
	case g.items <- p:
	case <-ctx.Done():
		return item, context.Cause(ctx)
	case <-g.stop:
		return item, errClosed
	}
	<-p.done
	return p.item, nil
}

func (g *groupCommit[T]) commit() {
	defer g.wg.Done()
	batch := make([]*pending[T], 0, g.maxBatch)
	for {
		batch = batch[:0]
		select {
		case p := <-g.items:
			batch = append(batch, p)
		case <-g.stop:
			return
		}
	more:
		for len(batch) < g.maxBatch {
			select {
			case p := <-g.items:
				batch = append(batch, p)
			default:
				break more
			}
		}
		g.runBatch(batch)
	}
}

func (g *groupCommit[T]) runBatch(batch []*pending[T]) {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	g.run(ctx, batch)
}

// close stops the committers; safe to call more than once.
func (g *groupCommit[T]) close() {
	g.closeOnce.Do(func() { close(g.stop) })
	g.wg.Wait()
}
