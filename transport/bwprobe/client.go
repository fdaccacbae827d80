package bwprobe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/internal/window"
)

// ErrRateLimited is returned for a probe the client's own limits refuse (ProbeInterval,
// ProbeBurst): no stream was opened. The estimate known so far is what there is.
var ErrRateLimited = errors.New("bandwidth probe rate-limited")

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithClientClock sets the clock the client dates its samples, rate-limits its probes and
// judges freshness with (time.Now). Transfer times are on the monotonic clock regardless.
func WithClientClock(now func() time.Time) ClientOption { return func(c *Client) { c.now = now } }

// WithProbeBytes sets the bytes a probe moves each way (DefaultProbeBytes). A server
// refuses a probe of more than MaxProbeBytes both ways together.
func WithProbeBytes(n int) ClientOption { return func(c *Client) { c.size = uint64(max(n, 0)) } }

// Result is what one probe measured.
type Result struct {
	// RTT is the round trip of the request and its answer.
	RTT time.Duration
	// Up is the upload, as this node timed it (less RTT); Down the download, metered.
	// Either may be no sample (bandwidth.Transfer.Rate): an upload that took no longer
	// than the round trip, a download the reader paced.
	Up, Down bandwidth.Transfer
}

// Client probes peers and adds what it measures to an estimator.
type Client struct {
	h    host.Host
	est  *bandwidth.Estimator
	now  func() time.Time
	size uint64

	mu    sync.Mutex
	last  window.Keyed[peer.ID] // when each peer was last probed
	burst span                  // the probes of the current ProbeWindow
}

// NewClient returns a client that opens probe streams from h and adds their transfers to
// est.
func NewClient(h host.Host, est *bandwidth.Estimator, opts ...ClientOption) *Client {
	c := &Client{h: h, est: est, now: time.Now, size: DefaultProbeBytes,
		last: window.Keyed[peer.ID]{Length: ProbeInterval, Max: 1, Cap: maxPeersRemembered}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Measure returns what is known of the bandwidth with p, probing it first when either
// direction has no sample within FreshFor. When the probe is refused (ErrRateLimited, or
// the peer's refusal) or fails, the error comes with the estimate known before, which may
// be old or empty: its At says.
func (c *Client) Measure(ctx context.Context, p peer.ID) (bandwidth.Estimate, error) {
	est, _ := c.est.Get(p.String())
	now := c.now()
	if est.Down.Measured(now, FreshFor) && est.Up.Measured(now, FreshFor) {
		return est, nil
	}
	if _, err := c.Probe(ctx, p); err != nil {
		return est, err
	}
	est, _ = c.est.Get(p.String())
	return est, nil
}

// Probe probes p now, within the client's limits, and adds the transfers that are samples
// to the estimator. Errors: ErrRateLimited (wrapped) past the limits, else
// *inference.Error: unavailable when no stream could be opened, the peer's code when it
// refused, timeout past ProbeTimeout, peer_lost when the stream broke or the peer broke
// the protocol. A cancelled ctx gives its error.
func (c *Client) Probe(ctx context.Context, p peer.ID) (Result, error) {
	if !c.allow(p) {
		return Result{}, fmt.Errorf("probe %s: %w", p, ErrRateLimited)
	}
	st, err := c.h.NewStream(ctx, p, ID)
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, fmt.Errorf("open probe stream to %s: %w", p, ctx.Err())
		}
		return Result{}, inference.Errorf(inference.CodeUnavailable, "open probe stream to %s: %v", p, err)
	}
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	if err := st.Scope().SetService(ServiceName); err != nil {
		st.Reset()
		return Result{}, inference.Errorf(inference.CodeOverloaded, "probe stream: %v", err)
	}
	res, err := c.exchange(st, p)
	if err != nil {
		st.Reset()
		if ctx.Err() != nil {
			return Result{}, fmt.Errorf("probe %s: %w", p, ctx.Err())
		}
		return Result{}, err
	}
	st.Close()
	return res, nil
}

// allow reports whether a probe of p may start now (ProbeInterval, ProbeBurst); if so it
// is counted.
func (c *Client) allow(p peer.ID) bool {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.last.Allow(p, now) || !c.burst.allow(now, ProbeWindow, ProbeBurst) {
		return false
	}
	c.last.Add(p, now)
	return true
}

// exchange runs the client's side of one probe of p on st (see the package doc).
func (c *Client) exchange(st stream, p peer.ID) (Result, error) {
	if err := st.SetDeadline(time.Now().Add(ProbeTimeout)); err != nil {
		return Result{}, lost(p, "set deadline", err)
	}
	sent := time.Now()
	if err := frame.Write(st, encodeRequest(c.size, c.size)); err != nil {
		return Result{}, lost(p, "send request", err)
	}
	body, err := frame.ReadOne(st, MaxAnswerFrame)
	if err != nil {
		return Result{}, lost(p, "read answer", err)
	}
	rtt := time.Since(sent)
	if err := decodeAnswer(body); err != nil {
		if errors.Is(err, errProtocol) {
			return Result{}, lost(p, "read answer", err)
		}
		return Result{}, err
	}

	buf := make([]byte, chunk)
	began := time.Now()
	if err := send(st, buf, c.size); err != nil {
		return Result{}, lost(p, "send payload", err)
	}
	body, err = frame.ReadOne(st, MaxAnswerFrame)
	if err == nil && (len(body) != 1 || body[0] != frameReceived) {
		err = fmt.Errorf("%w: not a received frame", errProtocol)
	}
	if err != nil {
		return Result{}, lost(p, "read received", err)
	}
	// The received frame came one crossing after the last byte arrived, and the first
	// byte left one crossing before it arrived: a round trip more than the bytes took.
	up := max(time.Since(began)-rtt, 0)
	res := Result{RTT: rtt, Up: bandwidth.Transfer{Dir: bandwidth.Up, Bytes: int64(c.size), Timed: int64(c.size), Dur: up, Waited: up}}

	m := bandwidth.NewMeter(st)
	if err := discard(m, buf, c.size); err != nil {
		return Result{}, lost(p, "read payload", err)
	}
	res.Down = m.Take()
	now := c.now()
	c.est.Observe(p.String(), res.Up, now)
	c.est.Observe(p.String(), res.Down, now)
	return res, nil
}

// lost is the error of an exchange with p whose stream broke while doing what: timeout
// past its deadline, else peer_lost.
func lost(p peer.ID, what string, err error) error {
	var t interface{ Timeout() bool }
	if errors.As(err, &t) && t.Timeout() {
		return inference.Errorf(inference.CodeTimeout, "probe %s: %s: no progress within %v", p, what, ProbeTimeout)
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return inference.Errorf(inference.CodePeerLost, "probe %s: %s: %v", p, what, err)
}
