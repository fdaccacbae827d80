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
	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// Client sends inference requests to peers. It asks for ReuseID streams and keeps a few
// idle ones per peer, so that a request usually goes out on a stream already open: one
// frame, not a stream set-up, before the peer starts.
type Client struct {
	h          host.Host
	openWait   time.Duration // opening a new stream: dial, DHT walk, negotiation
	firstToken time.Duration // wait for the first token frame
	interToken time.Duration // wait for each frame after it
	receipts   bool
	observer   Observer
	transfers  func(peer.ID, bandwidth.Transfer)

	mu   sync.Mutex
	pool map[peer.ID][]pooled // idle ReuseID streams, the most recent last
	// swept is when every peer's expired streams were last closed (sweepLocked): a peer
	// this node asks nothing more (it left) would otherwise keep its streams, and with them
	// its connection's memory, for the life of the process.
	swept time.Time
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

// WithOpenTimeout sets the longest wait for a new stream to a peer (dial, address lookup,
// protocol negotiation); a zero or negative value keeps DefaultOpenTimeout.
func WithOpenTimeout(d time.Duration) ClientOption {
	return func(c *Client) {
		if d > 0 {
			c.openWait = d
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

// WithClientTransfers sets a function told of each kv frame of at least bandwidth.MinBytes
// that a handover's leaving peer sent, timed from its first byte to its last
// (internal/bandwidth: the caller keeps those that are samples). It runs on the caller's
// goroutine in Generate and should return at once.
func WithClientTransfers(fn func(from peer.ID, t bandwidth.Transfer)) ClientOption {
	return func(c *Client) { c.transfers = fn }
}

// NewClient returns a client that opens streams from h.
func NewClient(h host.Host, opts ...ClientOption) *Client {
	c := &Client{
		h: h, openWait: DefaultOpenTimeout, firstToken: DefaultFirstTokenTimeout, interToken: DefaultInterTokenTimeout,
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
//
// With req.Move set the request asks the peer to hand the generation over if it leaves:
// the rows of KV cache it then sends go to req.Move.Send, in order from position 0 (an
// error from Send ends Generate with it), and Generate ends with *inference.Moved, the
// positions and tokens received, for the caller to resume the generation elsewhere
// (Resume).
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
	st, err := c.open(ctx, p)
	if err != nil {
		return inference.Result{}, err
	}
	res, _, err := c.exchange(ctx, st, p, req, body, emit, false)
	return res, err
}

// open opens a new stream to p, asking for ReuseID first: unavailable when it cannot
// within the open timeout. The bound is on the opening only: the stream, once open, lives
// on ctx.
func (c *Client) open(ctx context.Context, p peer.ID) (network.Stream, error) {
	octx, cancel := context.WithTimeout(ctx, c.openWait)
	defer cancel()
	st, err := c.h.NewStream(octx, p, ReuseID, ID)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("open stream to %s: %w", p, ctx.Err())
		}
		if octx.Err() != nil {
			return nil, inference.Errorf(inference.CodeUnavailable, "open stream to %s: not within %v", p, c.openWait)
		}
		return nil, inference.Errorf(inference.CodeUnavailable, "open stream to %s: %v", p, err)
	}
	return st, nil
}

// take returns the most recent idle pooled stream to p, or nil. Expired ones are closed
// (after the lock: a close writes).
func (c *Client) take(p peer.ID) network.Stream {
	now := time.Now()
	c.mu.Lock()
	live, expired := c.liveLocked(p, now)
	expired = c.sweepLocked(now, expired)
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
	expired = c.sweepLocked(now, expired)
	c.mu.Unlock()
	closeAll(expired)
}

// sweepLocked appends to expired the expired streams of every peer, and drops them from
// the pool, once every poolIdle: so a peer's idle streams go within twice poolIdle even if
// it is never asked again. c.mu is held.
func (c *Client) sweepLocked(now time.Time, expired []network.Stream) []network.Stream {
	if now.Sub(c.swept) < poolIdle {
		return expired
	}
	c.swept = now
	for p := range c.pool {
		live, gone := c.liveLocked(p, now)
		c.setLocked(p, live)
		expired = append(expired, gone...)
	}
	return expired
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
func (c *Client) exchange(ctx context.Context, st Stream, p peer.ID, req *inference.Request, body []byte, emit func(inference.Token) error, pooled bool) (res inference.Result, stale bool, err error) {
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	if body != nil {
		st.SetWriteDeadline(time.Now().Add(WriteTimeout))
		if err := frame.Write(st, body); err != nil {
			st.Reset()
			if pooled && ctx.Err() == nil && !isTimeout(err) {
				return inference.Result{}, true, err
			}
			return inference.Result{}, false, c.lost(ctx, p, "send request", err)
		}
	}
	// The write side stays open: the server reads its end (EOF or reset) as cancellation.
	a := c.newAnswer(st, p, req)
	a.retry = pooled
	res, err = a.read(ctx, emit)
	if errors.Is(err, errStale) {
		return inference.Result{}, true, err
	}
	if a.ended {
		c.release(p, st, stop)
	}
	return res, false, err
}

// errStale is wrapped by what answer.read returns for a pooled stream found ended before
// any answer.
var errStale = errors.New("pooled stream ended before an answer")

// answer reads the answer to one request from a stream: token frames, with a handover kv
// frames, then one terminal frame (done, error, or with a handover moved). It is shared by
// every exchange: a request's (exchange, ReadAnswer) and a resumption's (after its go
// frame).
//
// It believes nothing the peer says about its own work: a peer that sends more tokens than
// req's max_tokens, or more text than req.MaxCompletionBytes, more than MaxMoveBytes of kv
// frames, rows out of order, or a moved frame whose counts are not what it sent, is cut off
// with a protocol error (peer_lost, so the caller fails over), and the usage returned is
// what this side counted (counted).
type answer struct {
	c   *Client
	st  Stream
	p   peer.ID
	req *inference.Request
	r   *frame.Reader
	m   *bandwidth.Meter // beneath r: times each kv frame; nil when none is timed
	// retry makes a stream found ended before any frame read come back as errStale (a
	// pooled stream the peer had closed).
	retry bool

	answered  bool      // a frame was read
	tokens    int       // token frames read
	text      int       // bytes of their text
	positions int       // KV positions read (handover)
	kvBytes   int64     // bytes of the kv frames read
	kvData    []float32 // the last kv frame's values, reused for the next
	ended     bool      // the terminal frame was read: the stream is in order
}

// newAnswer reads req's answer from st, which peer p serves. Only a handover's reader (req.Move
// set) takes kv frames, and frames as large.
func (c *Client) newAnswer(st Stream, p peer.ID, req *inference.Request) *answer {
	if req.Move == nil {
		return &answer{c: c, st: st, p: p, req: req, r: frame.NewReader(st, maxFrame)}
	}
	a := &answer{c: c, st: st, p: p, req: req, r: frame.NewReader(st, MaxKVFrame)}
	if c.transfers != nil { // only kv frames are timed: a token stream pays no meter
		a.m = bandwidth.NewMeter(st)
		a.r = frame.NewReader(a.m, MaxKVFrame)
	}
	return a
}

// read reads the answer to its terminal frame, passing each token to emit: the result with
// the usage counted, or an error (the peer's, typed; a moved frame's *inference.Moved; or
// why the exchange broke, when the stream was reset). ctx's end resets the stream, the
// caller's doing.
func (a *answer) read(ctx context.Context, emit func(inference.Token) error) (inference.Result, error) {
	maxTokens, maxText := a.req.EffectiveMaxTokens(), a.req.MaxCompletionBytes()
	for {
		// Each wait starts once emit (or Move.Send) has returned: a slow consumer is not the
		// peer's delay.
		wait := a.c.firstToken
		if a.answered {
			wait = a.c.interToken
		}
		a.st.SetReadDeadline(time.Now().Add(wait))
		if a.m != nil {
			a.m.Take() // the frame alone
		}
		fb, err := a.r.Next()
		if err != nil {
			a.st.Reset()
			switch {
			case isTimeout(err) && ctx.Err() == nil:
				return inference.Result{}, silence(a.p, a.tokens, wait)
			case a.retry && !a.answered && ctx.Err() == nil && !errors.Is(err, frame.ErrTooLarge) && !errors.Is(err, frame.ErrMalformed):
				return inference.Result{}, fmt.Errorf("%w: %w", errStale, err)
			}
			return inference.Result{}, a.c.lost(ctx, a.p, "read", err)
		}
		a.answered = true
		switch {
		case len(fb) == 0:
			err = fmt.Errorf("%w: empty frame", errProtocol)
		case fb[0] != frameKV && len(fb) > maxFrame:
			err = fmt.Errorf("%w: frame type %#x of %d bytes, max %d", frame.ErrTooLarge, fb[0], len(fb), maxFrame)
		case fb[0] == frameToken:
			var tok inference.Token
			if tok, err = a.token(fb, maxTokens, maxText); err == nil {
				if err := emit(tok); err != nil {
					a.st.Reset()
					return inference.Result{}, err
				}
				continue
			}
		case fb[0] == frameKV:
			var rows inference.KVRows
			if rows, err = a.kv(fb); err == nil {
				if err := a.req.Move.Send(rows); err != nil {
					a.st.Reset()
					return inference.Result{}, err
				}
				continue
			}
		case fb[0] == frameMoved:
			var moved *inference.Moved
			if moved, err = a.moved(fb); err == nil {
				// In order, but not pooled: its peer is leaving.
				a.st.Close()
				return inference.Result{}, moved
			}
		default:
			var res inference.Result
			if res, err = decodeTerminal(fb); !errors.Is(err, errProtocol) {
				a.ended = true
				if err == nil {
					res = counted(res, a.req, a.tokens)
				}
				return res, err
			}
		}
		a.st.Reset()
		return inference.Result{}, a.c.lost(ctx, a.p, "read", err)
	}
}

// token decodes a token frame and counts it: its index must be the next, and the tokens and
// their text within the request's bounds.
func (a *answer) token(fb []byte, maxTokens, maxText int) (inference.Token, error) {
	tok, err := decodeToken(fb)
	switch {
	case err != nil:
		return tok, err
	case tok.Index != a.tokens:
		return tok, fmt.Errorf("%w: token index %d, want %d", errProtocol, tok.Index, a.tokens)
	case a.tokens >= maxTokens:
		return tok, fmt.Errorf("%w: more than the request's %d tokens", errProtocol, maxTokens)
	case a.text+len(tok.Text) > maxText:
		return tok, fmt.Errorf("%w: more than %d bytes of text for %d tokens", errProtocol, maxText, maxTokens)
	}
	a.tokens, a.text = a.tokens+1, a.text+len(tok.Text)
	return tok, nil
}

// kv decodes a kv frame of a handover and counts it: one the request did not ask for
// (req.Move nil), rows that do not start where the last ended, or past MaxMoveBytes in all
// is a protocol error. A frame of at least bandwidth.MinBytes is a transfer (WithClientTransfers).
func (a *answer) kv(fb []byte) (inference.KVRows, error) {
	if a.req.Move == nil {
		return inference.KVRows{}, fmt.Errorf("%w: a kv frame, no handover asked", errProtocol)
	}
	rows, err := decodeKV(fb, a.kvData)
	a.kvData = rows.Data
	switch {
	case err != nil:
		return rows, err
	case rows.Pos != a.positions:
		return rows, fmt.Errorf("%w: KV rows at %d, want %d", errProtocol, rows.Pos, a.positions)
	case a.kvBytes+int64(len(fb)) > MaxMoveBytes:
		return rows, fmt.Errorf("%w: more than %d bytes of KV rows", errProtocol, MaxMoveBytes)
	}
	if a.m != nil && len(fb) >= bandwidth.MinBytes {
		a.c.transfers(a.p, a.m.Take())
	}
	a.positions, a.kvBytes = a.positions+rows.N, a.kvBytes+int64(len(fb))
	return rows, nil
}

// moved decodes a moved frame: the handover's end, whose counts must be what this side
// received (a peer that says it sent more than it did would have its client resume from
// rows and tokens it never got).
func (a *answer) moved(fb []byte) (*inference.Moved, error) {
	if a.req.Move == nil {
		return nil, fmt.Errorf("%w: a moved frame, no handover asked", errProtocol)
	}
	m, err := decodeMoved(fb)
	if err == nil && (m.Tokens != a.tokens || m.Positions != a.positions) {
		err = fmt.Errorf("%w: moved after %d tokens and %d positions, %d and %d received",
			errProtocol, m.Tokens, m.Positions, a.tokens, a.positions)
	}
	return m, err
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
// corroborated by its receipt, never taken as they are. Its Replayed is held to the tokens
// it was asked to replay.
func counted(res inference.Result, req *inference.Request, received int) inference.Result {
	res.Usage.CompletionTokens = received
	res.Usage = req.BoundUsage(res.Usage)
	res.Replayed = min(max(res.Replayed, 0), len(req.Replay))
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
