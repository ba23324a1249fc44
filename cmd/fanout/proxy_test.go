package main

import (
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// tcpProxy forwards loopback connections to a target address until it is
// cut, so that a test can partition one process from Postgres while the
// others still reach it.
type tcpProxy struct {
	lis    net.Listener
	target string

	mu    sync.Mutex
	mode  proxyMode
	conns map[net.Conn]struct{} // every open connection, both sides
	wg    sync.WaitGroup        // the accept loop and every copier
}

// proxyMode is what a tcpProxy does with the bytes it gets.
type proxyMode int

const (
	forwarding proxyMode = iota
	// reset: every connection was reset (RST) and new ones are refused.
	reset
	// blackHoled: the proxy reads what either side sends and forwards
	// nothing, and accepts new connections without ever dialling the
	// target, so that every peer waits for replies that never come — a
	// partition as the far side of a dropped route looks, not a refusal.
	blackHoled
)

// startProxy returns a proxy from a loopback port to target (HOST:PORT),
// closed when the test ends.
func startProxy(t testing.TB, target string) *tcpProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{lis: lis, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// proxiedURL returns databaseURL (postgres://...@HOST:PORT/db) through a new
// proxy to its host.
func proxiedURL(t testing.TB, databaseURL string) (string, *tcpProxy) {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	if u.Host == "" {
		t.Fatalf("the partition tests need a TCP database URL (postgres://user@HOST:PORT/db) to put a proxy in; "+
			"TEST_DATABASE_URL names no host: %s", u.Redacted())
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5432")
	}
	p := startProxy(t, target)
	u.Host = p.lis.Addr().String()
	return u.String(), p
}

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return // closed: by cut(reset) or close
		}
		p.mu.Lock()
		mode := p.mode
		p.mu.Unlock()
		switch mode {
		case reset:
			resetConn(c)
		case blackHoled:
			p.hold(c, nil)
		default:
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				resetConn(c)
				continue
			}
			p.hold(c, s)
			p.hold(s, c)
		}
	}
}

// hold tracks src and copies what it sends to dst (nil: nowhere) until src
// is closed, forwarding only while the proxy forwards.
func (p *tcpProxy) hold(src, dst net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == reset {
		resetConn(src)
		return
	}
	p.conns[src] = struct{}{}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && dst != nil && p.forwarding() {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				if tc, ok := dst.(*net.TCPConn); ok && errors.Is(err, io.EOF) && p.forwarding() {
					_ = tc.CloseWrite() // pass the half-close on
				}
				return
			}
		}
	}()
}

func (p *tcpProxy) forwarding() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode == forwarding
}

// resetConn closes c with an RST rather than a FIN.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// cut partitions the proxy's clients from the target: reset resets every
// connection and refuses new ones; blackHoled keeps every connection open
// and silent and accepts new ones into the same silence.
func (p *tcpProxy) cut(mode proxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = mode
	if mode != reset {
		return
	}
	_ = p.lis.Close() // a connect now gets ECONNREFUSED
	for c := range p.conns {
		resetConn(c)
	}
	clear(p.conns)
}

// drop resets every open connection and goes on forwarding new ones — a
// dropped connection, as a client sees a load balancer's restart — and
// returns how many it reset (both sides of each).
func (p *tcpProxy) drop() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns)
	for c := range p.conns {
		resetConn(c)
	}
	clear(p.conns)
	return n
}

// close resets every connection and waits for the proxy's goroutines.
func (p *tcpProxy) close() {
	p.cut(reset)
	p.wg.Wait()
}
