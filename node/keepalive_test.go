package node_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/fanout/fanout/node"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent"
)

// The keepalive bounds, docs/api.md:121-123 and operations.md:303-304: "a
// client may ping at most every 10 s (also with no call open); faster pings
// get the connection closed (GOAWAY ENHANCE_YOUR_CALM). The server pings a
// connection idle for 1 min and" drops it 20 s after an unanswered ping.

// TestServerKeepaliveIsTheDocumentedOne pins what a backend's servers are
// built with (a backend as OpenBackend makes it for every server command):
// a ping after 1 min idle, a drop 20 s after an unanswered one, clients
// pinging at most every 10 s. TestServerPingsAnIdleConnectionAndDropsIt
// shows that the first two reach the gRPC server as those roles;
// TestClientPingingMoreOftenThanEvery10sIsSentGOAWAY measures the third.
func TestServerKeepaliveIsTheDocumentedOne(t *testing.T) {
	t.Parallel()
	b := backend(t, storetest.NewDB(t), node.BackendConfig{})
	ping, drop, clientMin := node.ServerKeepalive(b)
	if ping != time.Minute || drop != 20*time.Second || clientMin != 10*time.Second {
		t.Errorf("servers ping an idle connection after %v, drop it %v after an unanswered ping, let clients ping every %v; "+
			"want 1m0s, 20s, 10s (docs/api.md:121-123)", ping, drop, clientMin)
	}
}

// TestServerPingsAnIdleConnectionAndDropsIt: an orchestrator opened on a
// backend whose keepalive is shortened to a ping after 1 s idle and a drop
// 4 s after an unanswered ping (the same options, other durations: a
// minute and 20 s would make an 80 s test). A bare HTTP/2 connection that
// never answers is pinged no sooner than 1 s after its last frame and is
// closed no sooner than 1 + 4 s after it; one that answers every ping is
// pinged every second and is still open after 6 pings, past 1 + 4 s.
//
// Margins: the lower bounds are exact (the server cannot have read our last
// frame before we started writing it); the upper ones allow 2 s of
// lateness on top of each duration (measured: a few milliseconds).
func TestServerPingsAnIdleConnectionAndDropsIt(t *testing.T) {
	t.Parallel()
	const ping, drop, late = time.Second, 4 * time.Second, 2 * time.Second
	b := backend(t, storetest.NewDB(t), node.BackendConfig{})
	node.SetServerKeepalive(b, ping, drop)
	addr := keepaliveOrchestrator(t, b)

	t.Run("unanswered", func(t *testing.T) {
		t.Parallel()
		h := dialH2(t, addr)
		f, err := h.next(time.Now().Add(ping + late))
		pinged, last := time.Now(), h.lastWrite
		switch {
		case errors.Is(err, errTimeout):
			t.Fatalf("no ping from the server within %v of an idle connection", ping+late)
		case err != nil:
			t.Fatalf("waiting for the server's ping: %v", err)
		case f.typ != framePing || f.flags&flagAck != 0:
			t.Fatalf("got %v, want the server's PING", f)
		}
		if idle := pinged.Sub(last); idle < ping || idle > ping+late {
			t.Errorf("the server pinged a connection idle for %v, want after %v (at most %v late)", idle, ping, late)
		}
		// Not answered: the connection ends (EOF or a reset), no frame first.
		f, err = h.next(pinged.Add(drop + late))
		closed := time.Now()
		switch {
		case err == nil:
			t.Fatalf("got %v after an unanswered ping, want the connection closed", f)
		case errors.Is(err, errTimeout):
			t.Fatalf("connection still open %v after an unanswered ping, want it dropped after %v", drop+late, drop)
		}
		if open := closed.Sub(last); open < ping+drop {
			t.Errorf("connection dropped %v after its last frame, want no sooner than %v + %v", open, ping, drop)
		}
		if after := closed.Sub(pinged); after > drop+late {
			t.Errorf("connection dropped %v after the unanswered ping, want %v (at most %v late)", after, drop, late)
		}
		t.Logf("pinged after %v idle, dropped %v after the ping (%v after the last frame; the connection ended: %v)",
			pinged.Sub(last), closed.Sub(pinged), closed.Sub(last), err)
	})
	t.Run("answered", func(t *testing.T) {
		t.Parallel()
		h := dialH2(t, addr)
		start := time.Now()
		const n = 6
		for i := range n {
			f, err := h.next(time.Now().Add(ping + late))
			if err != nil {
				t.Fatalf("server ping %d of %d, %v after the connection opened: %v", i+1, n, time.Since(start), err)
			}
			if f.typ != framePing || f.flags&flagAck != 0 {
				t.Fatalf("got %v where the server's ping %d was due", f, i+1)
			}
			if err := h.write(framePing, flagAck, f.payload); err != nil {
				t.Fatalf("answer ping %d: %v", i+1, err)
			}
		}
		if open := time.Since(start); open <= ping+drop {
			t.Fatalf("%d pings answered in %v, want the connection shown open past %v", n, open, ping+drop)
		}
	})
}

// TestClientPingingMoreOftenThanEvery10sIsSentGOAWAY: the orchestrator as
// built for production (no override). A bare HTTP/2 client, since a gRPC
// client never pings more often than every 10 s. The gRPC server counts a
// ping sooner than its minimum after the previous one as a strike and
// sends GOAWAY ENHANCE_YOUR_CALM "too_many_pings" at the third; it resets
// the count only when it sends data, which a connection with no call open
// never makes it do. So:
//
//   - early: pings at 0 and 8 s, then two at once. Four pings, three
//     strikes only if the 8 s gap is one: GOAWAY must follow the 4th ack.
//   - on time: pings at 0 and 11 s, then three at once: the 11 s gap is
//     no strike, so the 4th ack comes with no GOAWAY, and the 5th ping (the
//     third strike) gets it, the positive control that strikes are counted.
//
// No call is open on either: clients may ping with none.
//
// Margins: 2 s below the 10 s minimum (checked from our clock: the server
// cannot have seen the 8 s gap as longer than first ping to second ack)
// and 1 s above (exact from below: the 11 s start after the first ack).
func TestClientPingingMoreOftenThanEvery10sIsSentGOAWAY(t *testing.T) {
	t.Parallel()
	b := backend(t, storetest.NewDB(t), node.BackendConfig{})
	addr := keepaliveOrchestrator(t, b)
	const early, onTime = 8 * time.Second, 11 * time.Second
	t.Run("early", func(t *testing.T) {
		t.Parallel()
		h := dialH2(t, addr)
		sent := time.Now()
		h.pingAcked(1)
		time.Sleep(time.Until(sent.Add(early))) // the gap under test, not a wait for an event
		h.pingAcked(2)
		if gap := time.Since(sent); gap >= 10*time.Second {
			t.Fatalf("the machine stalled: ping 2 was answered %v after ping 1 was sent, so the gap the server saw "+
				"may be 10 s or more; nothing is shown", gap)
		}
		h.pingAcked(3)
		h.pingAcked(4)
		h.goAway("the 4th ping, the 3rd sooner than 10 s after the previous one")
	})
	t.Run("on time", func(t *testing.T) {
		t.Parallel()
		h := dialH2(t, addr)
		h.pingAcked(1)
		acked := time.Now() // the server read ping 1 before this
		time.Sleep(time.Until(acked.Add(onTime)))
		for i := byte(2); i <= 5; i++ {
			h.pingAcked(i)
		}
		h.goAway("the 5th ping (strikes: pings 3, 4, 5; ping 2 came 11 s after ping 1)")
	})
}

// keepaliveOrchestrator opens an orchestrator on b (and the worker it
// needs) and returns the orchestrator's address.
func keepaliveOrchestrator(t *testing.T, b *node.Backend) string {
	t.Helper()
	_, workerTrust, _, err := node.DevTrust(peerDir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := node.OpenWorker(t.Context(), b, node.WorkerConfig{Trust: workerTrust, Server: subagent.ServerConfig{Name: "w"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	return startOrchestrator(t, b, node.OrchestratorConfig{Workers: w.Addr(), Auth: node.CallerAuth{None: true}}).Addr()
}

// HTTP/2 (RFC 9113) frame types, flags and error codes the tests use.
const (
	frameSettings = 0x4
	framePing     = 0x6
	frameGoAway   = 0x7
	flagAck       = 0x1

	errCodeEnhanceYourCalm = 0xb
)

var errTimeout = errors.New("no frame before the deadline")

// h2 is a bare HTTP/2 client connection (no TLS, prior knowledge): it sends
// exactly the frames a test chooses, pings a gRPC client would refuse to.
type h2 struct {
	t         *testing.T
	c         net.Conn
	lastWrite time.Time // when the last frame began to be written
}

type frame struct {
	typ, flags byte
	payload    []byte
}

func (f frame) String() string {
	if f.typ == frameGoAway && len(f.payload) >= 8 {
		return fmt.Sprintf("GOAWAY code %#x %q", binary.BigEndian.Uint32(f.payload[4:8]), f.payload[8:])
	}
	return fmt.Sprintf("frame %d flags %#x", f.typ, f.flags)
}

// dialH2 connects to addr and sends the connection preface and empty
// SETTINGS.
func dialH2(t *testing.T, addr string) *h2 {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	h := &h2{t: t, c: c}
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if err := h.write(frameSettings, 0, nil); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *h2) write(typ, flags byte, payload []byte) error {
	hdr := make([]byte, 9, 9+len(payload))
	hdr[0], hdr[1], hdr[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	hdr[3], hdr[4] = typ, flags // stream 0: bytes 5-8 stay zero
	h.lastWrite = time.Now()
	if err := h.c.SetWriteDeadline(h.lastWrite.Add(5 * time.Second)); err != nil {
		return err
	}
	_, err := h.c.Write(append(hdr, payload...))
	return err
}

// next returns the next PING or GOAWAY frame that arrives before deadline,
// acknowledging the server's SETTINGS and skipping other frames
// (WINDOW_UPDATE). A read past deadline is errTimeout; a closed connection
// is the read's error.
func (h *h2) next(deadline time.Time) (frame, error) {
	if err := h.c.SetReadDeadline(deadline); err != nil {
		return frame{}, err
	}
	for {
		var hdr [9]byte
		if _, err := io.ReadFull(h.c, hdr[:]); err != nil {
			if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
				return frame{}, errTimeout
			}
			return frame{}, err
		}
		f := frame{typ: hdr[3], flags: hdr[4], payload: make([]byte, int(hdr[0])<<16|int(hdr[1])<<8|int(hdr[2]))}
		if _, err := io.ReadFull(h.c, f.payload); err != nil {
			return frame{}, err
		}
		switch {
		case f.typ == frameSettings && f.flags&flagAck == 0:
			if err := h.write(frameSettings, flagAck, nil); err != nil {
				return frame{}, err
			}
		case f.typ == framePing || f.typ == frameGoAway:
			return f, nil
		}
	}
}

// pingAcked sends ping i and waits (at most 5 s) for its ack, which must be
// the next PING or GOAWAY frame.
func (h *h2) pingAcked(i byte) {
	h.t.Helper()
	data := []byte{'f', 'a', 'n', 'o', 'u', 't', 0, i}
	if err := h.write(framePing, 0, data); err != nil {
		h.t.Fatalf("send ping %d: %v", i, err)
	}
	f, err := h.next(time.Now().Add(5 * time.Second))
	switch {
	case err != nil:
		h.t.Fatalf("ack of ping %d: %v", i, err)
	case f.typ != framePing || f.flags&flagAck == 0 || !bytes.Equal(f.payload, data):
		h.t.Fatalf("got %v where the ack of ping %d was due", f, i)
	}
}

// goAway waits (at most 5 s; it is sent with the ack just read) for
// GOAWAY ENHANCE_YOUR_CALM "too_many_pings".
func (h *h2) goAway(after string) {
	h.t.Helper()
	f, err := h.next(time.Now().Add(5 * time.Second))
	switch {
	case err != nil:
		h.t.Fatalf("after %s: %v, want GOAWAY ENHANCE_YOUR_CALM too_many_pings", after, err)
	case f.typ != frameGoAway || len(f.payload) < 8 || binary.BigEndian.Uint32(f.payload[4:8]) != errCodeEnhanceYourCalm ||
		string(f.payload[8:]) != "too_many_pings":
		h.t.Fatalf("after %s: got %v, want GOAWAY ENHANCE_YOUR_CALM too_many_pings", after, f)
	}
}
