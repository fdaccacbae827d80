package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	randv2 "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/transport/gateway"
)

// Defaults and bounds. See the package documentation for how they combine.
const (
	// DefaultPingInterval is how often a connection is pinged: three missed pongs, 30 s,
	// declare it dead, well inside the coordinator's 60 s idle timeout.
	DefaultPingInterval = 10 * time.Second
	// missedPongs is how many pings in a row may go unanswered; at the next ping the
	// connection is declared dead.
	missedPongs = 3
	// backoffBase and backoffCap bound the wait before a redial: base·2^n, capped, of which
	// the upper half is drawn at random, so that clients cut together do not return together.
	backoffBase = 200 * time.Millisecond
	backoffCap  = 10 * time.Second
	// maxRedials is how many redials in a row may fail (about 25 s of backoff) before the
	// requests waiting for a connection fail with unavailable.
	maxRedials = 8
	// dialTimeout bounds one dial, handshake included.
	dialTimeout = 30 * time.Second
	// writeTimeout bounds writing one message; a connection that cannot take one is dead.
	writeTimeout = 10 * time.Second
	// maxSSELine bounds one server-sent event line over REST; an event is a few hundred
	// bytes.
	maxSSELine = gateway.MaxMessageBytes
	// maxErrorBody bounds how much of an HTTP error answer is read (bytes).
	maxErrorBody = 64 << 10
	// DefaultLostTimeout is how long a request whose connection died may wait for a new
	// connection to resubmit it on before it fails with coordinator_lost: F13 in
	// docs/reliability.md asks for coordinator_lost within 5 s of the crash, and 1 s is left
	// for noticing the loss (a crashed coordinator's connections are reset at once; a frozen
	// one is noticed by the missed pongs instead). The first four redials' backoff (at most
	// 0.2 + 0.4 + 0.8 + 1.6 s) fit in it: a coordinator restarted within about 3 s gets its
	// requests back.
	DefaultLostTimeout = 4 * time.Second
	// envelopeBytes is room for a request message's envelope around its body: type, an id
	// of at most 20 digits and a 32-digit idempotency key, with slack.
	envelopeBytes = 256
)

// Transports a Result may report.
const (
	TransportWebSocket = "websocket"
	TransportREST      = "rest"
)

var (
	// ErrClosed is returned by Chat once Close was called.
	ErrClosed = errors.New("gateway client closed")
	// ErrReplayMismatch: after a resubmission, the coordinator's replay of the tokens
	// already delivered differs from them (the request is not deterministic, or its result
	// expired from the coordinator's cache and the rerun differs). The caller has a prefix
	// that cannot be continued; nothing is spliced.
	ErrReplayMismatch = errors.New("resubmitted request replays different tokens")
	// ErrProtocol: the coordinator broke the wire protocol (tokens out of order).
	ErrProtocol = errors.New("gateway protocol violation")

	// errFallback tells the calls waiting for a connection to use REST instead.
	errFallback = errors.New("gateway websocket endpoint absent")
)

// Error is a failure the coordinator reported: an error message over WebSocket, or an
// HTTP error (a refused key, a refused request over REST, an error event of a stream).
type Error struct {
	Status  int    // HTTP status; 0 for an error message over WebSocket or a stream's error event
	Code    string // the typed inference code (inference.Codes), or invalid_api_key
	Message string
}

func (e *Error) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("coordinator answered %d (%s): %s", e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("coordinator: %s: %s", e.Code, e.Message)
}

// Token is one streamed token: its index in the completion and its text.
type Token struct {
	Index int
	Text  string
}

// Result is a completed chat completion.
type Result struct {
	Text         string // every token's text, in order
	Tokens       int
	FinishReason string // "stop" or "length"
	Usage        inference.Usage
	Route        string // where the outcome was served: "local", "peer:<id>" or "cloud"
	Tier         string // "local", "mesh" or "cloud"
	Attempts     int    // targets the coordinator tried
	Transport    string // TransportWebSocket or TransportREST
	Resubmits    int    // times the request was sent again: after a lost connection, or one retry
}

// Option configures a Client.
type Option func(*config)

type config struct {
	device    string
	hc        *http.Client
	ping      time.Duration
	lost      time.Duration
	forceREST bool
	rng       *randv2.Rand
	plainHTTP bool
	// pingClock starts one connection's ping clock: a channel that ticks every d, and its
	// stop. Default tickEvery; tests tick by hand (export_test.go), so that whether a
	// connection is declared dead does not hang on how fast the machine answers a ping.
	pingClock func(d time.Duration) (<-chan time.Time, func())
}

// tickEvery is the default ping clock: a time.Ticker.
func tickEvery(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// WithDevice names this device (gateway.DeviceHeader): a stable id such as a UUID, or the
// one meshinfer chat derives (node.LoadOrCreateDevice). The session, and so the reach of
// idempotency keys, is the key plus the device; the coordinator's meter records it with
// each request. "" sends none.
func WithDevice(id string) Option { return func(c *config) { c.device = id } }

// WithHTTPClient sets the HTTP client for the WebSocket handshake and REST (default: one
// with http.DefaultTransport). Its Timeout must be 0: a stream lasts as long as it lasts.
func WithHTTPClient(hc *http.Client) Option { return func(c *config) { c.hc = hc } }

// WithPingInterval replaces DefaultPingInterval.
func WithPingInterval(d time.Duration) Option { return func(c *config) { c.ping = d } }

// WithLostTimeout replaces DefaultLostTimeout.
func WithLostTimeout(d time.Duration) Option { return func(c *config) { c.lost = d } }

// WithForceREST skips WebSocket: every request goes over POST /v1/chat/completions.
func WithForceREST() Option { return func(c *config) { c.forceREST = true } }

// WithPlainHTTP lets the client send its API key over plain http:// to another machine,
// on a network the caller trusts. Without it such a URL fails every Chat with
// gateway.ErrPlainHTTPKey; loopback URLs are always allowed.
func WithPlainHTTP() Option { return func(c *config) { c.plainHTTP = true } }

// WithRand sets the source of the backoff's jitter (tests seed it); it is used by one
// goroutine only. Default: math/rand/v2's.
func WithRand(r *randv2.Rand) Option { return func(c *config) { c.rng = r } }

// Client is a thin client of a coordinator's gateway. It is safe for concurrent use: Chat
// calls share one WebSocket connection. Close ends it.
type Client struct {
	base string // without a trailing slash
	key  string
	cfg  config
	// refused is why no Chat may send the key to base (gateway.CheckKeyTransport); nil: none.
	refused error

	// ctx ends at Close; every goroutine of the client ends with it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the connection loop
	wake   chan struct{}  // cap 1: calls are waiting for a connection

	mu        sync.Mutex
	closed    bool
	started   bool             // the connection loop runs
	rest      bool             // the WebSocket endpoint is absent: REST from now on
	conn      *wsConn          // the live connection; nil between connections
	calls     map[string]*call // requests in flight over WebSocket, by id
	lastID    uint64
	connected bool // a connection was ever made: later failures are worth retrying
}

// New returns a client of the coordinator at baseURL ("https://host:port") with API key
// key. It connects on the first Chat.
func New(baseURL, key string, opts ...Option) *Client {
	cfg := config{ping: DefaultPingInterval, lost: DefaultLostTimeout, pingClock: tickEvery}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.hc == nil {
		cfg.hc = &http.Client{}
	}
	if cfg.ping <= 0 {
		cfg.ping = DefaultPingInterval
	}
	if cfg.lost <= 0 {
		cfg.lost = DefaultLostTimeout
	}
	var refused error
	if !cfg.plainHTTP {
		refused = gateway.CheckKeyTransport(baseURL)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{base: strings.TrimRight(baseURL, "/"), key: key, cfg: cfg, refused: refused, ctx: ctx, cancel: cancel,
		wake: make(chan struct{}, 1), calls: make(map[string]*call)}
}

// Close ends the connection and every goroutine of the client; Chat calls in flight return
// ErrClosed. Idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	return nil
}

// Chat sends one chat completion and streams its tokens to onToken (which may be nil), in
// order and each once, on the caller's goroutine. body is the request as POST
// /v1/chat/completions takes it: a JSON object as json.RawMessage or []byte, or any value
// that marshals to one (a map, a struct, an inference.Request); "stream" is set by Chat.
// The result comes once, however many times the connection was lost on the way.
func (c *Client) Chat(ctx context.Context, body any, onToken func(Token)) (Result, error) {
	if c.refused != nil {
		return Result{}, c.refused
	}
	if onToken == nil {
		onToken = func(Token) {}
	}
	raw, err := encodeBody(body)
	if err != nil {
		return Result{}, err
	}
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return Result{}, ErrClosed
	case c.rest || c.cfg.forceREST:
		c.mu.Unlock()
		return c.chatREST(ctx, raw, onToken)
	}
	c.lastID++
	cl := &call{id: strconv.FormatUint(c.lastID, 10), idem: newIdempotencyKey(), note: make(chan struct{}, 1)}
	if !c.started {
		c.started = true
		c.wg.Go(c.loop) // ends at Close
	}
	c.mu.Unlock()
	cl.req, err = json.Marshal(requestMessage{Type: "request", ID: cl.id, IdempotencyKey: cl.idem, Body: raw})
	if err != nil {
		return Result{}, fmt.Errorf("encode request: %w", err)
	}
	if len(cl.req) > gateway.MaxMessageBytes {
		return Result{}, &Error{Code: string(inference.CodeInvalidRequest),
			Message: fmt.Sprintf("request body is %d bytes: at most %d", len(raw), gateway.MaxMessageBytes-envelopeBytes)}
	}
	res, err := c.await(ctx, cl, onToken)
	if errors.Is(err, errFallback) {
		return c.chatREST(ctx, raw, onToken)
	}
	return res, err
}

// call is one request in flight over WebSocket.
type call struct {
	id   string
	idem string
	req  []byte // the encoded request message

	sentOn *wsConn // guarded by Client.mu: the connection it was last sent on
	// lostAt, guarded by Client.mu, is when the connection it was sent on died; zero while
	// it is on a live connection or was never sent.
	lostAt time.Time

	mu    sync.Mutex
	inbox []event
	note  chan struct{} // cap 1: the inbox has events
}

// event is what reaches a call: a server message, the start of an attempt (a submission,
// after which the coordinator replays from index 0), or a failure to connect.
type event struct {
	m       serverMessage
	attempt bool
	err     error
}

func (cl *call) push(e event) {
	cl.mu.Lock()
	cl.inbox = append(cl.inbox, e)
	cl.mu.Unlock()
	select {
	case cl.note <- struct{}{}:
	default:
	}
}

func (cl *call) take() []event {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	in := cl.inbox
	cl.inbox = nil
	return in
}

// await submits cl and turns its events into tokens and one outcome.
func (c *Client) await(ctx context.Context, cl *call, onToken func(Token)) (Result, error) {
	var (
		texts    []string // delivered, by index
		seen     int      // tokens of the current attempt, delivered or skipped
		attempts int      // submissions so far
		retried  bool
		res      = Result{Transport: TransportWebSocket}
		text     strings.Builder
	)
	c.submit(cl)
	defer c.forget(cl)
	for {
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-c.ctx.Done():
			return Result{}, ErrClosed
		case <-cl.note:
		}
		for _, e := range cl.take() {
			switch {
			case e.err != nil:
				return Result{}, e.err
			case e.attempt:
				attempts++
				res.Resubmits = attempts - 1
				seen = 0
				continue
			}
			m := e.m
			switch m.Type {
			case "token":
				if m.Index != seen {
					return Result{}, fmt.Errorf("%w: token %d, want %d", ErrProtocol, m.Index, seen)
				}
				seen++
				if m.Index < len(texts) {
					if texts[m.Index] != m.Text {
						return Result{}, fmt.Errorf("%w: token %d was %q, now %q", ErrReplayMismatch, m.Index, texts[m.Index], m.Text)
					}
					continue
				}
				texts = append(texts, m.Text)
				text.WriteString(m.Text)
				onToken(Token{Index: m.Index, Text: m.Text})
			case "done":
				if seen < len(texts) {
					return Result{}, fmt.Errorf("%w: %d tokens delivered, the replay ended after %d", ErrReplayMismatch, len(texts), seen)
				}
				res.Text, res.Tokens, res.FinishReason = text.String(), len(texts), m.FinishReason
				if m.Usage != nil {
					res.Usage = *m.Usage
				}
				if mi := m.Meshinfer; mi != nil {
					res.Route, res.Tier, res.Attempts = mi.Route, mi.Tier, mi.Attempts
				}
				return res, nil
			case "error":
				e := m.err()
				if !retried && len(texts) == 0 && retryable(e.Code) {
					// A fresh routing decision: the coordinator routes every submission anew.
					retried = true
					c.submit(cl)
					continue
				}
				return Result{}, e
			}
		}
	}
}

// retryable reports whether an error before any token is worth one more submission: the
// target was lost or nothing could serve it, which another routing decision may change.
func retryable(code string) bool {
	return code == string(inference.CodePeerLost) || code == string(inference.CodeUnavailable)
}

// submit registers cl and sends it on the live connection, or wakes the connection loop,
// which sends it once connected. A call is sent at most once per connection.
func (c *Client) submit(cl *call) {
	c.mu.Lock()
	c.calls[cl.id] = cl
	wc := c.conn
	cl.sentOn = wc
	c.mu.Unlock()
	if wc == nil {
		select {
		case c.wake <- struct{}{}:
		default:
		}
		return
	}
	wc.submit(cl)
}

// forget drops cl when Chat returns; if it was still in flight on a live connection, the
// coordinator is told to cancel it.
func (c *Client) forget(cl *call) {
	c.mu.Lock()
	_, inFlight := c.calls[cl.id]
	delete(c.calls, cl.id)
	wc := c.conn
	sent := inFlight && wc != nil && cl.sentOn == wc
	c.mu.Unlock()
	if sent {
		b, _ := json.Marshal(requestMessage{Type: "cancel", ID: cl.id})
		wc.send(b)
	}
}

// loop keeps a connection while requests are in flight: it dials, serves the connection
// until it dies, and dials again with backoff. It ends at Close.
func (c *Client) loop() {
	failures := 0 // failed dials in a row
	lost := false // the last connection died with requests in flight
	for {
		if !c.waitForCalls() {
			return
		}
		if lost || failures > 0 {
			if !c.sleep(c.backoff(failures)) {
				return
			}
		}
		c.failLost(time.Now())
		wc, err := c.dial(c.dialTimeout(time.Now()))
		if err != nil {
			if c.ctx.Err() != nil {
				return
			}
			c.mu.Lock()
			connected := c.connected
			c.mu.Unlock()
			switch {
			case errors.Is(err, errFallback):
				c.mu.Lock()
				c.rest = true
				c.mu.Unlock()
				c.failCalls(errFallback)
			case !connected || permanent(err):
				c.failCalls(err)
			case failures+1 >= maxRedials:
				c.failCalls(&Error{Code: string(inference.CodeUnavailable),
					Message: fmt.Sprintf("the gateway is unreachable after %d attempts: %v", maxRedials, err)})
			default:
				failures++
				continue
			}
			failures, lost = 0, false
			continue
		}
		failures = 0
		lost = c.serveConn(wc)
	}
}

// sleep waits for d, failing with coordinator_lost the calls whose lost timeout passes
// meanwhile; false at Close.
func (c *Client) sleep(d time.Duration) bool {
	end := time.Now().Add(d)
	for {
		now := time.Now()
		c.failLost(now)
		wait := end.Sub(now)
		if wait <= 0 {
			return true
		}
		if next, ok := c.nextLost(); ok {
			wait = min(wait, max(next.Sub(now), 0))
		}
		t := time.NewTimer(wait)
		select {
		case <-c.ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// nextLost is when the first lost call's timeout passes; false when no call is lost.
func (c *Client) nextLost() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	for _, cl := range c.calls {
		if !cl.lostAt.IsZero() && (next.IsZero() || cl.lostAt.Before(next)) {
			next = cl.lostAt
		}
	}
	return next.Add(c.cfg.lost), !next.IsZero()
}

// dialTimeout bounds a dial: dialTimeout, or less when a lost call's timeout passes
// sooner, so that a coordinator that does not answer cannot hold a lost call past it.
func (c *Client) dialTimeout(now time.Time) time.Duration {
	if next, ok := c.nextLost(); ok {
		return min(dialTimeout, max(next.Sub(now), time.Millisecond))
	}
	return dialTimeout
}

// failLost ends with coordinator_lost, once each, the calls whose connection died more
// than the lost timeout before now and that no connection took back since.
func (c *Client) failLost(now time.Time) {
	c.mu.Lock()
	var lost []*call
	for id, cl := range c.calls {
		if !cl.lostAt.IsZero() && now.Sub(cl.lostAt) >= c.cfg.lost {
			lost = append(lost, cl)
			delete(c.calls, id)
		}
	}
	c.mu.Unlock()
	for _, cl := range lost {
		cl.push(event{err: &Error{Code: string(inference.CodeCoordinatorLost), Message: fmt.Sprintf(
			"the connection to the coordinator was lost with this request in flight, and no connection came back within %v: "+
				"it may have run, and been billed, or not", c.cfg.lost)}})
	}
}

// waitForCalls waits until requests are waiting for a connection; false at Close.
func (c *Client) waitForCalls() bool {
	for {
		c.mu.Lock()
		n := len(c.calls)
		c.mu.Unlock()
		if n > 0 {
			return true
		}
		select {
		case <-c.ctx.Done():
			return false
		case <-c.wake:
		}
	}
}

// backoff is the wait before redial n+1 after n failures: d = base·2^n capped at backoffCap,
// then d/2 plus a uniform draw in [0, d/2).
func (c *Client) backoff(n int) time.Duration {
	d := backoffCap
	if n < 16 {
		d = min(backoffBase<<n, backoffCap)
	}
	var j time.Duration
	if c.cfg.rng != nil {
		j = time.Duration(c.cfg.rng.Int64N(int64(d / 2)))
	} else {
		j = time.Duration(randv2.Int64N(int64(d / 2)))
	}
	return d/2 + j
}

// failCalls ends every call waiting for a connection with err.
func (c *Client) failCalls(err error) {
	c.mu.Lock()
	calls := make([]*call, 0, len(c.calls))
	for id, cl := range c.calls {
		calls = append(calls, cl)
		delete(c.calls, id)
	}
	c.mu.Unlock()
	for _, cl := range calls {
		cl.push(event{err: err})
	}
}

// permanent reports whether a dial error will not go away by retrying: the coordinator
// refused the key or the request (4xx other than 408 and 429).
func permanent(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status >= 400 && e.Status < 500 &&
		e.Status != http.StatusRequestTimeout && e.Status != http.StatusTooManyRequests
}

// dial opens a connection. An HTTP answer other than 101 becomes an *Error, or errFallback
// when it says the endpoint is absent (404, 405, 426, 501: a coordinator without it, or a
// proxy that does not pass WebSocket through).
func (c *Client) dial(timeout time.Duration) (*wsConn, error) {
	h := http.Header{}
	if c.key != "" {
		h.Set("Authorization", "Bearer "+c.key)
	}
	if c.cfg.device != "" {
		h.Set(gateway.DeviceHeader, c.cfg.device)
	}
	dctx, cancel := context.WithTimeout(c.ctx, timeout)
	ws, resp, err := websocket.Dial(dctx, c.base+gateway.WebSocketPath, &websocket.DialOptions{HTTPClient: c.cfg.hc, HTTPHeader: h})
	cancel()
	if err != nil {
		if resp == nil {
			return nil, fmt.Errorf("connect to the gateway: %w", err)
		}
		switch resp.StatusCode {
		case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUpgradeRequired, http.StatusNotImplemented:
			return nil, errFallback
		}
		return nil, httpError(resp)
	}
	ws.SetReadLimit(gateway.MaxMessageBytes)
	ctx, stop := context.WithCancel(c.ctx)
	c.mu.Lock()
	c.connected = true
	c.mu.Unlock()
	return &wsConn{ws: ws, ctx: ctx, cancel: stop}, nil
}

// serveConn sends the requests in flight on wc (resubmitting those sent on an earlier
// connection), runs its reader and pinger, and returns when it died or at Close: whether
// requests were left in flight.
func (c *Client) serveConn(wc *wsConn) bool {
	wc.wg.Go(func() { c.readLoop(wc) }) // ends when the connection closes
	wc.wg.Go(func() { c.pingLoop(wc) }) // ends with wc.ctx
	c.mu.Lock()
	c.conn = wc
	var pending []*call
	for _, cl := range c.calls {
		if cl.sentOn != wc {
			cl.sentOn, cl.lostAt = wc, time.Time{}
			pending = append(pending, cl)
		}
	}
	c.mu.Unlock()
	for _, cl := range pending {
		wc.submit(cl)
	}
	<-wc.ctx.Done()
	c.mu.Lock()
	c.conn = nil
	left := len(c.calls) > 0
	if c.ctx.Err() == nil {
		now := time.Now()
		for _, cl := range c.calls {
			if cl.sentOn == wc {
				cl.lostAt = now
			}
		}
	}
	c.mu.Unlock()
	if c.ctx.Err() != nil {
		wc.ws.Close(websocket.StatusNormalClosure, "")
	} else {
		wc.ws.CloseNow()
	}
	wc.wg.Wait()
	return left
}

// readLoop hands each message to its call until the connection closes, then ends wc.
func (c *Client) readLoop(wc *wsConn) {
	defer wc.cancel()
	for {
		// Not wc.ctx: at Close, serveConn closes with a handshake, which this read completes.
		_, b, err := wc.ws.Read(context.Background())
		if err != nil {
			return
		}
		wc.missed.Store(0) // anything from the coordinator shows the connection lives
		var m serverMessage
		if err := json.Unmarshal(b, &m); err != nil {
			wc.ws.Close(websocket.StatusInvalidFramePayloadData, "invalid payload")
			return
		}
		switch m.Type {
		case "token", "done", "error":
			c.mu.Lock()
			cl := c.calls[m.ID]
			if cl != nil && m.Type != "token" {
				delete(c.calls, m.ID) // the id's one outcome
			}
			c.mu.Unlock()
			if cl != nil {
				cl.push(event{m: m})
			}
		}
	}
}

// pingLoop pings every interval; when missedPongs pings in a row went unanswered, at the
// next tick, it declares the connection dead and ends it.
func (c *Client) pingLoop(wc *wsConn) {
	ticks, stop := c.cfg.pingClock(c.cfg.ping)
	defer stop()
	var ts int64
	for {
		select {
		case <-wc.ctx.Done():
			return
		case <-ticks:
		}
		if wc.missed.Load() >= missedPongs {
			wc.cancel()
			return
		}
		wc.missed.Add(1)
		ts++
		b, _ := json.Marshal(pingMessage{Type: "ping", TS: ts})
		wc.send(b)
	}
}

// wsConn is one WebSocket connection and its goroutines.
type wsConn struct {
	ws     *websocket.Conn
	ctx    context.Context // ends when the connection is dead, or at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	missed atomic.Int32 // pings sent since the last message received
}

// submit sends cl's request message, after marking the start of an attempt in its inbox so
// that the replay's indices restart there.
func (wc *wsConn) submit(cl *call) {
	cl.push(event{attempt: true})
	wc.send(cl.req)
}

// send writes one message; a failure ends the connection (its calls are resubmitted on the
// next one).
func (wc *wsConn) send(b []byte) {
	ctx, cancel := context.WithTimeout(wc.ctx, writeTimeout)
	defer cancel()
	if err := wc.ws.Write(ctx, websocket.MessageText, b); err != nil {
		wc.cancel()
	}
}

// Wire messages (see package gateway's documentation).
type (
	requestMessage struct {
		Type           string          `json:"type"`
		ID             string          `json:"id"`
		IdempotencyKey string          `json:"idempotency_key,omitempty"`
		Body           json.RawMessage `json:"body,omitempty"`
	}
	pingMessage struct {
		Type string `json:"type"`
		TS   int64  `json:"ts"`
	}
	serverMessage struct {
		Type         string           `json:"type"`
		ID           string           `json:"id"`
		Index        int              `json:"index"`
		Text         string           `json:"text"`
		FinishReason string           `json:"finish_reason"`
		Usage        *inference.Usage `json:"usage"`
		Meshinfer    *served          `json:"meshinfer"`
		Error        *errorObject     `json:"error"`
	}
	served struct {
		Route    string `json:"route"`
		Tier     string `json:"tier"`
		Attempts int    `json:"attempts"`
	}
	errorObject struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
)

func (m serverMessage) err() *Error {
	if m.Error == nil {
		return &Error{Code: string(inference.CodeUnavailable), Message: "error message without an error"}
	}
	return &Error{Code: m.Error.Code, Message: m.Error.Message}
}

// encodeBody returns body as a JSON object.
func encodeBody(body any) (json.RawMessage, error) {
	var raw []byte
	switch b := body.(type) {
	case json.RawMessage:
		raw = b
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return nil, fmt.Errorf("encode request body: %w", err)
		}
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, errors.New("request body must be a JSON object")
	}
	return raw, nil
}

// newIdempotencyKey returns 128 random bits in hex: unique without coordination.
func newIdempotencyKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// httpError reads the coordinator's error JSON from resp, or describes resp without it.
func httpError(resp *http.Response) *Error {
	e := &Error{Status: resp.StatusCode, Code: string(inference.CodeUnavailable)}
	var body struct {
		Error *errorObject `json:"error"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if json.Unmarshal(b, &body) == nil && body.Error != nil && body.Error.Code != "" {
		e.Code, e.Message = body.Error.Code, body.Error.Message
		return e
	}
	e.Message = strings.TrimSpace(string(b))
	if e.Message == "" {
		e.Message = resp.Status
	}
	return e
}
