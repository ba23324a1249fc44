package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The NOTIFY channels of schema fanout, which the Notifier LISTENs on.
const (
	// runStateChannel: the ledger functions signal a run's end; the
	// payload is "<state> <run_id>".
	runStateChannel = "fanout_run_state"
	// KeyRevokedChannel: admin_revoke_key signals a revoked key's id.
	KeyRevokedChannel = "fanout_key_revoked"
	// TenantQuotasChannel: admin_set_quotas signals a tenant whose quotas
	// changed.
	TenantQuotasChannel = "fanout_tenant_quotas"
	// RunEventsChannel: the run store signals the heads of the runs whose
	// events it wrote, "<run_id> <last_sequence>" joined by ",", once the
	// writes have returned (headnotices.go).
	RunEventsChannel = "fanout_run_events"
)

// What a Notifier's session runs once connected, and the last statement
// it runs: it LISTENs on a fixed set of the schema's channels whatever the
// number of runs, streams or tenants (a run is named in a payload, never
// in a channel), in one round trip (a simple query: LISTEN takes no
// parameter, the names are constants). pg_stat_activity.query shows it for
// the session.
//
// Only a process that serves an orchestrator listens on RunEventsChannel,
// the busiest channel, which nothing else reads. A listening session's
// backend reads PostgreSQL's notification queue for its client and skips
// what the client does not listen for; once what it must send to a client
// that does not read (a stopped, paused process) fills the socket's
// buffer, it stops and holds the queue's tail, and once the queue is full
// every NOTIFY fails (docs/operations.md "What queues when a pool is
// busy"). A stopped worker listening on run events would do so within
// seconds under load; on the rarer channels alone, far later.
const (
	// ListenStatement is an orchestrator's: every channel.
	ListenStatement = WorkerListenStatement + "; LISTEN " + RunEventsChannel
	// WorkerListenStatement is a process's without an orchestrator
	// (NotifierConfig.WithoutRunEvents): every channel but RunEventsChannel.
	WorkerListenStatement = "LISTEN " + runStateChannel + "; LISTEN " + KeyRevokedChannel + "; LISTEN " +
		TenantQuotasChannel
)

// ListenerApplicationName is the application_name of the Notifier's
// connection, so operators (and tests) can find it in pg_stat_activity.
const ListenerApplicationName = "fanout-listen"

// Default backoff of the Notifier's reconnects (full jitter between).
const (
	DefaultListenMinBackoff = 100 * time.Millisecond
	DefaultListenMaxBackoff = 5 * time.Second
)

// NotifierConfig tunes a Notifier.
type NotifierConfig struct {
	// MinBackoff and MaxBackoff bound the wait before a reconnect, which
	// doubles from MinBackoff after each failed try (a random time up to
	// it is slept). Defaults DefaultListenMinBackoff, DefaultListenMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives a lost connection's warning. Default slog.Default().
	Logger *slog.Logger
	// WithoutRunEvents: the process serves no orchestrator, and nothing
	// in it hears RunEventsChannel; the session does not LISTEN on it
	// (WorkerListenStatement), and ListenEvents fails at once.
	WithoutRunEvents bool
}

// Handler is what a subscriber of a channel is told: each notification's
// payload, and each time the Notifier has (re)connected and listens, after
// which what was sent while it was away is gone (poll then). Either may be
// nil. Both run on the Notifier's goroutine: they must return quickly.
type Handler struct {
	Notify    func(payload string)
	Connected func()
}

// Notifier is a process's one LISTEN connection (a pooled connection would
// be reused by others): it listens on the schema's channels (all of them
// but RunEventsChannel, WithoutRunEvents), hands
// each notification to the subscribers of its channel, and reconnects with
// backoff when the connection is lost. Any database login may NOTIFY, so a
// subscriber takes a notification as a hint to read the tables, never as
// an order.
type Notifier struct {
	url string
	cfg NotifierConfig

	mu        sync.Mutex
	subs      map[string]map[*Handler]struct{}
	listening bool // connected and LISTENing now
}

// NewNotifier returns a notifier that listens on its own connection to
// databaseURL once Run is called.
func NewNotifier(databaseURL string, cfg NotifierConfig) *Notifier {
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultListenMinBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(cfg.MinBackoff, DefaultListenMaxBackoff)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Notifier{url: databaseURL, cfg: cfg, subs: map[string]map[*Handler]struct{}{}}
}

// Subscribe hands the notifications of channel (one of the schema's) to h
// until the returned function is called. If the notifier is listening
// already, h.Connected is called at once (on the caller's goroutine): a
// subscriber always hears, at least once per connection, that it may have
// missed something (twice if it joins while a lost connection is not yet
// noticed). A handler may run once more just after its unsubscribe.
func (n *Notifier) Subscribe(channel string, h Handler) (unsubscribe func()) {
	hp := &h
	n.mu.Lock()
	if n.subs[channel] == nil {
		n.subs[channel] = map[*Handler]struct{}{}
	}
	n.subs[channel][hp] = struct{}{}
	listening := n.listening
	n.mu.Unlock()
	if listening && h.Connected != nil {
		h.Connected()
	}
	return func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.subs[channel], hp)
	}
}

// handlers returns the subscribers of channel.
func (n *Notifier) handlers(channel string) []*Handler {
	n.mu.Lock()
	defer n.mu.Unlock()
	hs := make([]*Handler, 0, len(n.subs[channel]))
	for h := range n.subs[channel] {
		hs = append(hs, h)
	}
	return hs
}

func (n *Notifier) setListening(on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.listening = on
}

// Statement is what n's session runs once connected: ListenStatement, or
// WorkerListenStatement WithoutRunEvents.
func (n *Notifier) Statement() string {
	if n.cfg.WithoutRunEvents {
		return WorkerListenStatement
	}
	return ListenStatement
}

// ErrNoRunEvents is what ListenEvents returns at once from a Notifier
// WithoutRunEvents.
var ErrNoRunEvents = errors.New("this process's notifier does not listen on " + RunEventsChannel +
	" (it serves no orchestrator): the poll alone carries other nodes' events")

// Run listens until ctx ends, reconnecting with backoff, and returns nil
// then.
func (n *Notifier) Run(ctx context.Context) error {
	backoff := n.cfg.MinBackoff
	for ctx.Err() == nil {
		connected, err := n.listen(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if connected {
			backoff = n.cfg.MinBackoff
		}
		n.cfg.Logger.WarnContext(ctx, "listener lost, reconnecting; subscribers poll when it is back", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Duration(rand.Int64N(int64(backoff)) + 1)): // full jitter
		}
		backoff = min(2*backoff, n.cfg.MaxBackoff)
	}
	return nil
}

// listen connects, LISTENs, tells every subscriber it is connected, then
// hands out notifications until the connection fails or ctx ends.
func (n *Notifier) listen(ctx context.Context) (connected bool, err error) {
	cfg, err := pgx.ParseConfig(n.url)
	if err != nil {
		return false, fmt.Errorf("listen: %w", redactURLError(err))
	}
	cfg.RuntimeParams["application_name"] = ListenerApplicationName
	setSearchPath(cfg, Schema)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, fmt.Errorf("listen: connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.PgConn().Exec(ctx, n.Statement()).ReadAll(); err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	// The subscribers as of the moment it is listening: one that
	// subscribes later is told by Subscribe, so each hears it once.
	n.mu.Lock()
	n.listening = true
	var hs []*Handler
	for _, set := range n.subs {
		for h := range set {
			hs = append(hs, h)
		}
	}
	n.mu.Unlock()
	defer n.setListening(false)
	for _, h := range hs {
		if h.Connected != nil {
			h.Connected()
		}
	}
	for {
		msg, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, fmt.Errorf("wait for a notification: %w", err)
		}
		for _, h := range n.handlers(msg.Channel) {
			if h.Notify != nil {
				h.Notify(msg.Payload)
			}
		}
	}
}

// ErrNoNotifier is what a listen without a Notifier returns at once: the
// poll alone carries changes.
var ErrNoNotifier = errors.New("no notifier: notifications are off, the poll alone carries changes")

// subscribe hands the notifications of each channel of on to its
// function, and calls ready on every (re)connect, until ctx ends;
// ErrNoNotifier at once when n is nil.
func (n *Notifier) subscribe(ctx context.Context, ready func(), on map[string]func(payload string)) error {
	if n == nil {
		return ErrNoNotifier
	}
	var last string
	for ch, notify := range on {
		defer n.Subscribe(ch, Handler{Notify: notify})()
		last = ch
	}
	// ready last, once every channel is heard: a ready called at once (the
	// notifier listens already) must not poll before a channel is.
	if ready != nil && last != "" {
		defer n.Subscribe(last, Handler{Connected: ready})()
	}
	<-ctx.Done()
	return nil
}

// ListenEvents implements orchestrator.EventNotices: until ctx ends, it
// hands moved each head a write of a run's events announced
// (RunEventsChannel), and calls ready on every (re)connect, after which
// what was announced while the Notifier was away is gone (re-read then).
// Any login may NOTIFY: a head is a hint to read the log, never trusted as
// the log's end. ErrNoNotifier at once when n is nil, ErrNoRunEvents when
// it is WithoutRunEvents.
func (n *Notifier) ListenEvents(ctx context.Context, ready func(), moved func(runID string, head int64)) error {
	if n != nil && n.cfg.WithoutRunEvents {
		return ErrNoRunEvents
	}
	return n.subscribe(ctx, ready, map[string]func(string){RunEventsChannel: func(payload string) {
		for run := range strings.SplitSeq(payload, ",") {
			runID, seq, ok := strings.Cut(run, " ")
			head, err := strconv.ParseInt(seq, 10, 64)
			if ok && err == nil {
				moved(runID, head)
			}
		}
	}})
}
