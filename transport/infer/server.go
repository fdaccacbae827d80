package infer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
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

var log = logging.Logger("transport/infer")

// Generator is what the server needs of a backend.
type Generator interface {
	Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error)
}

// Admission is consulted before a request is accepted; a non-nil error (typically a
// policy_paused *inference.Error) is sent to the client as the terminal frame.
type Admission func(from peer.ID) error

// ServerStats counts what the server did.
type ServerStats struct {
	InFlight           int64  `json:"in_flight"`
	Capacity           int    `json:"capacity"`            // the node-wide in-flight limit
	Served             uint64 `json:"served"`              // ended with a done frame
	Failed             uint64 `json:"failed"`              // ended with an error frame
	Overloaded         uint64 `json:"overloaded"`          // refused by the in-flight limits
	ClientDisconnected uint64 `json:"client_disconnected"` // the client reset before the end
	ProtocolErrors     uint64 `json:"protocol_errors"`     // bad or missing request frame, a broken transfer
	Moved              uint64 `json:"moved"`               // ended with a moved frame (handed over)
}

// Outcomes of a ServedTask besides the error codes of inference.
const (
	// OutcomeCompleted: the done frame was written.
	OutcomeCompleted = "completed"
	// OutcomeClientDisconnected: the client reset or closed the stream, or stopped reading,
	// before the terminal frame was written.
	OutcomeClientDisconnected = "client_disconnected"
	// OutcomeMoved: the generation was handed over (HandOver): its KV cache went to the
	// client in kv frames and the moved frame was written.
	OutcomeMoved = "moved"
)

// ServedTask describes one request the server admitted and ran, for WithOnServed. It carries
// no prompt or output content.
type ServedTask struct {
	From  peer.ID // the requesting peer
	Model string  // the model requested
	// PromptTokens and CompletionTokens come from the result's usage when the task
	// completed. Otherwise the prompt was never counted back (the backend reports usage only
	// on success): PromptTokens is 0 and CompletionTokens counts the tokens written to the
	// client before the end (those of a write that failed not included).
	PromptTokens, CompletionTokens int
	Duration                       time.Duration          // from admission to the terminal frame or reset (with a receipt: to the generation's end)
	Outcome                        string                 // OutcomeCompleted, OutcomeMoved, OutcomeClientDisconnected or an inference error code
	FinishReason                   inference.FinishReason // of a completed task
	// Receipt is the signed receipt sent in the done frame, when the client asked for one
	// and the Signer made it; End and Output are the values it was signed over.
	Receipt string
	End     time.Time        // when the generation completed (set with a receipt)
	Output  inference.Digest // digest of the tokens sent (set with a receipt)
}

// Signer makes the receipt of a completed task whose client asked for one (a request frame
// of type 0x05): t has From, Model, the usage's tokens, Duration and End (both as of the
// generation's end), Outcome OutcomeCompleted, and Output, the digest of the tokens written.
// The string goes into the done frame as inference.Result.Receipt; it must stay well under
// MaxTerminalFrame. An error sends the done frame without a receipt.
type Signer func(t ServedTask) (string, error)

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithMaxInFlight sets the node-wide and per-peer in-flight limits.
func WithMaxInFlight(total, perPeer int) ServerOption {
	return func(s *Server) { s.maxTotal, s.maxPeer = total, perPeer }
}

// WithAdmission sets a policy consulted before each request.
func WithAdmission(a Admission) ServerOption { return func(s *Server) { s.admit = a } }

// WithLimits sets the request limits checked before generation.
func WithLimits(l inference.Limits) ServerOption { return func(s *Server) { s.limits = l } }

// WithOnServed sets a function called once for every request that was admitted and ran:
// completed, failed with a typed error (the backend's, a timeout, shutting down) or ended by
// the client. Requests refused before running (a protocol error, invalid or over the limits,
// refused by admission, overloaded) are not reported, nor are resumptions that ended before
// their go frame (no generation ran). It is called on the request's handler
// goroutine after the terminal frame was written or the stream reset, and after the request's
// in-flight slot was released; Close waits for running calls. It should return promptly (a
// file append and sync is fine): the handler's goroutine waits for it.
func WithOnServed(fn func(ServedTask)) ServerOption { return func(s *Server) { s.onServed = fn } }

// WithSigner sets the Signer of receipts that clients ask for. Without one, no receipt is
// sent.
func WithSigner(fn Signer) ServerOption { return func(s *Server) { s.sign = fn } }

// WithServerObserver records each requester that sends a malformed frame or breaks the protocol
// in o, as reputation.MalformedFrame or ProtocolViolation.
func WithServerObserver(o Observer) ServerOption { return func(s *Server) { s.observer = o } }

// WithServerTransfers sets a function told of each request frame read (from a libp2p
// stream or a data channel) and of each kv frame of a resumption of at least
// bandwidth.MinBytes, timed from its first byte to its last (internal/bandwidth: the caller
// keeps those that are samples, requests of at least 64 KiB). The token stream going back
// is no transfer to time: the model paces it. It runs on the request's handler goroutine
// and should return at once.
func WithServerTransfers(fn func(from peer.ID, t bandwidth.Transfer)) ServerOption {
	return func(s *Server) { s.transfers = fn }
}

// WithSessionIdle sets how long a reused stream (ReuseID) waits for its next request
// (DefaultSessionIdle).
func WithSessionIdle(d time.Duration) ServerOption { return func(s *Server) { s.sessionIdle = d } }

// Server answers /meshinfer/infer/1.0.0 and 1.1.0 with a Generator.
type Server struct {
	h           host.Host
	gen         Generator
	admit       Admission
	limits      inference.Limits
	onServed    func(ServedTask)
	sign        Signer
	maxTotal    int
	maxPeer     int
	sessionIdle time.Duration
	transfers   func(peer.ID, bandwidth.Transfer)

	ctx    context.Context // cancelled by Close: every generation ends
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per stream being handled
	closed atomic.Bool

	served, failed, overloaded, disconnected, protoErrs, moved atomic.Uint64
	observer                                                   Observer

	mu      sync.Mutex
	total   int
	perPeer map[peer.ID]int
	moves   map[*inference.Move]struct{} // of the running generations whose client takes a handover
}

// NewServer registers the handlers of ID and ReuseID on h. Close removes them and ends every
// generation.
func NewServer(h host.Host, gen Generator, opts ...ServerOption) *Server {
	s := newServer(gen, opts...)
	s.h = h
	h.SetStreamHandler(ID, s.handle)
	h.SetStreamHandler(ReuseID, s.handleSession)
	return s
}

// newServer is a Server without a host: it serves only the streams handed to ServeStream
// and ServeRequest (tests on virtual time, where no libp2p host can run).
func newServer(gen Generator, opts ...ServerOption) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		gen: gen, maxTotal: DefaultMaxInFlight, maxPeer: DefaultMaxInFlightPerPeer,
		sessionIdle: DefaultSessionIdle, ctx: ctx, cancel: cancel, perPeer: make(map[peer.ID]int),
		moves: make(map[*inference.Move]struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Close stops accepting requests, cancels the running ones and waits for their handlers.
// Idempotent.
func (s *Server) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	if s.h != nil {
		s.h.RemoveStreamHandler(ID)
		s.h.RemoveStreamHandler(ReuseID)
	}
	s.cancel()
	s.wg.Wait()
	return nil
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() ServerStats {
	s.mu.Lock()
	inFlight := s.total
	s.mu.Unlock()
	return ServerStats{
		InFlight: int64(inFlight), Capacity: s.maxTotal, Served: s.served.Load(), Failed: s.failed.Load(),
		Overloaded: s.overloaded.Load(), ClientDisconnected: s.disconnected.Load(),
		ProtocolErrors: s.protoErrs.Load(), Moved: s.moved.Load(),
	}
}

func (s *Server) acquire(p peer.ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total >= s.maxTotal || s.perPeer[p] >= s.maxPeer {
		return false
	}
	s.total++
	s.perPeer[p]++
	return true
}

func (s *Server) release(p peer.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.perPeer[p]--; s.perPeer[p] <= 0 {
		delete(s.perPeer, p)
	}
}

// maxTrailingBytes bounds what the server reads (and discards) after the request: a client
// should send nothing, so a little slack is plenty.
const maxTrailingBytes = 1 << 10

// handle serves a libp2p stream.
func (s *Server) handle(st network.Stream) { s.ServeStream(st.Conn().RemotePeer(), st) }

// ServeStream answers one request on st, a stream from peer from opened over another
// transport than libp2p (a WebRTC data channel), with the same rules, limits and admission
// as a libp2p stream. It returns when the exchange has ended; st is closed or reset then.
func (s *Server) ServeStream(from peer.ID, st Stream) {
	if s.closed.Load() {
		st.Reset()
		return
	}
	s.wg.Add(1)
	defer s.wg.Done()

	// Deadline first: the request frame must arrive within RequestTimeout.
	if err := st.SetReadDeadline(time.Now().Add(RequestTimeout)); err != nil {
		st.Reset()
		return
	}
	m := bandwidth.NewMeter(st)
	in := &inbound{r: bufio.NewReader(m), m: m}
	body, err := frame.NewReader(in.r, MaxRequestFrame).Next()
	s.transferred(from, m, err)
	req, o, ok, err := s.readRequest(from, st, body, err)
	if ok {
		s.run(from, st, req, o, err, nil, in)
	}
}

// inbound is how a request's handler reads its stream: a resumption's transfer phase reads
// its kv and go frames from where the request frame's reader stopped.
type inbound struct {
	r *bufio.Reader    // the stream, buffered
	m *bandwidth.Meter // beneath r: times each frame
}

// readRequest decodes a request frame read with readErr. A missing or broken frame, or one
// that is not a request, is a protocol error: counted, st reset, ok false. A request whose
// content does not decode comes back with its error, for run to answer.
func (s *Server) readRequest(from peer.ID, st Stream, body []byte, readErr error) (req *inference.Request, o requestOpts, ok bool, err error) {
	err = readErr
	if err == nil {
		if req, o, err = decodeRequest(body); !errors.Is(err, errProtocol) {
			return req, o, true, err
		}
	}
	s.violated(from, st, err)
	return nil, o, false, nil
}

// violated counts and records a client's protocol violation (or a missing frame) and resets
// st.
func (s *Server) violated(from peer.ID, st Stream, err error) {
	s.protoErrs.Add(1)
	log.Debugw("protocol violation", "peer", from, "err", err)
	observe(s.observer, from, err)
	st.Reset()
}

// transferred tells WithServerTransfers' function of the request frame just read through
// m, when it was read whole (readErr nil), and starts m's next transfer.
func (s *Server) transferred(from peer.ID, m *bandwidth.Meter, readErr error) {
	t := m.Take()
	if s.transfers != nil && readErr == nil {
		s.transfers(from, t)
	}
}

// session is one request's part of a reused stream (ReuseID): the stream's handler reads
// the stream while the request runs, so it watches for the client's end in place of
// serve's watcher, and the stream stays open after the terminal frame.
type session struct {
	ctx context.Context // cancelled when the client ends or breaks the stream first
	// terminal is set just before the terminal frame is written: a frame read after that
	// is the client's next request, before it a protocol violation.
	terminal atomic.Bool
}

// handleSession serves a ReuseID stream: requests one after another, each answered as on
// ID, until the client closes its side, a request breaks the stream, or none comes within
// the session idle time (the stream is then closed).
func (s *Server) handleSession(st network.Stream) {
	if s.closed.Load() {
		st.Reset()
		return
	}
	s.wg.Add(1)
	defer s.wg.Done()
	from := st.Conn().RemotePeer()
	// Close ends an idle wait at once (a running request ends with its shutting_down frame).
	stop := context.AfterFunc(s.ctx, func() { st.SetReadDeadline(time.Now().Add(-time.Hour)) })
	defer stop()

	m := bandwidth.NewMeter(st)
	br := bufio.NewReader(m)
	r := frame.NewReader(br, MaxRequestFrame)
	if err := st.SetReadDeadline(time.Now().Add(RequestTimeout)); err != nil {
		st.Reset()
		return
	}
	body, err := r.Next()
	for first := true; ; first = false {
		s.transferred(from, m, err)
		switch {
		case err == nil && s.ctx.Err() != nil:
			st.Reset()
			return
		case err != nil && !first && (errors.Is(err, io.EOF) || isTimeout(err)):
			// The client is done with the stream, it stayed idle, or the server closes.
			st.Close()
			return
		}
		req, o, ok, derr := s.readRequest(from, st, body, err)
		if !ok {
			return
		}
		if o.resume {
			// A resumption reads the stream itself until its go frame, and ends the stream
			// with its answer, as on ID: its client never reuses it.
			st.SetReadDeadline(time.Time{})
			s.run(from, st, req, o, derr, nil, &inbound{r: br, m: m})
			return
		}
		ctx, cancel := context.WithCancel(s.ctx)
		sess := &session{ctx: ctx}
		st.SetReadDeadline(time.Time{})
		usable := make(chan bool, 1)
		go func() {
			usable <- s.run(from, st, req, o, derr, sess, nil).Outcome != OutcomeClientDisconnected
		}()
		// Read on: the next request once the terminal frame is out, else the client's end
		// (or a frame it should not have sent yet), which cancels the request.
		body, err = r.Next()
		early := !sess.terminal.Load()
		if early {
			cancel()
		}
		ok = <-usable
		cancel()
		if early && err == nil {
			s.protoErrs.Add(1)
			observe(s.observer, from, fmt.Errorf("%w: a frame before the terminal frame", errProtocol))
			st.Reset()
			return
		}
		if !ok {
			return // reset by run
		}
	}
}

// ServeRequest answers req, which peer from sent by another way than st (a coordinator that
// relayed a thin client's WebRTC set-up: the client's data channel carries the answer
// only), on st with the same rules, limits and admission as a request read from a stream.
// It returns the served task (its receipt, when wantReceipt and the task completed) once
// the exchange has ended; st is closed or reset then. A request refused before running
// (closing, invalid, not admitted, overloaded) gets its error frame on st and a task whose
// Outcome is the error's code.
func (s *Server) ServeRequest(from peer.ID, req *inference.Request, wantReceipt bool, st Stream) ServedTask {
	if s.closed.Load() {
		st.Reset()
		return ServedTask{From: from, Model: req.Model, Outcome: string(inference.CodeShuttingDown)}
	}
	s.wg.Add(1)
	defer s.wg.Done()
	return s.run(from, st, req, requestOpts{receipt: wantReceipt}, nil, nil, nil)
}

// run checks, admits and serves a decoded request (decodeErr: why it could not be decoded)
// and reports the task. A resumption (o.resume) reads its transfer phase from in first.
func (s *Server) run(from peer.ID, st Stream, req *inference.Request, o requestOpts, decodeErr error, sess *session, in *inbound) ServedTask {
	err := decodeErr
	var resumer inference.Resumer
	if err == nil && o.resume {
		var ok bool
		if resumer, ok = s.gen.(inference.Resumer); !ok || in == nil {
			err = inference.Errorf(inference.CodeUnavailable, "this node cannot resume a generation")
		}
	}
	if err == nil {
		err = req.Validate(s.limits)
	}
	if err == nil && s.admit != nil {
		err = s.admit(from)
	}
	if err == nil && !s.acquire(from) {
		s.overloaded.Add(1)
		err = inference.Errorf(inference.CodeOverloaded, "node at its limit of concurrent requests")
	}
	if err != nil {
		refused := ServedTask{From: from, Outcome: s.finish(st, nil, nil, err, sess)}
		if req != nil {
			refused.Model = req.Model
		}
		return refused
	}
	began := time.Now()
	w := &answerWriter{st: st, stream: req.Stream, lastWrite: began}
	var signer Signer
	if o.receipt && s.sign != nil {
		signer, w.digest = s.sign, inference.NewDigester()
	}
	var rs inference.Resumption
	// end frees what the request held: its cache (before its slot, which counts it), its
	// handover, its slot.
	end := func() {
		if rs != nil {
			rs.Close()
		}
		if req.Move != nil {
			s.track(req.Move, false)
		}
		s.release(from)
	}
	if o.handover {
		req.Move = &inference.Move{Send: w.kv}
		s.track(req.Move, true)
	}
	generate := func(ctx context.Context, emit func(inference.Token) error) (inference.Result, error) {
		return s.gen.Generate(ctx, req, emit)
	}
	if o.resume {
		var (
			replay  []int
			outcome string
			ok      bool
		)
		if rs, replay, outcome, ok = s.transfer(from, st, req, resumer, in); !ok {
			end()
			return ServedTask{From: from, Model: req.Model, Outcome: outcome}
		}
		generate = func(ctx context.Context, emit func(inference.Token) error) (inference.Result, error) {
			return rs.Generate(ctx, replay, emit)
		}
	}
	task := s.serve(st, from, req, began, signer, sess, w, generate)
	task.From, task.Model = from, req.Model
	if task.Receipt == "" {
		task.Duration = time.Since(began)
	}
	end()
	if s.onServed != nil {
		s.onServed(task)
	}
	return task
}

// serve runs an admitted request's generation (generate) to its terminal frame, writing its
// answer with w, and reports its outcome and tokens. With a signer, a completed request's
// done frame carries the receipt it makes.
func (s *Server) serve(st Stream, from peer.ID, req *inference.Request, began time.Time, sign Signer, sess *session, w *answerWriter,
	generate func(context.Context, func(inference.Token) error) (inference.Result, error)) ServedTask {
	parent := s.ctx
	if sess != nil {
		parent = sess.ctx // cancelled by the stream's handler, which watches the stream
	}
	ctx, cancel := context.WithTimeout(parent, maxGeneration)
	defer cancel()
	if sess == nil {
		// The client sends nothing after the request (after a resumption's go frame) and
		// keeps its write side open until the terminal frame; its end (EOF or reset) before
		// then means it gave up. Watching the read side turns that into a cancellation at
		// once, even while the backend is loading and nothing is being written.
		st.SetReadDeadline(time.Time{})
		clientGone := make(chan struct{})
		go func() { // exits when the read side ends: the client's EOF or reset, or finish's Close/Reset
			defer close(clientGone)
			io.Copy(io.Discard, io.LimitReader(st, maxTrailingBytes))
			cancel()
		}()
		defer func() { <-clientGone }()
	}

	res, err := generate(ctx, w.token)
	var moved *inference.Moved
	switch {
	case errors.As(err, &moved) && req.Move != nil:
		// What this side wrote, whatever the backend counted: the client checks these.
		err = &inference.Moved{Positions: w.positions, Tokens: w.sent + w.queued}
	case moved != nil:
		err = inference.Errorf(inference.CodeUnavailable, "the backend moved a generation not asked to move")
	case s.ctx.Err() != nil && err != nil:
		err = inference.Errorf(inference.CodeShuttingDown, "node is shutting down")
	}
	res.Receipt = "" // only the signer below makes one
	var task ServedTask
	if err == nil && sign != nil {
		task = ServedTask{
			From: from, Model: req.Model, Outcome: OutcomeCompleted,
			PromptTokens: res.Usage.PromptTokens, CompletionTokens: res.Usage.CompletionTokens,
			End: time.Now(), Output: w.digest.Sum(),
		}
		task.Duration = task.End.Sub(began)
		if rcpt, serr := sign(task); serr != nil {
			log.Warnw("receipt not signed; the done frame goes without it", "peer", from, "err", serr)
		} else {
			task.Receipt, res.Receipt = rcpt, rcpt
		}
	}
	task.Outcome = s.finish(st, w.pending, &res, err, sess)
	switch task.Outcome {
	case OutcomeCompleted:
		task.FinishReason = res.FinishReason
		task.PromptTokens, task.CompletionTokens = res.Usage.PromptTokens, res.Usage.CompletionTokens
	case OutcomeClientDisconnected: // the last batch was not written
		task.CompletionTokens = w.sent
	default: // the last batch went out with the terminal frame
		task.CompletionTokens = w.sent + w.queued
	}
	return task
}

// answerWriter writes an admitted request's answer frames in the order they are produced:
// its token frames and, when the server hands the generation over, its kv frames (Send of
// its Move). A streaming request (stream true) gets each token frame written as it is
// produced. A non-streaming one is answered only once complete, so its token frames are
// batched and go out with the terminal frame in one write (one muxer frame, one syscall,
// one wake-up at the client instead of one per token); a batch is still written once it
// reaches batchBytes or batchDelay has passed since the last write, so that a long
// completion is not held back and the client's inter-token timer sees gaps at most
// batchDelay longer than the backend's, and before a kv frame, which goes out at once. It
// is used on the generation's goroutine only.
type answerWriter struct {
	st           Stream
	stream       bool   // the request's stream: each token frame is written at once
	pending      []byte // frames not written yet
	lastWrite    time.Time
	sent, queued int                 // tokens written to the client; tokens in pending
	positions    int                 // KV positions written to the client
	digest       *inference.Digester // of the tokens, for a receipt (nil without one)
}

// token queues t's frame and writes what is pending unless it may be batched.
func (w *answerWriter) token(t inference.Token) error {
	if w.digest != nil {
		w.digest.Add(t)
	}
	w.pending = frame.Append(w.pending, encodeToken(nil, t))
	w.queued++
	if !w.stream && len(w.pending) < batchBytes && time.Since(w.lastWrite) < batchDelay {
		return nil
	}
	return w.flush()
}

// kv is a handover's Move.Send: it writes r's kv frame at once, after the tokens produced
// before it. Rows out of order or past a frame's bound are the backend's error.
func (w *answerWriter) kv(r inference.KVRows) error {
	if err := checkKV(r); err != nil {
		return inference.Errorf(inference.CodeUnavailable, "handover: %v", err)
	}
	if r.Pos != w.positions {
		return inference.Errorf(inference.CodeUnavailable, "handover: KV rows at %d, want %d", r.Pos, w.positions)
	}
	w.pending = appendKVFrame(w.pending, r)
	if err := w.flush(); err != nil {
		return err
	}
	w.positions += r.N
	return nil
}

// flush writes the pending frames.
func (w *answerWriter) flush() error {
	w.st.SetWriteDeadline(time.Now().Add(WriteTimeout))
	_, err := w.st.Write(w.pending)
	if err == nil {
		w.sent += w.queued
	}
	w.pending, w.lastWrite, w.queued = w.pending[:0], time.Now(), 0
	return err
}

// Batching of a non-streaming request's token frames (see serve).
const (
	batchBytes = 16 << 10
	batchDelay = 100 * time.Millisecond
)

// finish writes the frames still pending and the terminal frame (done; moved when err is
// *inference.Moved; else error), and closes the stream, or resets it when the client is
// gone. On a reused stream (sess) it leaves the stream open and gives the handler's read the
// session idle time. It returns the outcome: OutcomeCompleted, OutcomeMoved, the code of
// err, or OutcomeClientDisconnected.
func (s *Server) finish(st Stream, pending []byte, res *inference.Result, err error, sess *session) string {
	var body []byte
	var moved *inference.Moved
	switch {
	case err == nil:
		body = encodeDone(*res)
	case errors.Is(err, context.Canceled) && s.ctx.Err() == nil:
		// Cancelled by the read-side watcher: the client reset the stream.
		s.disconnected.Add(1)
		st.Reset()
		return OutcomeClientDisconnected
	case errors.As(err, &moved):
		body = encodeMoved(moved)
	default:
		body = encodeError(err)
	}
	if sess != nil {
		sess.terminal.Store(true)
	}
	st.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if _, werr := st.Write(frame.Append(pending, body)); werr != nil {
		// The write failed: the client reset or stopped reading.
		s.disconnected.Add(1)
		st.Reset()
		return OutcomeClientDisconnected
	}
	outcome := OutcomeCompleted
	switch {
	case err == nil:
		s.served.Add(1)
	case moved != nil:
		s.moved.Add(1)
		outcome = OutcomeMoved
	default:
		s.failed.Add(1)
		outcome = string(inference.CodeOf(err))
	}
	if sess != nil {
		st.SetReadDeadline(time.Now().Add(s.sessionIdle))
		if s.ctx.Err() != nil { // closing: the handler's read ends now, not after the idle time
			st.SetReadDeadline(time.Now().Add(-time.Hour))
		}
		return outcome
	}
	st.Close()
	return outcome
}
