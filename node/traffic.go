package node

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/transport/infer"
)

// Mesh traffic, for the bandwidth cap (max_bytes_per_hour).
//
// What counts is every byte read from or written to a stream on which this node serves a
// task for a peer: the request frame in, the token, result and error frames out, on libp2p
// streams (infer.ID and infer.ReuseID), on WebRTC data channels peers open to it, and on
// direct tasks (the coordinator's infer.DirectID stream, with its relayed WebRTC set-up, and
// the client's data channel), and on the bandwidth probes it answers (bwprobe.ID: up to
// 1 MiB each, node/bandwidth.go). It is counted as the bytes pass, with the node's clock, in a
// participation.TrafficMeter. Refused requests count too: their bytes were moved.
//
// What does not count: the owner's own requests (to peers or the cloud), the capability
// announcements, DHT, identify and ping upkeep, and the console. A pause stops none of those,
// so counting them could keep a node with a small cap paused for ever; and the owner's own
// requests are not contributing. The count is of stream payload, as go-libp2p's
// BandwidthCounter counts it too; the transports' framing and encryption (yamux, TLS or
// Noise, QUIC, SCTP and DTLS) add to it on the wire. go-libp2p's counter is not used: it
// cannot tell the streams a node serves from those it opens for its owner on the same
// protocol, never sees WebRTC data channels, and updates its totals from a background
// sweeper once a second, so a cap could be passed before the count showed it.

// trafficCounter is the node's TrafficMeter, safe for concurrent use: every served stream
// adds to it as its bytes pass.
type trafficCounter struct {
	now func() time.Time

	mu sync.Mutex
	m  participation.TrafficMeter
}

// add counts n bytes moved now.
func (c *trafficCounter) add(n int) {
	if n <= 0 {
		return
	}
	now := c.now()
	c.mu.Lock()
	c.m.Add(int64(n), now)
	c.mu.Unlock()
}

// lastHour is the bytes counted in the hour up to now (participation.TrafficMeter.Total).
func (c *trafficCounter) lastHour(now time.Time) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Total(now)
}

// servingHost is the host as the inference server sees it: the handlers it registers get
// streams whose bytes are counted.
func (c *trafficCounter) servingHost(h host.Host) host.Host { return servingHost{h, c} }

type servingHost struct {
	host.Host
	c *trafficCounter
}

func (h servingHost) SetStreamHandler(pid protocol.ID, handler network.StreamHandler) {
	h.Host.SetStreamHandler(pid, h.c.handler(handler))
}

// handler wraps a stream handler so that its stream's bytes are counted.
func (c *trafficCounter) handler(handler network.StreamHandler) network.StreamHandler {
	return func(s network.Stream) { handler(countedStream{s, c}) }
}

// countedStream is a libp2p stream whose bytes are counted.
type countedStream struct {
	network.Stream
	c *trafficCounter
}

func (s countedStream) Read(p []byte) (int, error) {
	n, err := s.Stream.Read(p)
	s.c.add(n)
	return n, err
}

func (s countedStream) Write(p []byte) (int, error) {
	n, err := s.Stream.Write(p)
	s.c.add(n)
	return n, err
}

// stream wraps a stream of another transport (a WebRTC data channel) so that its bytes are
// counted.
func (c *trafficCounter) stream(s infer.Stream) infer.Stream { return countedInferStream{s, c} }

type countedInferStream struct {
	infer.Stream
	c *trafficCounter
}

func (s countedInferStream) Read(p []byte) (int, error) {
	n, err := s.Stream.Read(p)
	s.c.add(n)
	return n, err
}

func (s countedInferStream) Write(p []byte) (int, error) {
	n, err := s.Stream.Write(p)
	s.c.add(n)
	return n, err
}
