package infer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/transport/frame"
)

// Client sends inference requests to peers.
type Client struct {
	h        host.Host
	idle     time.Duration
	receipts bool
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithIdleTimeout sets the longest gap allowed between two frames (DefaultIdleTimeout).
func WithIdleTimeout(d time.Duration) ClientOption { return func(c *Client) { c.idle = d } }

// WithReceipts makes every request ask the serving peer for a signed receipt, returned in
// inference.Result.Receipt (empty when the peer has no signer). A coordinator asks for one on
// all its requests, so that a verification run looks like any other task.
func WithReceipts() ClientOption { return func(c *Client) { c.receipts = true } }

// NewClient returns a client that opens streams from h.
func NewClient(h host.Host, opts ...ClientOption) *Client {
	c := &Client{h: h, idle: DefaultIdleTimeout}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Generate runs req on peer p with the inference.Backend contract: emit once per token with
// contiguous indices, exactly one return, ctx cancellation resets the stream (stopping the
// peer's work). Failures are *inference.Error: unavailable when no stream could be opened,
// timeout when the peer stays silent past the idle timeout, peer_lost when the stream ends or
// breaks without a terminal frame, and the peer's own code from its error frame.
func (c *Client) Generate(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	body, err := c.requestFrame(req)
	if err != nil {
		return inference.Result{}, err
	}
	st, err := c.h.NewStream(ctx, p, ID)
	if err != nil {
		if ctx.Err() != nil {
			return inference.Result{}, fmt.Errorf("open stream to %s: %w", p, ctx.Err())
		}
		return inference.Result{}, inference.Errorf(inference.CodeUnavailable, "open stream to %s: %v", p, err)
	}
	return c.exchange(ctx, st, p, body, emit)
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
	return c.exchange(ctx, st, p, body, emit)
}

// requestFrame encodes req's request frame within MaxRequestFrame.
func (c *Client) requestFrame(req *inference.Request) ([]byte, error) {
	return EncodeRequest(req, c.receipts)
}

// exchange sends the request frame body on st (none when nil) and reads the answer.
func (c *Client) exchange(ctx context.Context, st Stream, p peer.ID, body []byte, emit func(inference.Token) error) (inference.Result, error) {
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()

	if body != nil {
		st.SetWriteDeadline(time.Now().Add(WriteTimeout))
		if err := frame.Write(st, body); err != nil {
			st.Reset()
			return inference.Result{}, c.lost(ctx, p, "send request", err)
		}
	}
	// The write side stays open: the server reads its end (EOF or reset) as cancellation.

	r := frame.NewReader(st, maxFrame)
	next := 0
	for {
		st.SetReadDeadline(time.Now().Add(c.idle))
		fb, err := r.Next()
		if err != nil {
			st.Reset()
			if isTimeout(err) && ctx.Err() == nil {
				return inference.Result{}, inference.Errorf(inference.CodeTimeout, "peer %s silent for %v", p, c.idle)
			}
			return inference.Result{}, c.lost(ctx, p, "read", err)
		}
		if len(fb) == 0 {
			st.Reset()
			return inference.Result{}, c.lost(ctx, p, "read", fmt.Errorf("%w: empty frame", errProtocol))
		}
		if fb[0] != frameToken {
			res, err := decodeTerminal(fb)
			if errors.Is(err, errProtocol) {
				st.Reset()
				return inference.Result{}, c.lost(ctx, p, "read", err)
			}
			st.Close()
			return res, err
		}
		tok, err := decodeToken(fb)
		if err == nil && tok.Index != next {
			err = fmt.Errorf("%w: token index %d, want %d", errProtocol, tok.Index, next)
		}
		if err != nil {
			st.Reset()
			return inference.Result{}, c.lost(ctx, p, "read", err)
		}
		next++
		if err := emit(tok); err != nil {
			st.Reset()
			return inference.Result{}, err
		}
	}
}

// lost classifies a broken exchange: the caller's own cancellation wins, else peer_lost.
func (c *Client) lost(ctx context.Context, p peer.ID, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	return inference.Errorf(inference.CodePeerLost, "%s from %s: %v", what, p, err)
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout() || errors.Is(err, io.ErrNoProgress)
}
