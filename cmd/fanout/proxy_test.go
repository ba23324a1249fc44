package main

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// tcpProxy forwards loopback connections to a target address until it is
// cut, so that a test can partition one process from Postgres while the
// others still reach it. It can also delay what it forwards (setLatency),
// as a slow or lossy network does, and heal a cut.
type tcpProxy struct {
	addr   string // its listening address, kept across a heal
	target string

	mu        sync.Mutex
	lis       net.Listener // the current listener
	lisClosed bool         // by cut(reset), until a heal
	mode      proxyMode
	conns     map[net.Conn]struct{} // every open connection, both sides
	lat       latency
	wg        sync.WaitGroup // the accept loop and every copier
}

// latency is what a tcpProxy adds to each chunk it forwards.
type latency struct {
	delay time.Duration // one way, every chunk
	// loss is the probability that a chunk is "lost": a userspace proxy
	// cannot drop a segment (TCP would retransmit it), so a loss is what
	// TCP makes of one, the chunk and every byte after it held back a
	// retransmission timeout more, drawn from [minRTO, maxRTO).
	loss           float64
	minRTO, maxRTO time.Duration
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
	p := &tcpProxy{lis: lis, addr: lis.Addr().String(), target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept(lis)
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
	u.Host = p.addr
	return u.String(), p
}

func (p *tcpProxy) accept(lis net.Listener) {
	defer p.wg.Done()
	for {
		c, err := lis.Accept()
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
// is closed, forwarding only while the proxy forwards, each chunk after the
// proxy's latency at the time it was read.
func (p *tcpProxy) hold(src, dst net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == reset {
		resetConn(src)
		return
	}
	p.conns[src] = struct{}{}
	// A delay line: the reader stamps each chunk with when it may go, the
	// writer sends them in order at those times, so that latency delays
	// the stream without slowing its throughput to one chunk per delay.
	line := make(chan chunk, 256)
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		defer close(line)
		var last time.Time // a chunk never goes before the one ahead of it: TCP keeps order
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				due := time.Now().Add(p.delayOfChunk())
				if due.Before(last) {
					due = last
				}
				last = due
				line <- chunk{b: buf[:n], due: due}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					line <- chunk{eof: true, due: last}
				}
				return
			}
		}
	}()
	go func() {
		defer p.wg.Done()
		broken := false
		for c := range line {
			if broken || dst == nil {
				continue // drain, so that the reader never blocks
			}
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d) // the simulated latency itself, not synchronization
			}
			if !p.forwarding() {
				continue
			}
			if c.eof {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite() // pass the half-close on
				}
				continue
			}
			if _, err := dst.Write(c.b); err != nil {
				broken = true
				_ = src.Close() // the reader stops; the other direction sees it
			}
		}
	}()
}

// chunk is one read of a delay line: its bytes (or the sender's EOF) and
// when it may be sent.
type chunk struct {
	b   []byte
	eof bool
	due time.Time
}

// delayOfChunk is how long the chunk read now waits before it is sent.
func (p *tcpProxy) delayOfChunk() time.Duration {
	p.mu.Lock()
	l := p.lat
	p.mu.Unlock()
	d := l.delay
	if l.loss > 0 && rand.Float64() < l.loss {
		d += l.minRTO + rand.N(max(l.maxRTO-l.minRTO, 1))
	}
	return d
}

// setLatency makes every chunk read from now on wait l before it is sent.
func (p *tcpProxy) setLatency(l latency) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lat = l
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
	if !p.lisClosed {
		_ = p.lis.Close() // a connect now gets ECONNREFUSED
		p.lisClosed = true
	}
	for c := range p.conns {
		resetConn(c)
	}
	clear(p.conns)
}

// heal ends a cut: every connection open through it is reset (a black-holed
// one lost bytes, as a TCP connection that timed out in the partition), and
// the proxy forwards and accepts again, on the same address.
func (p *tcpProxy) heal(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		resetConn(c)
	}
	clear(p.conns)
	p.mode = forwarding
	if !p.lisClosed {
		return
	}
	lis, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatalf("heal the proxy: listen on %s again: %v", p.addr, err)
	}
	p.lis, p.lisClosed = lis, false
	p.wg.Add(1)
	go p.accept(lis)
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
