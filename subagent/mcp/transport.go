package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// dialer makes the transport of one connect to a server: a new process
// for stdio, a new HTTP session for http. Secrets are read here, at every
// connect, so a rotated file is picked up by the next one.
type dialer struct {
	cfg     ServerConfig
	log     *slog.Logger
	rt      *http.Transport // http only: its connections are the server's
	secrets *secrets        // the tokens it read, redacted wherever they show
}

func newDialer(cfg ServerConfig, log *slog.Logger, sec *secrets) *dialer {
	d := &dialer{cfg: cfg, log: log, secrets: sec}
	if cfg.Transport == TransportHTTP {
		d.rt = http.DefaultTransport.(*http.Transport).Clone()
	}
	return d
}

// close frees the dialer's idle HTTP connections.
func (d *dialer) close() {
	if d.rt != nil {
		d.rt.CloseIdleConnections()
	}
}

func (d *dialer) transport(context.Context) (sdk.Transport, error) {
	switch d.cfg.Transport {
	case TransportStdio:
		return d.stdio()
	case TransportHTTP:
		return d.http()
	}
	return nil, fmt.Errorf("transport %q is not stdio or http", d.cfg.Transport)
}

// endpoint names where a server is for logs and errors: its command or
// its URL without the query (which might hold a credential).
func (d *dialer) endpoint() string {
	if d.cfg.Transport == TransportStdio {
		return d.cfg.Command
	}
	u, err := url.Parse(d.cfg.URL)
	if err != nil {
		return "(bad url)"
	}
	u.RawQuery, u.Fragment, u.User = "", "", nil
	return u.String()
}

func (d *dialer) stdio() (sdk.Transport, error) {
	env, secrets, err := resolveEnv(d.cfg.Env)
	if err != nil {
		return nil, err
	}
	// exec.Command, not CommandContext: the process is the session's and
	// outlives the connect; the transport's Close ends it.
	cmd := exec.Command(d.cfg.Command, d.cfg.Args...)
	cmd.Env = env
	cmd.Stderr = &stderrLog{log: d.log, secrets: secrets}
	// A server's own children (npx runs node) may hold stderr open after
	// it exits; Wait gives up on them after this.
	cmd.WaitDelay = stderrWaitDelay
	return &sdk.CommandTransport{Command: cmd}, nil
}

// resolveEnv returns a stdio server's environment: PATH and HOME from the
// worker, then the configured entries, and the secret values among them
// (to redact from the server's stderr).
func resolveEnv(vars []EnvVar) (env, secrets []string, err error) {
	for _, k := range []string{"PATH", "HOME"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	for _, e := range vars {
		v := e.Value
		switch {
		case e.FromFile != "":
			if v, err = readSecretFile(e.FromFile); err != nil {
				return nil, nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			secrets = append(secrets, v)
		case e.FromEnv != "":
			if v, err = lookupSecretEnv(e.FromEnv); err != nil {
				return nil, nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			secrets = append(secrets, v)
		}
		env = append(env, e.Name+"="+v)
	}
	return env, secrets, nil
}

func (d *dialer) http() (sdk.Transport, error) {
	var rt http.RoundTripper = d.rt
	if d.cfg.TokenFile != "" {
		token, err := readSecretFile(d.cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("token: %w", err)
		}
		d.secrets.add(token)
		u, err := url.Parse(d.cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("url: %s", "not a URL")
		}
		rt = &bearer{token: token, scheme: u.Scheme, host: u.Host, base: rt}
	}
	client := &http.Client{Transport: watcher{base: rt}}
	return &sdk.StreamableClientTransport{Endpoint: d.cfg.URL, HTTPClient: client}, nil
}

// probe is what was seen of one attempt of a call on its way to the
// server: the evidence for "never sent", which the SDK's errors cannot
// give (it reports a server's own -32003/-32004 reply and a request it
// refused to write alike, as ErrConnectionClosed). Over HTTP the watcher
// fills it, from the HTTP client; on every other transport the
// connection's Write does (probedConn).
type probe struct {
	mu sync.Mutex
	// Connection: the tools/call request was handed to the connection's
	// Write, and how that Write ended.
	handed   bool
	writeErr error
	// HTTP: a whole tools/call request went out on a connection, and the
	// status of the last answer to one (0: none).
	written bool
	status  int
}

type probeKey struct{}

// withProbe returns ctx carrying a new probe: the SDK writes a call's
// request with the call's context (jsonrpc2 hands it to the connection's
// Write; the HTTP connection sends the POST with it), so probedConn and
// watcher find the probe on it.
func withProbe(ctx context.Context) (context.Context, *probe) {
	p := &probe{}
	return context.WithValue(ctx, probeKey{}, p), p
}

// notWritten reports whether a call on a probed connection provably never
// reached the server: its request was never handed to the connection
// (jsonrpc2 refuses to write on a connection it knows is broken or
// closing), or writing it failed with EPIPE (a stdio server's stdin has
// no reader: it exited).
func (p *probe) notWritten() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.handed || errors.Is(p.writeErr, syscall.EPIPE)
}

// neverSent reports whether the server cannot have run the call: no whole
// request reached it, or it refused the request with a 4xx status (MCP's
// streamable HTTP: a server that "cannot accept the input" answers with
// an HTTP error status; a 404 is a session it does not know). A 5xx may
// come from a proxy whose upstream got the call: not proof.
func (p *probe) neverSent() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.written || (p.status >= 400 && p.status < 500)
}

// watcher records, on the probe of a call's context, what became of its
// tools/call POSTs.
type watcher struct{ base http.RoundTripper }

func (w watcher) RoundTrip(r *http.Request) (*http.Response, error) {
	p, _ := r.Context().Value(probeKey{}).(*probe)
	if p == nil || r.Method != http.MethodPost || !isToolCall(r) {
		return w.base.RoundTrip(r)
	}
	trace := &httptrace.ClientTrace{WroteRequest: func(info httptrace.WroteRequestInfo) {
		if info.Err == nil {
			p.mu.Lock()
			p.written = true
			p.mu.Unlock()
		}
	}}
	resp, err := w.base.RoundTrip(r.WithContext(httptrace.WithClientTrace(r.Context(), trace)))
	if err == nil {
		p.mu.Lock()
		p.status = resp.StatusCode
		p.mu.Unlock()
	}
	return resp, err
}

// isToolCall reports whether a POST's body is a tools/call request (not
// the notifications/cancelled that follows a cancelled one).
func isToolCall(r *http.Request) bool {
	if r.GetBody == nil {
		return false
	}
	body, err := r.GetBody()
	if err != nil {
		return false
	}
	defer func() { _ = body.Close() }() // A copy of a request body in memory.
	var msg struct {
		Method string `json:"method"`
	}
	return json.NewDecoder(body).Decode(&msg) == nil && msg.Method == "tools/call"
}

// probeWrites returns t whose connections record, on the probe of a
// call's context, what became of its tools/call request. Not for HTTP:
// the SDK tells its HTTP connection of the session's state through an
// unexported interface that a wrapper would hide, and the watcher sees
// more there (a 4xx refusal).
func probeWrites(t sdk.Transport) sdk.Transport { return probedTransport{t} }

type probedTransport struct{ sdk.Transport }

func (t probedTransport) Connect(ctx context.Context) (sdk.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return probedConn{c}, nil
}

// probedConn is a connection that records its tools/call writes.
type probedConn struct{ sdk.Connection }

func (c probedConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	p, _ := ctx.Value(probeKey{}).(*probe)
	req, _ := msg.(*jsonrpc.Request)
	if p == nil || req == nil || req.Method != "tools/call" {
		return c.Connection.Write(ctx, msg) // notifications/cancelled carries the probe too
	}
	if err := ctx.Err(); err != nil {
		return err // Not handed: nothing of it was written.
	}
	p.mu.Lock()
	p.handed = true
	p.mu.Unlock()
	err := c.Connection.Write(ctx, msg)
	p.mu.Lock()
	p.writeErr = err
	p.mu.Unlock()
	return err
}

// bearer adds the token to requests to the configured server only (a
// redirect to another host does not carry it), and redacts it from what
// that server answers.
type bearer struct {
	token, scheme, host string
	base                http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != b.scheme || r.URL.Host != b.host {
		return b.base.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := b.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	// A server may quote the token back (an error saying it is revoked, a
	// tool that echoes its headers): it goes no further than here.
	resp.Body = newRedactingBody(resp.Body, b.token)
	return resp, nil
}

// stderrLog logs a stdio server's stderr, one record a line (cut at
// maxStderrLine), with the values of its secret env entries redacted.
type stderrLog struct {
	log     *slog.Logger
	secrets []string
	mu      sync.Mutex
	buf     []byte // the current line, up to keep() bytes
}

const maxStderrLine = 1 << 10

const stderrWaitDelay = 2 * time.Second

// keep is how much of a line is kept: enough past maxStderrLine that a
// secret starting before the cut is whole when it is redacted.
func (w *stderrLog) keep() int {
	n := maxStderrLine
	for _, s := range w.secrets {
		n = max(n, maxStderrLine+len(s))
	}
	return n
}

func (w *stderrLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for rest := p; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		chunk := rest
		if i >= 0 {
			chunk = rest[:i]
		}
		if room := w.keep() - len(w.buf); room > 0 {
			w.buf = append(w.buf, chunk[:min(len(chunk), room)]...)
		}
		if i < 0 {
			break
		}
		w.emit()
		rest = rest[i+1:]
	}
	return len(p), nil
}

func (w *stderrLog) emit() {
	s := strings.TrimRight(string(w.buf), "\r")
	w.buf = w.buf[:0]
	for _, secret := range w.secrets {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	if len(s) > maxStderrLine {
		s = s[:maxStderrLine] + "..."
	}
	if s != "" {
		w.log.Info("mcp server stderr", "line", s)
	}
}
