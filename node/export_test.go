package node

import (
	"time"

	"google.golang.org/grpc/keepalive"
)

// SetServerKeepalive makes the servers opened on b from now on ping a
// connection idle for ping and drop it when the ping is not answered within
// drop: the documented minute and 20 s, shortened for a test.
func SetServerKeepalive(b *Backend, ping, drop time.Duration) {
	b.streams.keepalive = keepalive.ServerParameters{Time: ping, Timeout: drop}
}

// ServerKeepalive reports what b's servers are built with: when they ping
// an idle connection, when they drop one whose ping went unanswered, and
// how often a client may ping them.
func ServerKeepalive(b *Backend) (ping, drop, clientMinPing time.Duration) {
	return b.streams.keepalive.Time, b.streams.keepalive.Timeout, keepaliveMinTime
}

// SetHTTPTimeouts makes the HTTP listeners opened on b from now on drop a
// connection whose headers take longer than readHeader, or idle for idle:
// the documented 10 s and 2 min, shortened for a test.
func SetHTTPTimeouts(b *Backend, readHeader, idle time.Duration) {
	b.httpLimits = httpLimits{readHeader: readHeader, idle: idle}
}

// HTTPBodyLimit is the most bytes of a request body the HTTP listener of an
// orchestrator with receive limit recvLimit reads.
func HTTPBodyLimit(recvLimit int) int64 { return httpBodyLimit(recvLimit) }
