package stage

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	logging "github.com/ipfs/go-log/v2"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
)

var log = logging.Logger("transport/stage")

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithMaxSessions sets how many sessions the stage holds at once, in all and per previous
// hop (DefaultMaxSessions, DefaultMaxSessionsPerPeer). An open past either is refused with
// overloaded.
func WithMaxSessions(total, perPeer int) ServerOption {
	return func(s *Server) { s.maxTotal, s.maxPeer = total, perPeer }
}

// WithKVBudget bounds the KV cache the stage's sessions may hold together, in bytes, as the
// model's shape gives it: a session of layers [lo, hi) for maxPositions positions holds
// KVBytesPerToken·(hi−lo)/Layers·maxPositions. An open past the budget is refused with
// overloaded. Zero (the default) leaves the bound to the backend, which refuses what it
// cannot hold.
func WithKVBudget(bytes int64) ServerOption { return func(s *Server) { s.kvBudget = bytes } }

// WithForwardTimeout bounds the stage's part of one step: its layers' Forward and the write
// of their output to the next hop (DefaultStepTimeout).
func WithForwardTimeout(d time.Duration) ServerOption {
	return func(s *Server) { s.forwardTimeout = d }
}

// WithSessionIdle sets how long a session waits for its next step before it is freed
// (DefaultSessionIdle).
func WithSessionIdle(d time.Duration) ServerOption { return func(s *Server) { s.idle = d } }

// WithServerObserver records each peer (previous hop, next hop or head) that sends this
// stage a malformed frame or breaks the protocol in o, as reputation.MalformedFrame or
// ProtocolViolation.
func WithServerObserver(o Observer) ServerOption { return func(s *Server) { s.observer = o } }

// WithOnSessionEnd sets a function called once for every session the stage admitted, after
// it ended and its backend session was closed (its KV cache freed) and it stopped counting
// against the limits. It runs on the session's handler goroutine; Close waits for it.
func WithOnSessionEnd(fn func(SessionEnd)) ServerOption { return func(s *Server) { s.onEnd = fn } }

// WithServerTransfers sets a function told of each hidden frame the stage read from its
// previous hop, timed from its first byte to its last (internal/bandwidth: the caller
// keeps those that are samples, prefill steps of at least 64 KiB). It runs on the
// session's handler goroutine and should return at once.
func WithServerTransfers(fn func(from peer.ID, t bandwidth.Transfer)) ServerOption {
	return func(s *Server) { s.transfers = fn }
}

// WithReceiptSigner makes the stage send the head its signed receipt of each session the
// head closes in order, when the head asks for receipts (a receipted session): sign
// returns it for the session's SessionEnd (the same the stage's WithOnSessionEnd function
// gets), at most MaxReceipt bytes. A stage without one takes part in no receipted
// session, as one that predates them.
func WithReceiptSigner(sign func(SessionEnd) (string, error)) ServerOption {
	return func(s *Server) { s.sign = sign }
}

// WithClock sets the clock a SessionEnd's Time and Duration are measured on; time.Now by
// default.
func WithClock(now func() time.Time) ServerOption { return func(s *Server) { s.now = now } }

// OutcomeClosed is a SessionEnd's Outcome when the chain closed the session in order (the
// head's Pipeline.Close).
const OutcomeClosed = "closed"

// SessionEnd describes a session a stage has freed. It carries no hidden states.
type SessionEnd struct {
	Head      peer.ID // the head that opened the chain
	From      peer.ID // the previous hop
	Index     int     // this stage's place in the chain
	Model     string
	Lo, Hi    int // the layers it ran
	Steps     int // the steps it ran
	Positions int // the positions it ran (its KV cache's length)
	// Session is the session's ID, as the head chose it: 32 lowercase hex digits.
	Session string
	// Time is when the session ended and Duration its time from admission to then, on the
	// server's clock (WithClock).
	Time     time.Time
	Duration time.Duration
	// Outcome is OutcomeClosed, or the code of the failure that ended the session; Failed
	// is then the stage the failure names (-1 the head).
	Outcome string
	Failed  int
}

// ServerStats counts what a stage did.
type ServerStats struct {
	Sessions       int    `json:"sessions"`        // open now
	Refused        uint64 `json:"refused"`         // opens refused by the limits (overloaded)
	ProtocolErrors uint64 `json:"protocol_errors"` // streams reset for a malformed frame or a violation
}

// Server runs the stages of chains whose head or previous hop opens them on this host:
// one session per chain, on a StageBackend.
type Server struct {
	h              host.Host
	backend        inference.StageBackend
	maxTotal       int
	maxPeer        int
	kvBudget       int64
	forwardTimeout time.Duration
	idle           time.Duration
	observer       Observer
	onEnd          func(SessionEnd)
	transfers      func(peer.ID, bandwidth.Transfer)
	sign           func(SessionEnd) (string, error)
	now            func() time.Time
	// untimed makes the stage act as one that predates timed sessions: it ignores an open's
	// timing and answers without the flag (tests of a mixed chain).
	untimed bool

	ctx    context.Context // cancelled by Close: every session ends
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per stream handler running

	refused, protoErrs atomic.Uint64

	grace       time.Duration // WithHandOverGrace
	keepTimeout time.Duration // WithKeepTimeout

	mu       sync.Mutex
	closed   bool
	sessions map[sessionKey]*session
	kept     map[sessionKey]*kept // sessions a keep end closed, counted in the limits too
	perPeer  map[peer.ID]int
	kvUsed   int64
}

// NewServer registers the stage protocol's handler on h, running sessions on backend. Close
// removes it and ends every session.
func NewServer(h host.Host, backend inference.StageBackend, opts ...ServerOption) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		h: h, backend: backend, maxTotal: DefaultMaxSessions, maxPeer: DefaultMaxSessionsPerPeer,
		forwardTimeout: DefaultStepTimeout, idle: DefaultSessionIdle, ctx: ctx, cancel: cancel,
		sessions: make(map[sessionKey]*session), perPeer: make(map[peer.ID]int), now: time.Now,
		kept: make(map[sessionKey]*kept), grace: DefaultHandOverGrace, keepTimeout: DefaultKeepTimeout,
	}
	for _, o := range opts {
		o(s)
	}
	h.SetStreamHandler(ID, s.handle)
	return s
}

// Close stops accepting sessions, ends the running ones (their chains get shutting_down)
// and waits for their handlers. Idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	held := s.kept
	s.kept = make(map[sessionKey]*kept)
	s.mu.Unlock()
	s.h.RemoveStreamHandler(ID)
	s.cancel()
	for _, k := range held {
		k.timer.Stop() // an expiry that fired finds the table empty
		s.freeKept(k, OutcomeExpired)
	}
	s.wg.Wait()
	return nil
}

// Sessions returns the number of sessions open now (admitted and not yet freed).
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{Sessions: s.Sessions(), Refused: s.refused.Load(), ProtocolErrors: s.protoErrs.Load()}
}

// SessionInfo describes a session a stage runs now. It carries no hidden states.
type SessionInfo struct {
	Head   peer.ID // the head that opened the chain
	From   peer.ID // the previous hop
	Index  int     // this stage's place in the chain
	Stages int     // the chain's length
	Model  string
	Lo, Hi int // the layers it runs
	// Steps and Positions are those run so far; Forward is its layers' time over them.
	Steps, Positions int
	Forward          time.Duration
}

// Running lists the sessions open now (admitted, their layers perhaps still loading), by
// model, then layers, then head.
func (s *Server) Running() []SessionInfo {
	s.mu.Lock()
	out := make([]SessionInfo, 0, len(s.sessions))
	for _, ss := range s.sessions {
		self := ss.open.hops[0]
		ss.mu.Lock()
		out = append(out, SessionInfo{
			Head: ss.open.head, From: ss.from, Index: ss.index, Stages: ss.stages, Model: ss.open.model,
			Lo: self.Lo, Hi: self.Hi, Steps: ss.steps, Positions: ss.positions, Forward: ss.forward,
		})
		ss.mu.Unlock()
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b SessionInfo) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Lo, b.Lo), cmp.Compare(a.Hi, b.Hi), cmp.Compare(a.Head, b.Head))
	})
	return out
}

// handle serves a stream: an open from a previous hop, or a head's attach of its return
// stream.
func (s *Server) handle(st network.Stream) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		st.Reset()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	from := st.Conn().RemotePeer()
	if err := st.Scope().SetService(ServiceName); err != nil {
		st.Reset()
		return
	}
	// Deadline first: the first frame must arrive within OpenTimeout (slowloris).
	if err := st.SetReadDeadline(time.Now().Add(OpenTimeout)); err != nil {
		st.Reset()
		return
	}
	body, err := frame.ReadOne(st, MaxOpenFrame)
	switch {
	case err != nil:
		if _, bad := violation(err); bad {
			s.protocolError(from, st, err)
			return
		}
		st.Reset()
	case len(body) == 0:
		s.protocolError(from, st, fmt.Errorf("%w: empty frame", errProtocol))
	case body[0] == frameOpen:
		s.serveOpen(from, st, body)
	case body[0] == frameAttach:
		s.serveAttach(from, st, body)
	case body[0] == frameLoad:
		s.serveLoad(from, st, body)
	case body[0] == frameFetch:
		s.serveFetch(from, st, body)
	default:
		s.protocolError(from, st, fmt.Errorf("%w: first frame of type %#x", errProtocol, body[0]))
	}
}

// protocolError counts and records a peer's violation on st and resets it.
func (s *Server) protocolError(from peer.ID, st network.Stream, err error) {
	s.protoErrs.Add(1)
	log.Debugw("stage protocol violation", "peer", from, "err", err)
	observe(s.observer, from, err)
	st.Reset()
}

// serveAttach hands a head's return stream to the session that awaits it: the last stage
// of a chain that head opened, with the session ID the attach names.
func (s *Server) serveAttach(from peer.ID, st network.Stream, body []byte) {
	s.handTo(from, st, body, frameAttach, (*session).handOver, "no session awaits this return stream")
}

// handTo hands st, a stream of from's whose first frame (body, of type typ) names a
// session, to that session of from's with take; when none takes it (it ended, or never
// was), from gets unavailable with msg.
func (s *Server) handTo(from peer.ID, st network.Stream, body []byte, typ byte, take func(*session, network.Stream) bool, msg string) {
	id, err := decodeSessionFrame(body, typ)
	if err != nil {
		s.protocolError(from, st, err)
		return
	}
	s.mu.Lock()
	ss := s.sessions[sessionKey{head: from, id: id}]
	s.mu.Unlock()
	if ss != nil && take(ss, st) {
		return // the session owns st now
	}
	writeFault(st, stageFault{stage: headStage, code: inference.CodeUnavailable, msg: msg})
	st.Close()
}

// serveOpen admits and runs the session an open frame asks for.
func (s *Server) serveOpen(from peer.ID, up network.Stream, body []byte) {
	o, err := decodeOpen(body)
	if err != nil {
		s.protocolError(from, up, err)
		return
	}
	o.timing = o.timing && !s.untimed
	o.receipts = o.receipts && s.sign != nil
	ss, err := s.admit(from, up, o)
	if err != nil {
		log.Debugw("session refused", "peer", from, "model", o.model, "err", err)
		writeFault(up, faultOf(o.index, err))
		up.Close()
		return
	}
	f := s.run(ss, up)
	s.release(ss, f)
}

// writeFault writes f's error frame on st, within errorWriteTimeout.
func writeFault(st network.Stream, f stageFault) error {
	st.SetWriteDeadline(time.Now().Add(errorWriteTimeout))
	return frame.Write(st, encodeError(f))
}

// admit checks an open against this stage and its limits, and opens the backend session.
// A refusal is a typed error for the previous hop.
func (s *Server) admit(from peer.ID, up network.Stream, o *open) (*session, error) {
	self := o.hops[0]
	switch {
	case self.Peer != s.h.ID():
		return nil, inference.Errorf(inference.CodeInvalidRequest, "open for %s reached %s", self.Peer, s.h.ID())
	case o.index == 0 && o.head != from:
		return nil, inference.Errorf(inference.CodeInvalidRequest, "the first stage must be opened by its head")
	case o.head == s.h.ID():
		return nil, inference.Errorf(inference.CodeInvalidRequest, "a stage cannot be its own chain's head")
	case len(o.hops) > 1 && o.hops[1].Peer == s.h.ID():
		return nil, inference.Errorf(inference.CodeInvalidRequest, "the next hop is this stage")
	}
	shape, err := s.backend.Shape(o.model)
	if err != nil {
		return nil, err
	}
	switch {
	case self.Hi > shape.Layers:
		return nil, inference.Errorf(inference.CodeInvalidRequest, "layers [%d, %d) of a %d-layer model", self.Lo, self.Hi, shape.Layers)
	case o.maxPositions > shape.Context:
		return nil, inference.Errorf(inference.CodeContextOverflow, "%d positions, the model's context is %d", o.maxPositions, shape.Context)
	case shape.Width < 1 || shape.Width > MaxStepBytes/4:
		return nil, inference.Errorf(inference.CodeUnavailable, "model width %d is outside the protocol's bounds", shape.Width)
	}
	ss := newSession(s.ctx, from, o, shape)
	ss.admitted = s.now()
	if o.adopting && !ss.loading {
		return ss, s.adopt(ss, up)
	}
	if err := s.reserve(ss); err != nil {
		return nil, err
	}
	if err := up.Scope().ReserveMemory(ss.upMax, network.ReservationPriorityHigh); err != nil {
		s.unreserve(ss)
		s.refused.Add(1)
		return nil, inference.Errorf(inference.CodeOverloaded, "no memory for the session's %d-byte frames: %v", ss.upMax, err)
	}
	ctx, cancel := context.WithTimeout(ss.ctx, OpenTimeout)
	defer cancel()
	bs, err := s.backend.OpenStage(ctx, o.model, self.Lo, self.Hi, o.maxPositions)
	if err != nil {
		up.Scope().ReleaseMemory(ss.upMax)
		s.unreserve(ss)
		if s.ctx.Err() != nil {
			return nil, inference.Errorf(inference.CodeShuttingDown, "stage is shutting down")
		}
		if inference.CodeOf(err) == inference.CodeOverloaded {
			s.refused.Add(1)
		}
		return nil, err
	}
	ss.backend = bs
	if ss.loading && !s.movable(ss) {
		s.free(ss, up)
		s.release(ss, nil)
		return nil, inference.Errorf(inference.CodeUnavailable, "this stage cannot load a moved session's rows")
	}
	return ss, nil
}

// reserve counts ss against the limits, or refuses it. It is counted before the backend is
// asked, so that opens arriving together cannot pass the limits together.
func (s *Server) reserve(ss *session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	switch {
	case s.closed:
		return inference.Errorf(inference.CodeShuttingDown, "stage is shutting down")
	case s.sessions[ss.key] != nil:
		return inference.Errorf(inference.CodeInvalidRequest, "session already open here")
	case len(s.sessions) >= s.maxTotal:
		err = inference.Errorf(inference.CodeOverloaded, "stage at its limit of %d sessions", s.maxTotal)
	case s.perPeer[ss.from] >= s.maxPeer:
		err = inference.Errorf(inference.CodeOverloaded, "stage at its limit of %d sessions from %s", s.maxPeer, ss.from)
	case s.kvBudget > 0 && s.kvUsed+ss.kv > s.kvBudget:
		err = inference.Errorf(inference.CodeOverloaded, "a %d-byte KV cache does not fit the stage's budget (%d of %d used)", ss.kv, s.kvUsed, s.kvBudget)
	}
	if err != nil {
		s.refused.Add(1)
		return err
	}
	s.sessions[ss.key] = ss
	s.perPeer[ss.from]++
	s.kvUsed += ss.kv
	return nil
}

func (s *Server) unreserve(ss *session) {
	ss.cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, ss.key)
	s.uncount(ss.from, ss.kv)
}

// uncount gives back a session's place in the limits: from's and its KV cache's. s.mu is
// held.
func (s *Server) uncount(from peer.ID, kv int64) {
	if s.perPeer[from]--; s.perPeer[from] <= 0 {
		delete(s.perPeer, from)
	}
	s.kvUsed -= kv
}

// free frees a session whose steps are over: its backend session (the KV cache), its
// frames' memory and its place in the limits, except what the kept table now holds (a
// session kept for a move keeps its backend session and place there). run calls it before
// end passes the end on, so that once the head has the last stage's receipts (or end frame)
// every stage of the chain has its memory back: a verification's next run, opened at once
// on the same nodes, is not refused as overloaded by the session just ended.
func (s *Server) free(ss *session, up network.Stream) {
	up.Scope().ReleaseMemory(ss.upMax)
	if ss.keptAway {
		return
	}
	if err := ss.backend.Close(); err != nil {
		log.Warnw("closing a stage session", "model", ss.open.model, "err", err)
	}
	s.unreserve(ss)
}

// release ends a session run (and free) are done with: a return or load stream handed over
// too late is reset; then the session is reported (f nil: a session refused at admission,
// not reported). A session kept for a move is reported when it is freed, or by the
// session that adopts it.
func (s *Server) release(ss *session, f *failure) {
	ss.mu.Lock()
	ss.ended = true
	if ss.grace != nil {
		ss.grace.Stop()
	}
	ss.mu.Unlock()
	for _, ch := range []chan network.Stream{ss.ret, ss.load} {
		select {
		case st := <-ch:
			st.Reset()
		default:
		}
	}
	if ss.keptAway {
		ss.cancel()
		return
	}
	if s.onEnd != nil && f != nil {
		s.onEnd(s.sessionEnd(ss, f))
	}
}

// sessionEnd describes ss, which ended (end ran) for f.
func (s *Server) sessionEnd(ss *session, f *failure) SessionEnd {
	self := ss.open.hops[0]
	e := SessionEnd{
		Head: ss.open.head, From: ss.from, Index: ss.index, Model: ss.open.model, Lo: self.Lo, Hi: self.Hi,
		Steps: ss.steps, Positions: ss.positions, Session: hex.EncodeToString(ss.key.id[:]),
		Time: ss.endedAt, Duration: ss.endedAt.Sub(ss.admitted), Outcome: OutcomeClosed,
	}
	if f.fault.code != "" {
		e.Outcome, e.Failed = string(f.fault.code), f.fault.stage
	}
	return e
}

// receipt is this stage's signed receipt of ss, which the head closed in order (f), for
// its receipts frame: "" when it cannot sign one (the head then has none of this stage).
func (s *Server) receipt(ss *session, f *failure) string {
	r, err := s.sign(s.sessionEnd(ss, f))
	if err == nil && len(r) > MaxReceipt {
		err = fmt.Errorf("%d bytes, over the protocol's %d", len(r), MaxReceipt)
	}
	if err != nil {
		log.Warnw("stage receipt not signed; the head gets none", "peer", ss.open.head, "model", ss.open.model, "err", err)
		return ""
	}
	return r
}

// faultOf is err as a fault of stage: its code and its message (the *inference.Error's
// message, without the code that the frame carries apart).
func faultOf(stage int, err error) stageFault {
	msg := err.Error()
	if e, ok := errors.AsType[*inference.Error](err); ok {
		msg = e.Message
	}
	return stageFault{stage: stage, code: inference.CodeOf(err), msg: msg}
}
