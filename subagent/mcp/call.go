package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanout/fanout/subagent"
)

// releaseTimeout bounds releasing a call's slots after it ended.
const releaseTimeout = 5 * time.Second

// errClosedMidCall is the cause of a call cut off by Manager.Close: unlike
// ErrClosed, the call may have reached the server.
var errClosedMidCall = errors.New("mcp manager closed during the call")

// toolFunc returns the subagent.ToolFunc of tool t: rate bucket, then
// slots, then the call on the server's session, under the slots' lease.
func (s *server) toolFunc(t ToolConfig) subagent.ToolFunc {
	return func(ctx context.Context, call subagent.ToolCall) (subagent.ToolResult, error) {
		res, err := s.call(ctx, t, call)
		if err != nil {
			return subagent.ToolResult{}, s.secrets.err(fmt.Errorf("mcp server %s: tool %s: %w", s.cfg.Name, t.Name, err))
		}
		res.Text = s.secrets.text(res.Text)
		for i, src := range res.Sources {
			res.Sources[i] = s.secrets.text(src)
		}
		return res, nil
	}
}

func (s *server) call(ctx context.Context, t ToolConfig, call subagent.ToolCall) (subagent.ToolResult, error) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(s.spanAttrs(t.Name)...)
	args, err := arguments(call.Args)
	if err != nil {
		return subagent.ToolResult{}, fmt.Errorf("%w: %w", subagent.ErrNotSent, err)
	}
	var meta sdk.Meta
	if call.IdempotencyKey != "" {
		meta = sdk.Meta{MetaIdempotencyKey: call.IdempotencyKey}
	}
	if err := s.takeRate(ctx, span); err != nil {
		return subagent.ToolResult{}, err
	}
	lease, err := s.acquire(ctx, t, span)
	if err != nil {
		return subagent.ToolResult{}, err
	}
	var res *sdk.CallToolResult
	var sendErr error
	ran := false
	send := func(ctx context.Context) error {
		ran = true
		res, sendErr = s.send(ctx, span, t.Name, args, meta)
		return sendErr
	}
	if lease == nil {
		_ = send(ctx) // sendErr has it.
	} else {
		holdErr := lease.Hold(ctx, send)
		if !ran {
			sendErr = fmt.Errorf("%w: hold the slots: %w", subagent.ErrNotSent, holdErr)
		}
		s.release(ctx, lease, sendErr)
	}
	if sendErr != nil {
		return subagent.ToolResult{}, sendErr
	}
	return result(res, s.cfg.MaxResultBytes), nil
}

// arguments returns the model's arguments as they came, or {} for none;
// anything but a JSON object is refused before it is sent.
func arguments(raw json.RawMessage) (json.RawMessage, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return json.RawMessage("{}"), nil
	}
	if trimmed[0] != '{' || !json.Valid(trimmed) {
		return nil, fmt.Errorf("arguments are not a JSON object: %.60s", trimmed)
	}
	return raw, nil
}

// takeRate waits until the server's rate bucket lets one call through.
func (s *server) takeRate(ctx context.Context, span trace.Span) error {
	if s.cfg.RPM == 0 {
		return nil
	}
	start := time.Now()
	outcome := "ended"
	defer func() {
		wait := time.Since(start)
		span.SetAttributes(attrRateWait.Float64(wait.Seconds()))
		s.m.inst.rateWait.Record(context.WithoutCancel(ctx), wait.Seconds(),
			metric.WithAttributes(attrServer.String(s.cfg.Name), attrOutcome.String(outcome)))
	}()
	for {
		wait, err := s.m.opts.RateLimiter.Take(ctx, s.bucket(), 1, 0)
		switch {
		case err != nil && ctx.Err() != nil:
			return fmt.Errorf("%w: wait for rate bucket %s: %w", subagent.ErrNotSent, s.bucket(), context.Cause(ctx))
		case err != nil:
			return fmt.Errorf("%w: take from rate bucket %s: %w", subagent.ErrNotSent, s.bucket(), err)
		case wait <= 0:
			outcome = "taken"
			return nil
		}
		// A little jitter keeps waiting callers from arriving together.
		wait += rand.N(wait/4 + time.Millisecond)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("%w: wait for rate bucket %s: %w", subagent.ErrNotSent, s.bucket(), context.Cause(ctx))
		case <-timer.C:
		}
	}
}

// slots returns the slots a call of t takes: the server's and the tool's
// max_in_flight, taken together.
func (s *server) slots(t ToolConfig) []SlotRequest {
	var want []SlotRequest
	if s.cfg.MaxInFlight > 0 {
		want = append(want, SlotRequest{Key: "mcp:" + s.cfg.Name, Limit: s.cfg.MaxInFlight})
	}
	if t.MaxInFlight > 0 {
		want = append(want, SlotRequest{Key: "mcp:" + s.cfg.Name + "/" + t.Name, Limit: t.MaxInFlight})
	}
	return want
}

// acquire takes the call's slots, waiting until ctx ends; nil if it needs
// none.
func (s *server) acquire(ctx context.Context, t ToolConfig, span trace.Span) (Lease, error) {
	want := s.slots(t)
	if len(want) == 0 {
		return nil, nil
	}
	start := time.Now()
	lease, err := s.m.opts.Semaphore.Acquire(ctx, s.m.opts.Holder, want, s.m.opts.SlotTTL)
	wait := time.Since(start)
	outcome := "acquired"
	if err != nil {
		outcome = "ended"
	}
	span.SetAttributes(attrSlotWait.Float64(wait.Seconds()))
	s.m.inst.slotWait.Record(context.WithoutCancel(ctx), wait.Seconds(), metric.WithAttributes(
		attrServer.String(s.cfg.Name), attrTool.String(t.Name), attrOutcome.String(outcome)))
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, fmt.Errorf("%w: wait for a slot (max_in_flight): %w", subagent.ErrNotSent, err)
	}
	return lease, nil
}

// release frees a call's slots: at once after a call whose outcome is
// known, after the grace after one cut off mid-flight (the server may
// still be running it).
func (s *server) release(ctx context.Context, lease Lease, callErr error) {
	grace := time.Duration(0)
	if callErr != nil && !errors.Is(callErr, subagent.ErrNotSent) && !answered(callErr) {
		grace = s.m.opts.SlotGrace
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := lease.Release(rctx, grace); err != nil {
		s.log.WarnContext(ctx, "release mcp slots; they free themselves when their lease ends", "grace", grace, "err", err)
	}
}

// send calls the tool on the server's session. If the call provably never
// reached the server (see neverSent), it is sent once more on a fresh
// session, whatever its effect: the first never happened. A call that may
// have reached the server is never sent again. The error of a call that
// never reached the server wraps subagent.ErrNotSent.
func (s *server) send(ctx context.Context, span trace.Span, name string, args json.RawMessage, meta sdk.Meta) (*sdk.CallToolResult, error) {
	// Close cuts off the calls in flight (the SDK's Close waits for them).
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(s.m.ctx, func() { cancel(errClosedMidCall) })
	defer stop()
	for attempt := 1; ; attempt++ {
		sess, err := s.session(ctx)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", subagent.ErrNotSent, err)
		}
		actx, p := withProbe(ctx)
		res, err := sess.cs.CallTool(actx, &sdk.CallToolParams{Name: name, Arguments: args, Meta: meta})
		switch {
		case err == nil:
			return res, nil
		case ctx.Err() != nil && s.neverSent(err, p):
			return nil, fmt.Errorf("%w: cut off before it was sent: %w", subagent.ErrNotSent, context.Cause(ctx))
		case ctx.Err() != nil:
			// The SDK has sent notifications/cancelled; the server may have
			// acted already.
			return nil, fmt.Errorf("call cut off: %w", context.Cause(ctx))
		case !s.neverSent(err, p):
			return nil, err
		}
		s.drop(sess)
		if attempt > 1 {
			return nil, fmt.Errorf("%w: %w", subagent.ErrNotSent, err)
		}
		span.SetAttributes(attrRetried.Bool(true))
		s.log.InfoContext(ctx, "mcp call refused before it reached the tool: sending it on a fresh session", "tool", name, "err", err)
	}
}

// neverSent reports whether a failed attempt of a call provably never
// reached the tool. The evidence is the probe's, never the call's error:
// the SDK reports a request it refused to write on a broken connection as
// sdk.ErrConnectionClosed, but so too a server's own JSON-RPC reply with
// code -32003 or -32004 (the call reached the tool; it may have acted).
//   - over HTTP, the watcher's: no whole request was written, or the
//     server refused it with a 4xx (a session it does not know, a token it
//     refuses, "Bad Request: No valid session ID" from the TypeScript
//     SDK's servers after a restart);
//   - on any other transport (stdio, in-memory), the connection's: the
//     request was never handed to its Write (jsonrpc2 checks before it
//     writes: a session already known broken), or the Write failed with
//     EPIPE (the server's stdin has no reader: it exited).
//
// Anything else may have reached the tool: an answer (a JSON-RPC error),
// a connection lost after the request was written, a 5xx.
func (s *server) neverSent(_ error, p *probe) bool {
	if s.watchedHTTP() {
		return p.neverSent()
	}
	return p.notWritten()
}

// watchedHTTP reports whether the server's calls go through the HTTP
// client's watcher (a configured HTTP server), not a probed connection.
func (s *server) watchedHTTP() bool {
	return s.cfg.Transport == TransportHTTP && s.m.opts.transport == nil
}

// answered reports whether err is the server's answer (a JSON-RPC error
// reply): the call's outcome is known, nothing is still running.
func answered(err error) bool {
	var rpc *jsonrpc.Error
	return errors.As(err, &rpc)
}

// result turns an MCP result into the model's: text contents in order,
// what cannot be shown as a line saying what it was, structured content as
// JSON if there is no text (servers send both, the text being the JSON),
// resource URIs as sources; cut at maxBytes with a marker.
func result(res *sdk.CallToolResult, maxBytes int) subagent.ToolResult {
	var parts, sources []string
	for _, c := range res.Content {
		switch c := c.(type) {
		case *sdk.TextContent:
			parts = append(parts, c.Text)
		case *sdk.ResourceLink:
			sources = append(sources, c.URI)
			parts = append(parts, fmt.Sprintf("[resource link: %s%s]", c.URI, named(c.Name, c.Title)))
		case *sdk.EmbeddedResource:
			if c.Resource == nil {
				continue
			}
			sources = append(sources, c.Resource.URI)
			if c.Resource.Text != "" {
				parts = append(parts, c.Resource.Text)
			} else {
				parts = append(parts, fmt.Sprintf("[resource %s: %d bytes of %s, not shown]", c.Resource.URI, len(c.Resource.Blob), mimeOr(c.Resource.MIMEType)))
			}
		case *sdk.ImageContent:
			parts = append(parts, fmt.Sprintf("[image: %d bytes of %s, not shown]", len(c.Data), mimeOr(c.MIMEType)))
		case *sdk.AudioContent:
			parts = append(parts, fmt.Sprintf("[audio: %d bytes of %s, not shown]", len(c.Data), mimeOr(c.MIMEType)))
		}
	}
	hasText := false
	for _, c := range res.Content {
		if _, ok := c.(*sdk.TextContent); ok {
			hasText = true
		}
	}
	if !hasText && res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			parts = append(parts, string(b))
		}
	}
	return subagent.ToolResult{
		Text:    truncate(strings.Join(parts, "\n"), maxBytes),
		Sources: sources,
		IsError: res.IsError,
	}
}

func named(name, title string) string {
	switch {
	case title != "":
		return " (" + title + ")"
	case name != "":
		return " (" + name + ")"
	}
	return ""
}

func mimeOr(m string) string {
	if m == "" {
		return "unknown type"
	}
	return m
}

// truncate cuts text to at most maxBytes (on a character boundary) and
// appends a marker saying how much was cut.
func truncate(text string, maxBytes int) string {
	if maxBytes <= 0 || len(text) <= maxBytes {
		return text
	}
	cut := maxBytes
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut--
	}
	return fmt.Sprintf("%s\n[truncated: %d of %d bytes cut; results are limited to %d bytes]",
		text[:cut], len(text)-cut, len(text), maxBytes)
}
