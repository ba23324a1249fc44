// Package poll is the one loop by which a node learns of changes in the
// database: a poll on a timer, and at once when a notification wakes it.
// The budget watcher (runs ended, budget.Watcher) and the authenticator
// (keys revoked, rates changed, auth.Authenticator) each run one, woken by
// the process's one LISTEN connection (store.Notifier).
//
// A notification only wakes the loop: any database login may NOTIFY, so
// what is done is what the poll reads from the tables. Wakes that arrive
// while a poll runs make exactly one more poll, so however many arrive, one
// poll runs at a time and none is lost.
package poll

import (
	"context"
	"time"
)

// Loop polls every interval and when woken. The zero Loop is not usable:
// call New.
type Loop struct {
	wake chan struct{}
}

// New returns a loop that is not running yet (Wake before Run is kept).
func New() *Loop { return &Loop{wake: make(chan struct{}, 1)} }

// Wake asks for a poll as soon as the one under way, if any, ends. It never
// blocks.
func (l *Loop) Wake() {
	select {
	case l.wake <- struct{}{}:
	default: // a poll is already asked for
	}
}

// Run calls poll interval after the end of the last poll, and after each
// Wake, until ctx ends. poll runs on Run's goroutine, one call at a time:
// call Run once per Loop.
func (l *Loop) Run(ctx context.Context, interval time.Duration, poll func(context.Context)) {
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.wake:
		}
		// This poll answers every wake so far (one that came with the
		// tick too); a wake during it asks for one more.
		select {
		case <-l.wake:
		default:
		}
		poll(ctx)
		t.Reset(interval)
	}
}
