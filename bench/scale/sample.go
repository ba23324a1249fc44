package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fanout/fanout/bench/internal/fleet"
)

// sample is the fleet at one moment.
type sample struct {
	at                 time.Time
	orchRSS, workerRSS int64 // bytes, all orchestrators, all workers
	// orchHeap, workerHeap: the Go heap live after each node's last
	// collection (gctrace), all together; stacks likewise.
	orchHeap, workerHeap, orchStacks, workerStacks int64
	// orchGoroutines, workerGoroutines: go_goroutines of /metrics, -1 if
	// the binary serves none.
	orchGoroutines, workerGoroutines float64
	// inFlight: subagents running on the workers (their /metrics), -1 if
	// none says.
	inFlight float64
	pgConns  int            // backends of the fanout database
	pgByApp  map[string]int // by application_name (or user)
}

func (s sample) rss() int64 { return s.orchRSS + s.workerRSS }

// progressEvery: a progress line on stderr every so many samples.
const progressEvery = 10

// sampler samples the fleet every interval until stopped; it also adds up
// the wait events of PostgreSQL's active backends over its samples.
type sampler struct {
	h        *harness
	d        *deployment
	mu       sync.Mutex
	samples  []sample
	waits    map[string]int // "type:event" of an active backend, per sample
	active   int            // active backends, per sample
	errs     []string
	stopOnce sync.Once
	stopped  chan struct{}
	cancel   context.CancelFunc
}

func (h *harness) startSampler(ctx context.Context, d *deployment) *sampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &sampler{h: h, d: d, waits: map[string]int{}, stopped: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(s.stopped)
		t := time.NewTicker(h.cfg.sample)
		defer t.Stop()
		for {
			s.take(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop stops the sampler after one last sample and returns the samples.
func (s *sampler) stop(ctx context.Context) []sample {
	s.stopOnce.Do(func() {
		s.cancel()
		<-s.stopped
		s.take(ctx)
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// take reads one sample; what it cannot read it notes once.
func (s *sampler) take(ctx context.Context) {
	if ctx.Err() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	smp := sample{at: time.Now(), orchGoroutines: -1, workerGoroutines: -1, inFlight: -1, pgByApp: map[string]int{}}
	add := func(v *float64, x float64) {
		if *v < 0 {
			*v = 0
		}
		*v += x
	}
	for i, group := range [][]*fleet.Node{s.d.fl.Orchestrators, s.d.fl.Workers} {
		for _, n := range group {
			rss, _ := fleet.RSS(n.Pid())
			gc, _ := s.d.heaps.get(n.Name)
			m, err := fleet.Scrape(ctx, n.Metrics)
			if err != nil && ctx.Err() == nil {
				s.note(err.Error())
			}
			g, gok := m.Value("go_goroutines", nil)
			if i == 0 {
				smp.orchRSS += rss
				smp.orchHeap += gc.live
				smp.orchStacks += gc.stacks
				if gok {
					add(&smp.orchGoroutines, g)
				}
				continue
			}
			smp.workerRSS += rss
			smp.workerHeap += gc.live
			smp.workerStacks += gc.stacks
			if gok {
				add(&smp.workerGoroutines, g)
			}
			if v, ok := m.Value("fanout_subagents_running", nil); ok {
				add(&smp.inFlight, v)
			} else if v, ok := m.Value("fanout_worker_capacity_used", nil); ok {
				add(&smp.inFlight, v)
			}
		}
	}
	waits := map[string]int{}
	active := 0
	// A lock wait says which statement waits: the ledger function or the
	// table written, else the statement's start.
	rows, err := s.h.owner.Query(ctx, `SELECT coalesce(nullif(application_name, ''), usename::text, '?'), state,
			coalesce(wait_event_type || ':' || wait_event, '') ||
			CASE WHEN wait_event_type = 'Lock' THEN ' (' || coalesce(
				substring(query FROM '(ledger_[a-z_]+|INSERT INTO [a-z_.]+|UPDATE [a-z_.]+|DELETE FROM [a-z_.]+)'),
				left(regexp_replace(query, '\s+', ' ', 'g'), 40)) || ')' ELSE '' END
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		if ctx.Err() == nil {
			s.note("pg_stat_activity: " + err.Error())
		}
	} else {
		for rows.Next() {
			var app, state, wait string
			var st *string
			if err := rows.Scan(&app, &st, &wait); err != nil {
				s.note("pg_stat_activity: " + err.Error())
				break
			}
			if st != nil {
				state = *st
			}
			smp.pgConns++
			smp.pgByApp[app]++
			if state == "active" {
				active++
				if wait != "" && wait != "Client:ClientRead" {
					waits[wait]++
				}
			}
		}
		rows.Close()
	}
	if ctx.Err() != nil {
		return // stopped while sampling: a partial sample
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = append(s.samples, smp)
	if len(s.samples)%progressEvery == 0 {
		fmt.Fprintf(os.Stderr, "bench-scale: in flight %.0f, RSS orchestrators %s workers %s, PostgreSQL connections %d\n",
			smp.inFlight, mib(smp.orchRSS), mib(smp.workerRSS), smp.pgConns)
	}
	s.active += active
	for k, v := range waits {
		s.waits[k] += v
	}
}

func (s *sampler) note(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.errs {
		if e == msg {
			return
		}
	}
	if len(s.errs) < 5 {
		s.errs = append(s.errs, msg)
		fmt.Fprintf(os.Stderr, "bench-scale: sample: %s\n", msg)
	}
}

// topWaits is the commonest wait events of active backends over the
// samples, "type:event n%" of the active backend samples.
func (s *sampler) topWaits(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range s.waits {
		all = append(all, kv{k, v})
	}
	sortDesc(all, func(x kv) int { return x.v })
	var out []string
	for i, w := range all {
		if i == n {
			break
		}
		out = append(out, fmt.Sprintf("%s %.0f%%", w.k, 100*float64(w.v)/float64(max(1, s.active))))
	}
	if len(out) == 0 {
		return "none seen"
	}
	return strings.Join(out, ", ")
}
