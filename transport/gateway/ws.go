package gateway

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/meshinfer/meshinfer/inference"
)

// WebSocketPath is where a coordinator serves the gateway's WebSocket endpoint, on its API
// listener and behind RequireKey.
const WebSocketPath = "/v1/gateway"

// Subprotocol is the WebSocket subprotocol of the gateway. A client may offer it; a browser
// offers it with its key, new WebSocket(url, [Subprotocol, key]), since it cannot set an
// Authorization header, and the gateway selects it.
const Subprotocol = "meshinfer.v1"

// Bounds of the WebSocket endpoint. See the package documentation for the wire format.
const (
	// MaxMessageBytes bounds one WebSocket message, either way: the API's 256 KiB body cap
	// (inference's default MaxBodyBytes) plus 64 KiB for the envelope and JSON escaping. A
	// larger message from a client closes its connection with 1009.
	MaxMessageBytes = 320 << 10
	// MaxRequestID bounds a request's id in bytes: a counter or a UUID fits with room.
	MaxRequestID = 64
	// MaxIdempotencyKey bounds an idempotency key in bytes: 256 random bits in hex are 64.
	MaxIdempotencyKey = 128
	// MaxInFlight bounds the requests in flight on one connection; more are refused with
	// overloaded at once. 32 keeps a single client from taking more than a fair share of
	// the coordinator while letting an app run a few conversations side by side.
	MaxInFlight = 32
	// IdleTimeout closes a connection from which no message arrived for this long: six of
	// the Go client's default 10 s keepalive pings missed in a row. It runs from the end of
	// one message to the first frame of the next, a stall inside that frame's header
	// included.
	IdleTimeout = 60 * time.Second
	// MessageTimeout bounds reading one message once its first frame's header has arrived:
	// a client that starts a message and stalls (slowloris on the WebSocket) is cut then,
	// however it trickles the rest. The largest message, MaxMessageBytes, needs 32 KiB/s,
	// a tenth of a poor mobile uplink; the figure is docs/reliability.md's F4 header
	// deadline.
	MessageTimeout = 10 * time.Second
	// DetachGrace is how long a request whose connection died keeps running with no
	// connection attached, waiting for its client to resubmit it on a new one: long enough
	// for a reconnect with a few backoff steps (0.2 + 0.4 + … + 3.2 s ≈ 6 s), short enough
	// that a client gone for good wastes little compute.
	DetachGrace = 10 * time.Second
)

const (
	// outQueue bounds the messages waiting to be written to one connection. A full queue
	// blocks only the goroutines feeding it (a slow client slows its own replies); a
	// request's tokens are kept by its run, not here, so generation never waits on it.
	outQueue = 64
	// wsWriteTimeout bounds one message write: a client that stops reading is cut off. Same
	// figure as the REST API's write timeout.
	wsWriteTimeout = 30 * time.Second
	// cacheEntries, cacheTTL and cacheBytes bound the idempotency cache of completed
	// results: a resubmission comes within seconds of its connection's death, so 10 minutes
	// is plenty, and 32 MiB holds 1,024 results of about 8,000 tokens of 4 bytes.
	cacheEntries = 1024
	cacheTTL     = 10 * time.Minute
	cacheBytes   = 32 << 20
	// maxMessageHeaders and maxHeaderValue bound a request message's headers object: a few
	// preference headers of a few words each.
	maxMessageHeaders = 8
	maxHeaderValue    = 256
	// maxErrorBody bounds how much of a non-200 answer of the API is kept to decode its
	// error JSON (bytes); an error is a few hundred.
	maxErrorBody = 64 << 10
	// meshinferHeaderPrefix starts the only headers a request message may set.
	meshinferHeaderPrefix = "X-Meshinfer-"
)

// Message types of the wire format.
const (
	msgRequest = "request"
	msgCancel  = "cancel"
	msgPing    = "ping"
	msgToken   = "token"
	msgDone    = "done"
	msgError   = "error"
	msgPong    = "pong"
)

// Close reasons, sent with their codes; a reason is at most 123 bytes.
const (
	reasonInvalid     = "invalid payload"
	reasonTextOnly    = "text messages only"
	reasonDuplicateID = "request id already in flight"
	reasonShutdown    = "shutting down"
	reasonKeyRevoked  = "API key revoked"
)

var (
	// errShuttingDown is the cause with which Close cancels the runs still going.
	errShuttingDown = inference.Errorf(inference.CodeShuttingDown, "coordinator is shutting down")
	// errCancelled ends a request its client cancelled.
	errCancelled = inference.Errorf(inference.CodeUnavailable, "cancelled by the client")
	// errKeyReused refuses a request whose idempotency key names another request.
	errKeyReused = inference.Errorf(inference.CodeInvalidRequest,
		"idempotency_key already names another request of this session: use a fresh key per request")
	// errBilledNotKept answers the resubmission of a request that completed and was
	// metered, when its result is no longer kept: too large for its record, evicted from
	// the result cache by newer ones, or lost in a crash between the meter's line and the
	// record's.
	errBilledNotKept = inference.Errorf(inference.CodeCoordinatorLost,
		"this request completed and was billed earlier, and its output is no longer kept: "+
			"it is not run again under this idempotency_key")
	// errAbandoned ends a request whose connection died and that no client resubmitted
	// within DetachGrace. Nobody receives it; the meter records it.
	errAbandoned = inference.Errorf(inference.CodeUnavailable, "client went away")
)

// WSOption configures a WebSocket.
type WSOption func(*WebSocket)

// WithIdleTimeout replaces IdleTimeout.
func WithIdleTimeout(d time.Duration) WSOption { return func(g *WebSocket) { g.idle = d } }

// WithMessageTimeout replaces MessageTimeout.
func WithMessageTimeout(d time.Duration) WSOption { return func(g *WebSocket) { g.message = d } }

// WithDetachGrace replaces DetachGrace.
func WithDetachGrace(d time.Duration) WSOption { return func(g *WebSocket) { g.grace = d } }

// WithRecords keeps the results of completed requests with an idempotency key in
// dir/IdempotencyFile, so that a restarted coordinator answers their resubmissions without
// running them again, and consults m, the coordinator's meter, for those it metered but did
// not keep (m may be nil). See the package documentation ("Across a restart").
func WithRecords(dir string, m *Meter) WSOption {
	return func(g *WebSocket) { g.recordsDir, g.meter = dir, m }
}

// WithClock replaces time.Now for the ages of results and records.
func WithClock(now func() time.Time) WSOption { return func(g *WebSocket) { g.now = now } }

// WithTestHooks injects h's faults. For tests of clients only.
func WithTestHooks(h WSTestHooks) WSOption { return func(g *WebSocket) { g.hooks = h } }

// WSTestHooks inject faults into a WebSocket, for tests of clients. conn numbers the
// connections in the order they were accepted, from 1. Nil fields do nothing. Hooks run on
// the connection's goroutines and must not block.
type WSTestHooks struct {
	// DropPing reports whether to leave a ping unanswered.
	DropPing func(conn uint64, ts int64) bool
	// CutAfterToken reports, after a token message was written, whether to cut the
	// connection at once, without a close frame, as a network failure would.
	CutAfterToken func(conn uint64, id string, index int) bool
	// Closed is called when a connection ended and its goroutines are gone.
	Closed func(conn uint64)
}

// WebSocket serves the gateway's WebSocket endpoint: each connection multiplexes requests
// that it runs through api, the coordinator's OpenAI handler, in-process. It must be
// mounted behind RequireKey, which gives it the Session. See the package documentation for
// the wire format.
//
// Lock order: mu before a run's mu, never the reverse.
type WebSocket struct {
	keys    *KeyStore
	api     http.Handler
	idle    time.Duration
	message time.Duration
	grace   time.Duration
	hooks   WSTestHooks
	now     func() time.Time
	direct  DirectRelay // nil: no direct requests
	origins []string    // page origins allowed besides the coordinator's own (origins.go)

	recordsDir string   // "": no records across a restart
	recs       *records // nil without recordsDir
	meter      *Meter   // nil: no meter to consult for results not kept
	restored   int      // records read back at start

	// ctx is the parent of every run and connection; Close cancels it with errShuttingDown.
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup // connections (their handlers) and runs

	mu     sync.Mutex
	closed bool
	conns  uint64          // connections accepted so far
	runs   map[string]*run // running requests that have an idempotency key, by runKey
	cache  resultCache     // completed results, by runKey
}

// NewWebSocket returns the endpoint, serving requests through api: node passes the OpenAI
// handler it wraps, so that requests over WebSocket pass the same decoding, limits,
// privacy gate, dispatch and metering as over REST. keys is the store RequireKey checks in
// front of it: every request message checks again that the connection's key is live.
func NewWebSocket(keys *KeyStore, api http.Handler, opts ...WSOption) (*WebSocket, error) {
	if keys == nil || api == nil {
		return nil, errors.New("gateway websocket: no key store or no API handler")
	}
	g := &WebSocket{keys: keys, api: api, idle: IdleTimeout, message: MessageTimeout, grace: DetachGrace, now: time.Now, runs: make(map[string]*run)}
	for _, o := range opts {
		o(g)
	}
	if g.idle <= 0 || g.message <= 0 || g.grace < 0 {
		return nil, fmt.Errorf("gateway websocket: idle timeout %v, message timeout %v and detach grace %v must be positive",
			g.idle, g.message, g.grace)
	}
	g.cache = newResultCache(cacheEntries, cacheBytes, cacheTTL)
	if g.recordsDir != "" {
		recs, live, err := openRecords(g.recordsDir, g.now())
		if err != nil {
			return nil, fmt.Errorf("gateway websocket: %w", err)
		}
		g.recs, g.restored = recs, len(live)
		for _, rc := range live {
			r := restoredRun(rc)
			g.cache.put(r.key, r, rc.Time)
		}
	}
	g.ctx, g.cancel = context.WithCancelCause(context.Background())
	return g, nil
}

// Restored is how many completed results NewWebSocket read back from its records: those a
// previous run of the coordinator kept that are still within their age.
func (g *WebSocket) Restored() int { return g.restored }

// Close closes every connection (1001), cancels the requests still running, which end with
// shutting_down, and returns once every goroutine of the endpoint has ended. Upgrades that
// arrive afterwards get 503. Idempotent.
func (g *WebSocket) Close() error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.cancel(errShuttingDown)
	g.wg.Wait()
	if g.recs != nil {
		return g.recs.close()
	}
	return nil
}

// ServeHTTP upgrades the request to a WebSocket and serves the connection until it ends.
func (g *WebSocket) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sess, ok := SessionFrom(r.Context())
	if !ok {
		writeError(w, http.StatusServiceUnavailable, string(inference.CodeUnavailable),
			"the gateway is not available: the endpoint is not behind API-key authentication")
		return
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, string(inference.CodeShuttingDown), "the coordinator is shutting down")
		return
	}
	g.wg.Add(1)
	g.conns++
	seq := g.conns
	g.mu.Unlock()
	defer g.wg.Done()

	// Same-origin and the WithOriginPatterns origins only, no compression; Subprotocol when
	// the client offers it (a browser must, having offered its key that way: RequireKey
	// removed the key from the list).
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{Subprotocol}, OriginPatterns: g.origins})
	if err != nil {
		return // Accept answered the request
	}
	ws.SetReadLimit(MaxMessageBytes)
	c := &conn{g: g, ws: ws, seq: seq, session: sess, remote: r.RemoteAddr, host: r.Host,
		out: make(chan outMsg, outQueue), subs: make(map[string]*sub), directs: make(map[string]*directCall)}
	c.serve(r.Context())
	if g.hooks.Closed != nil {
		g.hooks.Closed(seq)
	}
}

// conn is one WebSocket connection. Its read loop runs on the handler's goroutine; a writer
// goroutine and one forwarder per request in flight run in wg and end with ctx.
type conn struct {
	g       *WebSocket
	ws      *websocket.Conn
	seq     uint64
	session Session
	remote  string // of the upgrade request, for the requests run through the API
	host    string

	ctx    context.Context // ends when the connection does
	cancel context.CancelFunc
	wg     sync.WaitGroup
	out    chan outMsg

	mu      sync.Mutex
	subs    map[string]*sub        // requests in flight, by client id
	directs map[string]*directCall // direct requests in flight, by client id
}

// outMsg is one encoded message waiting for the writer. index is the token's for a token
// message, -1 otherwise.
type outMsg struct {
	b     []byte
	id    string
	index int
}

// serve runs the connection until it ends: the client closed it, broke the protocol, went
// silent, the writer failed, or the endpoint or API server shuts down.
func (c *conn) serve(reqCtx context.Context) {
	// life ends only on shutdown: the API server's (the request's context) or ours.
	life, stopLife := context.WithCancel(reqCtx)
	defer stopLife()
	stopParent := context.AfterFunc(c.g.ctx, stopLife)
	defer stopParent()
	goingAway := make(chan struct{})
	stopGoingAway := context.AfterFunc(life, func() {
		defer close(goingAway)
		c.ws.Close(websocket.StatusGoingAway, reasonShutdown)
	})

	c.ctx, c.cancel = context.WithCancel(life)
	c.wg.Go(c.writeLoop) // ends with ctx
	code, reason := c.readLoop()
	c.cancel()
	if code != 0 {
		c.ws.Close(code, reason)
	} else {
		c.ws.CloseNow()
	}
	if !stopGoingAway() {
		<-goingAway
	}
	c.wg.Wait()
}

// readLoop reads and handles messages until the connection ends. It returns the close code
// and reason to send, or 0 when the connection is gone already.
func (c *conn) readLoop() (websocket.StatusCode, string) {
	for {
		typ, b, err := c.read()
		switch {
		case errors.Is(err, websocket.ErrMessageTooBig):
			return websocket.StatusMessageTooBig, "message too big"
		case err != nil:
			return 0, "" // closed by the client, cut, silent for idle (Read closed it) or shut down
		case typ != websocket.MessageText:
			return websocket.StatusUnsupportedData, reasonTextOnly
		}
		m, err := decodeClientMessage(b)
		if err != nil {
			return websocket.StatusInvalidFramePayloadData, reasonInvalid
		}
		if code, reason := c.handle(m); code != 0 {
			return code, reason
		}
		if c.ctx.Err() != nil {
			return 0, "" // the writer failed
		}
	}
}

// read reads the next message: its first frame must start within the idle timeout, and
// the message must then be complete within the message timeout. Either deadline closes the
// connection, without a close frame (a read cannot be cut otherwise).
func (c *conn) read() (websocket.MessageType, []byte, error) {
	// Not c.ctx: a shutdown closes with 1001 (serve) instead of cutting the read.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deadline := time.AfterFunc(c.g.idle, cancel)
	typ, r, err := c.ws.Reader(ctx)
	if !deadline.Stop() || err != nil {
		return 0, nil, cmp.Or(err, context.Canceled) // the idle deadline fired as the frame came
	}
	deadline = time.AfterFunc(c.g.message, cancel)
	defer deadline.Stop()
	b, err := io.ReadAll(r) // bounded by the read limit, MaxMessageBytes
	return typ, b, err
}

// handle acts on one decoded message; a non-zero code closes the connection.
func (c *conn) handle(m clientMessage) (websocket.StatusCode, string) {
	switch m.Type {
	case msgPing:
		if c.g.hooks.DropPing != nil && c.g.hooks.DropPing(c.seq, *m.TS) {
			return 0, ""
		}
		c.send(outMsg{b: encode(pongMessage{Type: msgPong, TS: *m.TS}), index: -1})
	case msgCancel:
		if c.cancelDirect(m.ID) {
			return 0, ""
		}
		c.mu.Lock()
		s := c.subs[m.ID]
		c.mu.Unlock()
		if s != nil {
			s.stopOnce.Do(func() { close(s.stop) })
		}
	case msgRequest, msgDirect:
		return c.request(m)
	case msgSignal:
		c.signal(m)
	}
	return 0, ""
}

// request starts, or attaches to, the run of a request message, and a forwarder that sends
// its messages under the message's id.
func (c *conn) request(m clientMessage) (websocket.StatusCode, string) {
	c.mu.Lock()
	_, dup := c.subs[m.ID]
	_, dupDirect := c.directs[m.ID]
	dup = dup || dupDirect
	full := len(c.subs)+len(c.directs) >= MaxInFlight
	c.mu.Unlock()
	switch {
	case dup:
		return websocket.StatusPolicyViolation, reasonDuplicateID
	case full:
		c.sendError(m.ID, inference.CodeOverloaded,
			fmt.Sprintf("%d requests in flight on this connection already: wait for one to finish, or open another connection", MaxInFlight))
		return 0, ""
	}
	// The key may have been revoked since the upgrade: from then on, as over REST, the
	// client's next request is refused, here with the connection.
	switch err := c.g.keys.liveKey(c.session.KeyID); {
	case errors.Is(err, ErrKeyRevoked), errors.Is(err, ErrKeyUnknown):
		return websocket.StatusPolicyViolation, reasonKeyRevoked
	case err != nil:
		c.sendError(m.ID, inference.CodeUnavailable, "the coordinator cannot read its API keys: try again later")
		return 0, ""
	}
	if m.Type == msgDirect {
		c.directRequest(m)
		return 0, ""
	}
	req, digest, err := c.apiRequest(m)
	if err != nil {
		c.sendError(m.ID, inference.CodeInvalidRequest, err.Error())
		return 0, ""
	}
	r, err := c.g.attach(c.session, m.IdempotencyKey, digest, req)
	if err != nil {
		e := terminal(err)
		c.sendError(m.ID, e.Code, e.Message)
		return 0, ""
	}
	s := &sub{id: m.ID, run: r, stop: make(chan struct{})}
	c.mu.Lock()
	c.subs[m.ID] = s
	c.mu.Unlock()
	c.wg.Go(func() { c.forward(s) }) // ends with the run's outcome, a cancel, or ctx
	return 0, ""
}

// apiRequest builds the POST /v1/chat/completions that serves m: its body with "stream"
// and "stream_options.include_usage" forced on, its headers, and the connection's remote
// address and host; and the digest of that body and those headers, which identifies the
// request for idempotency. The context is the run's, set by attach.
func (c *conn) apiRequest(m clientMessage) (*http.Request, [sha256.Size]byte, error) {
	var none [sha256.Size]byte
	var obj map[string]json.RawMessage
	if len(m.Body) == 0 || json.Unmarshal(m.Body, &obj) != nil || obj == nil {
		return nil, none, errors.New("body must be a chat completion request object, as POST /v1/chat/completions takes")
	}
	obj["stream"] = json.RawMessage(`true`)
	obj["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	body, err := json.Marshal(obj) // keys sorted: the digest does not depend on their order
	if err != nil {
		return nil, none, fmt.Errorf("body: %w", err)
	}
	if len(m.Headers) > maxMessageHeaders {
		return nil, none, fmt.Errorf("%d headers: at most %d", len(m.Headers), maxMessageHeaders)
	}
	h := http.Header{"Content-Type": {"application/json"}}
	for k, v := range m.Headers {
		ck := http.CanonicalHeaderKey(k)
		if !strings.HasPrefix(ck, meshinferHeaderPrefix) || ck == DeviceHeader {
			return nil, none, fmt.Errorf("header %q may not be set: only %s* preference headers, and not %s (the connection's)",
				k, meshinferHeaderPrefix, DeviceHeader)
		}
		if len(v) > maxHeaderValue || !visibleASCII(v) {
			return nil, none, fmt.Errorf("header %s: at most %d printable ASCII characters", ck, maxHeaderValue)
		}
		h.Set(ck, v)
	}
	d := sha256.New()
	d.Write(body)
	for _, k := range slices.Sorted(maps.Keys(h)) {
		fmt.Fprintf(d, "\n%s: %s", k, h.Get(k)) // names and values hold no newline
	}
	req, err := http.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, none, err // cannot happen: constant method and path
	}
	req.Header, req.RemoteAddr, req.Host = h, c.remote, c.host
	return req, [sha256.Size]byte(d.Sum(nil)), nil
}

// liveKey checks that the key with this ID is still live: nil, ErrKeyUnknown (gone from the
// file), a *RevokedError, or the error reading the store. Like Check, it reads the file
// again when it changed.
func (s *KeyStore) liveKey(id string) error {
	snap, err := s.refresh()
	if err != nil {
		return err
	}
	for _, e := range snap.entries {
		if e.ID == id {
			if e.Revoked() {
				return &RevokedError{Key: e.Key}
			}
			return nil
		}
	}
	return ErrKeyUnknown
}

func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 || c > 0x7e) && c != '\t' {
			return false
		}
	}
	return true
}

// forward sends the messages of s's run, from its first token, under s's id, then its
// outcome. It ends after the outcome, after a cancel of s (with an error message), or
// with the connection (sending nothing more), and detaches s from the run either way.
func (c *conn) forward(s *sub) {
	// The id is free again before its terminal message is queued: a client may reuse it as
	// soon as it reads that message.
	end := func(explicit bool) {
		c.mu.Lock()
		delete(c.subs, s.id)
		c.mu.Unlock()
		s.run.detach(c.g.grace, explicit)
	}
	next := 0
	for {
		toks, fin, changed := s.run.since(next)
		for i, text := range toks {
			if !c.send(outMsg{b: encode(tokenMessage{Type: msgToken, ID: s.id, Index: next + i, Text: text}), id: s.id, index: next + i}) {
				end(false)
				return
			}
		}
		next += len(toks)
		if fin != nil {
			end(false)
			c.send(outMsg{b: fin.encode(s.id), index: -1})
			return
		}
		select {
		case <-changed:
		case <-s.stop:
			end(true)
			c.sendError(s.id, errCancelled.Code, errCancelled.Message)
			return
		case <-c.ctx.Done():
			end(false)
			return
		}
	}
}

// send queues m for the writer; false when the connection ended first.
func (c *conn) send(m outMsg) bool {
	select {
	case c.out <- m:
		return true
	case <-c.ctx.Done():
		return false
	}
}

func (c *conn) sendError(id string, code inference.Code, msg string) {
	c.send(outMsg{b: encode(errorMessage{Type: msgError, ID: id, Error: errorDetail{Code: string(code), Message: msg}}), index: -1})
}

// writeLoop writes queued messages until ctx ends. A failed write ends the connection.
func (c *conn) writeLoop() {
	for {
		select {
		case <-c.ctx.Done():
			return
		case m := <-c.out:
			wctx, cancel := context.WithTimeout(context.Background(), wsWriteTimeout)
			err := c.ws.Write(wctx, websocket.MessageText, m.b)
			cancel()
			if err != nil {
				c.ws.CloseNow()
				c.cancel()
				return
			}
			if m.index >= 0 && c.g.hooks.CutAfterToken != nil && c.g.hooks.CutAfterToken(c.seq, m.id, m.index) {
				c.ws.CloseNow()
				c.cancel()
				return
			}
		}
	}
}

// terminal is err as the typed error a client receives.
func terminal(err error) *inference.Error {
	if e, ok := errors.AsType[*inference.Error](err); ok {
		return e
	}
	return &inference.Error{Code: inference.CodeOf(err), Message: err.Error()}
}

// sub is one request message in flight on a connection: its client id and the run serving
// it.
type sub struct {
	id       string
	run      *run
	stop     chan struct{} // closed by the client's cancel
	stopOnce sync.Once
}

// clientMessage is a message from a client, as decodeClientMessage accepts it.
type clientMessage struct {
	Type           string            `json:"type"`
	ID             string            `json:"id,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Body           json.RawMessage   `json:"body,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
	TS             *int64            `json:"ts,omitempty"`
	Frame          string            `json:"frame,omitempty"` // signal: base64 of one signaling message
}

// decodeClientMessage decodes one message from a client and checks its envelope: a known
// type with the fields it needs, in bounds. Its body and headers are the request's
// business, checked when it is served. Unknown fields are ignored.
func decodeClientMessage(b []byte) (clientMessage, error) {
	var m clientMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return clientMessage{}, fmt.Errorf("not a message object: %w", err)
	}
	switch m.Type {
	case msgRequest:
		if len(m.IdempotencyKey) > MaxIdempotencyKey {
			return clientMessage{}, fmt.Errorf("idempotency_key is %d bytes, at most %d", len(m.IdempotencyKey), MaxIdempotencyKey)
		}
		fallthrough
	case msgCancel, msgDirect, msgSignal:
		if m.ID == "" || len(m.ID) > MaxRequestID {
			return clientMessage{}, fmt.Errorf("%s: id must be 1 to %d bytes", m.Type, MaxRequestID)
		}
		if m.Type == msgSignal && (len(m.Frame) == 0 || len(m.Frame) > base64.StdEncoding.EncodedLen(MaxSignalFrame)) {
			return clientMessage{}, fmt.Errorf("signal: frame must be the base64 of 1 to %d bytes", MaxSignalFrame)
		}
	case msgPing:
		if m.TS == nil {
			return clientMessage{}, errors.New("ping without ts")
		}
	default:
		return clientMessage{}, fmt.Errorf("unknown message type %q", m.Type)
	}
	return m, nil
}

// Messages from the server.
type (
	tokenMessage struct {
		Type  string `json:"type"`
		ID    string `json:"id"`
		Index int    `json:"index"`
		Text  string `json:"text"`
	}
	doneMessage struct {
		Type         string          `json:"type"`
		ID           string          `json:"id"`
		FinishReason string          `json:"finish_reason"`
		Usage        json.RawMessage `json:"usage,omitempty"`
		Meshinfer    json.RawMessage `json:"meshinfer,omitempty"`
	}
	errorMessage struct {
		Type  string      `json:"type"`
		ID    string      `json:"id"`
		Error errorDetail `json:"error"`
	}
	errorDetail struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	pongMessage struct {
		Type string `json:"type"`
		TS   int64  `json:"ts"`
	}
)

// encode marshals one of the server's messages.
func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil { // cannot happen: our types, and raw JSON the API wrote and we parsed
		b, _ = json.Marshal(errorMessage{Type: msgError, Error: errorDetail{Code: string(inference.CodeUnavailable), Message: "encode message"}})
	}
	return b
}
