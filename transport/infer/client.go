package infer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// Client sends inference requests to peers. It asks for ReuseID streams and keeps a few
// idle ones per peer, so that a request usually goes out on a stream already open: one
// frame, not a stream set-up, before the peer starts.
type Client struct {
	h          host.Host
	firstToken time.Duration // wait for the first token frame
	interToken time.Duration // wait for each frame after it
	receipts   bool
	observer   Observer

	mu   sync.Mutex
	pool map[peer.ID][]pooled // idle ReuseID streams, the most recent last
}

type pooled struct {
	st    network.Stream
	since time.Time
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithTimeouts sets the longest wait for a request's first token frame and for each frame
// after it; a zero or negative value keeps that default (DefaultFirstTokenTimeout,
// DefaultInterTokenTimeout).
func WithTimeouts(firstToken, interToken time.Duration) ClientOption {
	return func(c *Client) {
		if firstToken > 0 {
			c.firstToken = firstToken
		}
		if interToken > 0 {
			c.interToken = interToken
		}
	}
}

// WithReceipts makes every request ask the serving peer for a signed receipt, returned in
// inference.Result.Receipt (empty when the peer has no signer). A coordinator asks for one on
// all its requests, so that a verification run looks like any other task.
func WithReceipts() ClientOption { return func(c *Client) { c.receipts = true } }

// WithClientObserver records each serving peer that sends a malformed frame or breaks the
// protocol (tokens past max_tokens or the byte cap, out of order, a bad terminal frame) in
// o, as reputation.MalformedFrame or ProtocolViolation.
func WithClientObserver(o Observer) ClientOption { return func(c *Client) { c.observer = o } }

// NewClient returns a client that opens streams from h.
func NewClient(h host.Host, opts ...ClientOption) *Client {
	c := &Client{
		h: h, firstToken: DefaultFirstTokenTimeout, interToken: DefaultInterTokenTimeout,
		pool: make(map[peer.ID][]pooled),
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Generate runs req on peer p with the inference.Backend contract: emit once per token with
// contiguous indices, exactly one return, ctx cancellation resets the stream (stopping the
// peer's work). Failures are *inference.Error: unavailable when no stream could be opened,
// timeout when the peer sends no token within the first-token timeout or then stays silent
// past the inter-token timeout, peer_lost when the stream ends or breaks without a terminal
// frame, and the peer's own code from its error frame.
func (c *Client) Generate(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	body, err := c.requestFrame(req)
	if err != nil {
		return inference.Result{}, err
	}
	if st := c.take(p); st != nil {
		res, stale, err := c.exchange(ctx, st, p, req, body, emit, true)
		if !stale {
			return res, err
		}
		// The pooled stream had ended before any answer (the peer closed it idle, or
		// restarted): the request goes again on a new stream.
	}
	st, err := c.h.NewStream(ctx, p, ReuseID, ID)
	if err != nil {
		if ctx.Err() != nil {
			return inference.Result{}, fmt.Errorf("open stream to %s: %w", p, ctx.Err())
		}
		return inference.Result{}, inference.Errorf(inference.CodeUnavailable, "open stream to %s: %v", p, err)
	}
	res, _, err := c.exchange(ctx, st, p, req, body, emit, false)
	return res, err
}

// take returns the most recent idle pooled stream to p, or nil. Expired ones are closed
// (after the lock: a close writes).
func (c *Client) take(p peer.ID) network.Stream {
	c.mu.Lock()
	live, expired := c.liveLocked(p, time.Now())
	var st network.Stream
	if n := len(live); n > 0 {
		st, live = live[n-1].st, live[:n-1]
	}
	c.setLocked(p, live)
	c.mu.Unlock()
	closeAll(expired)
	return st
}

// put keeps st, a ReuseID stream to p whose exchange completed, for the next request; past
// maxPooledPerPeer it is closed, and so are expired ones.
func (c *Client) put(p peer.ID, st network.Stream) {
	now := time.Now()
	c.mu.Lock()
	live, expired := c.liveLocked(p, now)
	if len(live) < maxPooledPerPeer {
		live = append(live, pooled{st: st, since: now})
	} else {
		expired = append(expired, st)
	}
	c.setLocked(p, live)
	c.mu.Unlock()
	closeAll(expired)
}

// liveLocked splits p's pooled streams into those idle for less than poolIdle, oldest
// first, and the expired ones. c.mu is held.
func (c *Client) liveLocked(p peer.ID, now time.Time) (live []pooled, expired []network.Stream) {
	live = c.pool[p][:0]
	for _, e := range c.pool[p] {
		if now.Sub(e.since) < poolIdle {
			live = append(live, e)
		} else {
			expired = append(expired, e.st)
		}
	}
	return live, expired
}

// setLocked stores p's pooled streams. c.mu is held.
func (c *Client) setLocked(p peer.ID, live []pooled) {
	if len(live) == 0 {
		delete(c.pool, p)
		return
	}
	c.pool[p] = live
}

func closeAll(streams []network.Stream) {
	for _, st := range streams {
		st.Close()
	}
}

// GenerateOn runs req on peer p over st, a stream to p opened over another transport than
// libp2p (a WebRTC data channel), with Generate's contract. st is closed or reset when it
// returns.
func (c *Client) GenerateOn(ctx context.Context, st Stream, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	body, err := c.requestFrame(req)
	if err != nil {
		st.Reset()
		return inference.Result{}, err
	}
	res, _, err := c.exchange(ctx, st, p, req, body, emit, false)
	return res, err
}

// requestFrame encodes req's request frame within MaxRequestFrame.
func (c *Client) requestFrame(req *inference.Request) ([]byte, error) {
	return EncodeRequest(req, c.receipts)
}

// exchange sends req's request frame body on st (none when nil) and reads the answer. A
// completed ReuseID stream goes back to the pool, any other is closed or reset. stale
// reports that st was a pooled stream (pooled) found ended before any answer: nothing of
// the request ran, and the caller may send it again.
//
// It believes nothing the peer says about its own work: a peer that sends more tokens than
// req's max_tokens, or more text than req.MaxCompletionBytes, is cut off with a protocol
// error (peer_lost, so the caller fails over), and the usage returned is what this side
// counted (counted).
func (c *Client) exchange(ctx context.Context, st Stream, p peer.ID, req *inference.Request, body []byte, emit func(inference.Token) error, pooled bool) (res inference.Result, stale bool, err error) {
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	// staleOr reports a broken stream: stale if it was pooled and nothing came back yet.
	answered := false
	staleOr := func(what string, err error) (inference.Result, bool, error) {
		st.Reset()
		if pooled && !answered && ctx.Err() == nil && !isTimeout(err) {
			return inference.Result{}, true, err
		}
		return inference.Result{}, false, c.lost(ctx, p, what, err)
	}

	if body != nil {
		st.SetWriteDeadline(time.Now().Add(WriteTimeout))
		if err := frame.Write(st, body); err != nil {
			return staleOr("send request", err)
		}
	}
	// The write side stays open: the server reads its end (EOF or reset) as cancellation.

	r := frame.NewReader(st, maxFrame)
	next, text := 0, 0
	maxTokens, maxText := req.EffectiveMaxTokens(), req.MaxCompletionBytes()
	for {
		// Each wait starts once emit has returned: a slow consumer is not the peer's delay.
		wait := c.firstToken
		if next > 0 {
			wait = c.interToken
		}
		st.SetReadDeadline(time.Now().Add(wait))
		fb, err := r.Next()
		if err != nil {
			if isTimeout(err) && ctx.Err() == nil {
				st.Reset()
				return inference.Result{}, false, silence(p, next, wait)
			}
			return staleOr("read", err)
		}
		answered = true
		if len(fb) == 0 {
			st.Reset()
			return inference.Result{}, false, c.lost(ctx, p, "read", fmt.Errorf("%w: empty frame", errProtocol))
		}
		if fb[0] != frameToken {
			res, err := decodeTerminal(fb)
			if errors.Is(err, errProtocol) {
				st.Reset()
				return inference.Result{}, false, c.lost(ctx, p, "read", err)
			}
			c.release(p, st, stop)
			if err == nil {
				res = counted(res, req, next)
			}
			return res, false, err
		}
		tok, err := decodeToken(fb)
		switch {
		case err != nil:
		case tok.Index != next:
			err = fmt.Errorf("%w: token index %d, want %d", errProtocol, tok.Index, next)
		case next >= maxTokens:
			err = fmt.Errorf("%w: more than the request's %d tokens", errProtocol, maxTokens)
		case text+len(tok.Text) > maxText:
			err = fmt.Errorf("%w: more than %d bytes of text for %d tokens", errProtocol, maxText, maxTokens)
		}
		if err != nil {
			st.Reset()
			return inference.Result{}, false, c.lost(ctx, p, "read", err)
		}
		next, text = next+1, text+len(tok.Text)
		if err := emit(tok); err != nil {
			st.Reset()
			return inference.Result{}, false, err
		}
	}
}

// silence is the timeout of peer p, silent for wait after sending tokens tokens.
func silence(p peer.ID, tokens int, wait time.Duration) error {
	if tokens == 0 {
		return inference.Errorf(inference.CodeTimeout, "peer %s sent no token within %v", p, wait)
	}
	return inference.Errorf(inference.CodeTimeout, "peer %s silent for %v after %d tokens", p, wait, tokens)
}

// counted is res with the usage this side can vouch for: the completion tokens it received,
// and the peer's prompt count up to req.PromptTokensBound. A peer's own figures are only
// corroborated by its receipt, never taken as they are.
func counted(res inference.Result, req *inference.Request, received int) inference.Result {
	res.Usage.CompletionTokens = received
	res.Usage = req.BoundUsage(res.Usage)
	return res
}

// release ends an exchange that read its terminal frame: a ReuseID stream goes back to the
// pool (unless the caller's cancellation already reset it), any other is closed.
func (c *Client) release(p peer.ID, st Stream, stopReset func() bool) {
	if ns, ok := st.(network.Stream); ok && ns.Protocol() == ReuseID {
		if stopReset() {
			c.put(p, ns)
		}
		return
	}
	st.Close()
}

// lost classifies a broken exchange: the caller's own cancellation wins, else peer_lost.
func (c *Client) lost(ctx context.Context, p peer.ID, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	observe(c.observer, p, err)
	return inference.Errorf(inference.CodePeerLost, "%s from %s: %v", what, p, err)
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout() || errors.Is(err, io.ErrNoProgress)
}
