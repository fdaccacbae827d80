package stage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// PipelineOption configures a Pipeline.
type PipelineOption func(*pipelineConfig)

type pipelineConfig struct {
	stepTimeout   time.Duration // a step of several positions
	decodeTimeout time.Duration // a step of one
	maxBatch      int
	observer      Observer
	transfers     func(peer.ID, bandwidth.Transfer)
	check         func(Part, string) error
	moves         Replacer
}

// WithStepTimeouts bounds each step at the head, from sending its hidden states to stage 0
// to the last stage's output: prefill bounds a step of several positions
// (DefaultStepTimeout), decode a step of one (DefaultDecodeStepTimeout). A step past its
// bound fails with timeout, and the pipeline with it. A zero or negative value keeps that
// default.
func WithStepTimeouts(prefill, decode time.Duration) PipelineOption {
	return func(c *pipelineConfig) {
		if prefill > 0 {
			c.stepTimeout = prefill
		}
		if decode > 0 {
			c.decodeTimeout = decode
		}
	}
}

// WithMaxBatch bounds the positions the head sends in one step: Forward sends more as
// several steps, one after another. The default is as many as the protocol allows
// (MaxStepBytes of hidden states), so that a prefill goes as one step where it fits. The
// stages bound their frames by it.
func WithMaxBatch(n int) PipelineOption { return func(c *pipelineConfig) { c.maxBatch = n } }

// WithPipelineObserver records each stage that sends the head a malformed frame or breaks
// the protocol in o, as reputation.MalformedFrame or ProtocolViolation.
func WithPipelineObserver(o Observer) PipelineOption {
	return func(c *pipelineConfig) { c.observer = o }
}

// WithPipelineTransfers sets a function told of each step's output the head read from the
// last stage, timed from its first byte to its last (internal/bandwidth: the caller keeps
// those that are samples, prefill steps of at least 64 KiB). It runs in Forward and should
// return at once.
func WithPipelineTransfers(fn func(from peer.ID, t bandwidth.Transfer)) PipelineOption {
	return func(c *pipelineConfig) { c.transfers = fn }
}

// WithReceipts asks the stages for their signed receipts of the session (a receipted
// session), which come back when Close ends it in order. check tells whether receipt is
// the stage's signed record of part (mesh/receipts' CheckStage, as the node wires it); a
// receipt it refuses is dropped and recorded against its stage in the observer as a
// protocol violation. Receipts returns those that hold.
func WithReceipts(check func(part Part, receipt string) error) PipelineOption {
	return func(c *pipelineConfig) { c.check = check }
}

// Part is a stage's part of a pipeline's session as the head knows it: what the stage's
// receipt must state.
type Part struct {
	Session string  // the session's ID, 32 lowercase hex digits
	Head    peer.ID // the head: the receipt is made out to it
	Model   string
	Index   int // the stage's place in the chain
	Stage   Hop // the stage's peer, the signer, and its layers
	// Steps and Positions are those the session ran: every stage runs each step.
	Steps, Positions int
}

// Pipeline is the head's side of a chain of stages: Forward sends a step's hidden states to
// stage 0 and returns what the last stage sends back. It is one generation's: its stages
// hold that generation's KV cache. Forward calls run one at a time.
type Pipeline struct {
	h             host.Host
	stages        []Hop
	head          peer.ID
	model         string
	session       [sessionIDLen]byte
	width         int
	maxPos        int
	batch         int           // positions per step
	stepTimeout   time.Duration // bounds a step of several positions
	decodeTimeout time.Duration // bounds a step of one
	observer      Observer
	transfers     func(peer.ID, bandwidth.Transfer)
	askBatch      int      // the batch bound the open asked for
	moves         Replacer // WithMoves; nil: no stage is moved

	// The chain's streams: replaced under mu when a move re-links the chain (the
	// Forward that holds busy), read under mu by fail and Close.
	up      network.Stream   // to stage 0: hidden frames out, error frames back
	ret     network.Stream   // from the last stage: its output, or an error frame
	retM    *bandwidth.Meter // under retR: times each step's output
	retR    *frame.Reader
	watched chan struct{} // closed when the watcher of up has returned

	// timed: every stage reports its layers' time in each step (stage 0 answered the open
	// with the timed flag), so the output comes in timed frames.
	timed bool
	// receipted: every stage sends its receipt at the end (stage 0 answered the open with
	// the receipts flag), checked by check.
	receipted bool
	check     func(Part, string) error
	// movable: every stage passes leaving notices on and can keep and move its session
	// (stage 0 answered the open with the moves flag). relinking tells the watcher that
	// the chain's end it reads is a keep end, not a failure.
	movable   bool
	relinking atomic.Bool

	busy atomic.Bool // a Forward is running
	// Owned by the Forward that holds busy.
	step      uint64
	positions int
	buf       []byte
	leaving   int    // the first stage that said it is leaving, -1 none
	seen      uint64 // the stages whose leaving notices came, a bit per index

	mu     sync.Mutex
	err    error // why no step can run: the pipeline broke, or was closed; nil while usable
	closed bool  // Close ended it while it was usable
	stats  Stats // the steps run, under mu (Forward writes, Stats reads)
	// receipts are the stages' receipts that held, set by an orderly Close of a receipted
	// session.
	receipts []string
	moved    []Move // the stages moved, in order
}

// Stats is what a pipeline's steps took, as its head measured them and its stages reported
// them.
type Stats struct {
	// Steps and Positions are those run to the end (a Forward of more positions than the
	// batch is several steps).
	Steps, Positions int
	// RoundTrip is the time of those steps at the head, from sending a step's hidden states
	// to stage 0 to reading the last stage's output: the stages' layers, the step's
	// crossings (head → stage 0, stage to stage, last stage → head) and each side's framing.
	RoundTrip time.Duration
	// Forward is, for each stage in chain order, the time its layers took in those steps,
	// as the stage reported it (a stage can misreport). Nil when the chain does not report
	// times: one of its stages predates timed sessions.
	Forward []time.Duration
	// Err is why the pipeline broke, when it did before Close; nil while it is usable and
	// after an orderly Close.
	Err error
}

var _ inference.Layers = (*Pipeline)(nil).Forward

// Open sets up a chain: a session of model's layers on each of stages, in order, for up to
// maxPositions positions. The head (h) opens stage 0, which opens stage 1 and so on, each
// answering once the rest of the chain behind it is set up; then the head opens its return
// stream to the last stage. The stages' ranges must cover contiguous layers; together they
// need not start at 0 or end at the last layer (the head may run some itself).
//
// Errors are *inference.Error wrapping a *FailedStage when a stage caused them:
// invalid_request for a bad chain, unavailable when a stage cannot be reached, overloaded
// when one refuses the session, model_not_found, context_overflow past a model's context,
// timeout when the chain does not answer within OpenTimeout, peer_lost when a stage goes
// away or breaks the protocol. A cancelled ctx gives its error.
//
// The caller must Close the pipeline when the generation ends; until then its stages hold
// the session (a stage frees an idle one after its session idle time).
func Open(ctx context.Context, h host.Host, model string, stages []Hop, maxPositions int, opts ...PipelineOption) (*Pipeline, error) {
	cfg := pipelineConfig{stepTimeout: DefaultStepTimeout, decodeTimeout: DefaultDecodeStepTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	batch := cfg.maxBatch
	if batch <= 0 || batch > maxPositions {
		batch = maxPositions
	}
	o := &open{head: h.ID(), model: model, maxPositions: maxPositions, maxBatch: batch, hops: stages, timing: true,
		receipts: cfg.check != nil, moves: cfg.moves != nil}
	rand.Read(o.session[:])
	for _, hop := range stages {
		o.addrs = append(o.addrs, dialable(h.Peerstore().Addrs(hop.Peer)))
	}
	body := encodeOpen(o)
	if err := checkChain(h, o, body); err != nil {
		return nil, err
	}
	p := &Pipeline{
		h: h, askBatch: batch, moves: cfg.moves, leaving: -1,
		stages: append([]Hop(nil), stages...), head: h.ID(), model: model, session: o.session,
		maxPos: maxPositions, stepTimeout: cfg.stepTimeout, decodeTimeout: cfg.decodeTimeout,
		observer: cfg.observer, check: cfg.check, transfers: cfg.transfers, watched: make(chan struct{}),
	}
	octx, cancel := context.WithTimeout(ctx, OpenTimeout)
	defer cancel()
	upR, err := p.open(octx, h, o, body, batch)
	if err != nil {
		// A chain set up in part frees itself: each stage sees its previous hop's reset.
		p.resetStreams()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("open pipeline: %w", ctx.Err())
		}
		return nil, err
	}
	p.startWatch(upR, p.watched)
	return p, nil
}

// startWatch starts the watcher of the chain's stream to stage 0, which closes watched
// when it returns: when up's read fails, the pipeline's failure, a re-link or Close having
// reset or closed it.
func (p *Pipeline) startWatch(upR *frame.Reader, watched chan struct{}) {
	go func() {
		defer close(watched)
		p.watch(upR)
	}()
}

// streams returns the chain's streams now.
func (p *Pipeline) streams() (up, ret network.Stream) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.up, p.ret
}

// resetStreams resets the chain's streams, those that are open.
func (p *Pipeline) resetStreams() {
	up, ret := p.streams()
	if up != nil {
		up.Reset()
	}
	if ret != nil {
		ret.Reset()
	}
}

// dialable is addrs cut to what an open frame carries.
func dialable(addrs []ma.Multiaddr) []ma.Multiaddr {
	var out []ma.Multiaddr
	for _, a := range addrs {
		if len(out) < MaxAddrsPerHop && len(a.String()) <= maxAddrLen {
			out = append(out, a)
		}
	}
	return out
}

// checkChain checks a chain as its stages will (the open frame decodes), and what only the
// head can: that it is no stage of its own chain and no stage follows itself.
func checkChain(h host.Host, o *open, body []byte) error {
	if len(body) > MaxOpenFrame {
		return inference.Errorf(inference.CodeInvalidRequest, "a chain of %d stages does not fit an open frame", len(o.hops))
	}
	if _, err := decodeOpen(body); err != nil {
		return inference.Errorf(inference.CodeInvalidRequest, "chain: %v", err)
	}
	for i, hop := range o.hops {
		if hop.Peer == h.ID() {
			return inference.Errorf(inference.CodeInvalidRequest, "stage %d is the head itself", i)
		}
		if i > 0 && hop.Peer == o.hops[i-1].Peer {
			return inference.Errorf(inference.CodeInvalidRequest, "stage %d follows itself", i)
		}
	}
	return nil
}

// open opens stage 0's session (and through it the chain's), then the return stream from
// the last stage. It returns up's reader, for the watcher.
func (p *Pipeline) open(ctx context.Context, h host.Host, o *open, body []byte, batch int) (*frame.Reader, error) {
	last := len(p.stages) - 1
	deadline := time.Now().Add(OpenTimeout)
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	}
	up, err := h.NewStream(ctx, p.stages[0].Peer, ID)
	if err != nil {
		return nil, p.unreachable(ctx, 0, err)
	}
	p.mu.Lock()
	p.up = up
	p.mu.Unlock()
	stopUp := context.AfterFunc(ctx, func() { up.Reset() }) // until the chain is set up
	defer stopUp()
	if err := up.Scope().SetService(ServiceName); err != nil {
		return nil, inference.Errorf(inference.CodeOverloaded, "head: %v", err)
	}
	up.SetDeadline(deadline)
	if err := frame.Write(up, body); err != nil {
		return nil, p.lost(0, "send open", err)
	}
	upR := frame.NewReader(up, MaxErrorFrame)
	width, flags, err := p.answer(ctx, upR, 0, o.asked())
	if err != nil {
		return nil, err
	}
	p.width, p.batch = width, maxBatch(width, o.maxPositions, batch)
	p.timed, p.receipted, p.movable = flags&flagTimed != 0, flags&flagReceipts != 0, flags&flagMoves != 0

	ret, err := h.NewStream(ctx, p.stages[last].Peer, ID)
	if err != nil {
		return nil, p.unreachable(ctx, last, err)
	}
	p.mu.Lock()
	p.ret = ret
	p.mu.Unlock()
	stopRet := context.AfterFunc(ctx, func() { ret.Reset() })
	defer stopRet()
	if err := ret.Scope().SetService(ServiceName); err != nil {
		return nil, inference.Errorf(inference.CodeOverloaded, "head: %v", err)
	}
	frameMax := stepFrameMax(width, p.batch)
	if p.receipted {
		frameMax = max(frameMax, receiptsFrameMax(len(p.stages)))
	}
	if err := ret.Scope().ReserveMemory(frameMax, network.ReservationPriorityHigh); err != nil {
		return nil, inference.Errorf(inference.CodeOverloaded, "head: no memory for %d-byte frames: %v", frameMax, err)
	}
	ret.SetDeadline(deadline)
	if err := frame.Write(ret, encodeAttach(o.session)); err != nil {
		return nil, p.lost(last, "attach", err)
	}
	p.retM = bandwidth.NewMeter(ret)
	p.retR = frame.NewReader(p.retM, max(frameMax, MaxErrorFrame))
	w, _, err := p.answer(ctx, p.retR, last, 0)
	if err != nil {
		return nil, err
	}
	if w != width {
		return nil, p.stageErr(inference.CodeUnavailable, last, "model width %d, stage 0's is %d", w, width)
	}
	if !stopUp() || !stopRet() {
		return nil, ctx.Err()
	}
	up.SetDeadline(time.Time{})
	ret.SetDeadline(time.Time{})
	if p.timed {
		p.mu.Lock()
		p.stats.Forward = timesAfter(p.stats.Forward, len(p.stages), o)
		p.mu.Unlock()
	}
	return upR, nil
}

// unreachable is the error of a stream to stage i that could not be opened: timeout when
// the set-up's deadline (ctx's) passed, else unavailable.
func (p *Pipeline) unreachable(ctx context.Context, i int, err error) error {
	if ctx.Err() != nil {
		return p.stageErr(inference.CodeTimeout, i, "open stream within %v: %v", OpenTimeout, err)
	}
	return p.stageErr(inference.CodeUnavailable, i, "open stream: %v", err)
}

// answer reads stage from's answer to an open or attach from r: ready with the model's
// width (and, for the open, the flags of what the chain does of what it was asked), or an
// error frame. The open's names a stage of the chain (stage 0 passes back the refusal of a
// stage after it); the attach's (read from the return stream, asked nothing) concerns the
// last stage alone, whatever it names. The set-up's deadline (ctx's) gives timeout.
func (p *Pipeline) answer(ctx context.Context, r *frame.Reader, from int, asked byte) (int, byte, error) {
	attach := r == p.retR // not asked == 0: an open may ask nothing too
	body, err := r.Next()
	switch {
	case err != nil && (isTimeout(err) || ctx.Err() != nil):
		return 0, 0, p.stageErr(inference.CodeTimeout, from, "no answer within %v", OpenTimeout)
	case err != nil:
		return 0, 0, p.lost(from, "read answer", err)
	case len(body) > 0 && body[0] == frameError:
		lo := 0
		if attach {
			lo = headStage
		}
		f, err := decodeError(body, lo, len(p.stages))
		if err != nil {
			return 0, 0, p.lost(from, "read answer", err)
		}
		if attach {
			f.stage = from
		}
		return 0, 0, p.faultErr(f)
	}
	w, flags, err := decodeReady(body, asked)
	if err != nil {
		return 0, 0, p.lost(from, "read answer", err)
	}
	return w, flags, nil
}

// Stats returns what the pipeline's steps took so far. It may be called at any time, also
// while a Forward runs and after Close.
func (p *Pipeline) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	st.Forward = slices.Clone(p.stats.Forward)
	if p.err != nil && !p.closed {
		st.Err = p.err
	}
	return st
}

// Width is the model's hidden-state width: Forward takes and returns n × Width values.
func (p *Pipeline) Width() int { return p.width }

// Forward runs n positions of hidden states (n × Width values, row-major) through every
// stage's layers, in order, and returns the last stage's n outputs: inference.Layers. The
// positions are appended to the stages' KV caches after those already run. n positions go
// as one step when they fit the pipeline's batch, else as several.
//
// Errors are *inference.Error, wrapping a *FailedStage where a stage is to blame:
// invalid_request for a bad call (n, the values, a concurrent call), context_overflow past
// the pipeline's maxPositions (nothing is sent; the pipeline stays usable), timeout when a
// step's output does not come within its step timeout (WithStepTimeouts), peer_lost when a stage goes away
// or breaks the protocol, the stage's code when its layers fail; a cancelled ctx gives its
// error. After any failure but the first two the pipeline is broken: every later call
// returns the same error.
func (p *Pipeline) Forward(ctx context.Context, hidden []float32, n int) ([]float32, error) {
	if !p.busy.CompareAndSwap(false, true) {
		return nil, inference.Errorf(inference.CodeInvalidRequest, "Forward called while another runs on the pipeline")
	}
	defer p.busy.Store(false)
	if err := p.broken(); err != nil {
		return nil, err
	}
	if n < 1 || len(hidden) != n*p.width {
		return nil, inference.Errorf(inference.CodeInvalidRequest, "%d values for %d positions of width %d", len(hidden), n, p.width)
	}
	if p.positions+n > p.maxPos {
		return nil, inference.Errorf(inference.CodeContextOverflow, "%d positions past the pipeline's %d", p.positions+n, p.maxPos)
	}
	// The caller's cancellation breaks the pipeline (a step may be half run): its streams
	// are reset, which ends the wait below and every stage's session.
	stop := context.AfterFunc(ctx, func() { p.fail(fmt.Errorf("step: %w", context.Cause(ctx))) })
	defer stop()
	if p.leaving >= 0 {
		// A step boundary, every stage holding the same positions: the time to move the
		// stage that is leaving (pipeline_move.go).
		if err := p.relink(ctx); err != nil {
			return nil, err
		}
	}
	out := make([]float32, 0, n*p.width)
	for done := 0; done < n; {
		m := min(n-done, p.batch)
		res, err := p.roundTrip(hidden[done*p.width:(done+m)*p.width], m)
		if err != nil {
			return nil, err
		}
		out = append(out, res...)
		done += m
	}
	return out, nil
}

// roundTrip sends one step of m positions to stage 0 and reads the last stage's output.
func (p *Pipeline) roundTrip(h []float32, m int) ([]float32, error) {
	last := len(p.stages) - 1
	timeout := p.stepTimeout
	if m == 1 {
		timeout = p.decodeTimeout
	}
	sent := time.Now()
	deadline := sent.Add(timeout)
	p.buf = appendHiddenFrame(p.buf[:0], p.step, m, h)
	p.retM.Take() // the step's output alone
	up, ret := p.streams()
	up.SetWriteDeadline(deadline)
	// A failed write means the chain broke: why comes on the return stream (forward from
	// the stages after the break) or to the watcher of up. Read on for it, within the
	// step's deadline.
	up.Write(p.buf)
	ret.SetReadDeadline(deadline)
	body, err := p.retR.Next()
	for err == nil && p.movable && len(body) > 0 && body[0] == frameLeaving {
		// A stage is leaving: the next Forward moves it (relink). Each stage says so once.
		i, derr := decodeLeaving(body, 0, len(p.stages))
		if derr == nil && p.seen&(1<<i) != 0 {
			derr = fmt.Errorf("%w: stage %d's leaving notice twice", errProtocol, i)
		}
		if derr != nil {
			return nil, p.fail(p.lost(last, "read output", derr))
		}
		p.seen |= 1 << i
		if p.leaving < 0 {
			p.leaving = i
		}
		body, err = p.retR.Next()
	}
	if err != nil {
		if e := p.broken(); e != nil {
			return nil, e // the watcher, Close or the caller's cancellation came first
		}
		if isTimeout(err) {
			return nil, p.fail(inference.Errorf(inference.CodeTimeout, "no output for step %d within %v", p.step, timeout))
		}
		if errors.Is(err, io.EOF) {
			err = errors.New("the return stream ended")
		}
		return nil, p.fail(p.lost(last, "read output", err))
	}
	if len(body) > 0 && body[0] == frameEnd {
		// Only the head ends a session in order; a stage that says so before it did lies.
		return nil, p.fail(p.lost(last, "read output", fmt.Errorf("%w: an end frame the head did not send", errProtocol)))
	}
	if len(body) > 0 && body[0] == frameError {
		f, err := decodeError(body, headStage, len(p.stages))
		if err != nil {
			return nil, p.fail(p.lost(last, "read output", err))
		}
		return nil, p.fail(p.faultErr(f))
	}
	var (
		step  uint64
		n     int
		times []time.Duration
		out   []float32
	)
	if p.timed {
		step, n, times, out, err = decodeTimed(body, p.width, p.batch, len(p.stages), nil)
	} else {
		step, n, out, err = decodeHidden(body, p.width, p.batch, nil)
	}
	if err == nil && (step != p.step || n != m) {
		err = fmt.Errorf("%w: output of step %d with %d positions, want step %d with %d", errProtocol, step, n, p.step, m)
	}
	if err != nil {
		return nil, p.fail(p.lost(last, "read output", err))
	}
	took := time.Since(sent)
	if p.transfers != nil {
		p.transfers(p.stages[last].Peer, p.retM.Take())
	}
	p.step++
	p.positions += m
	p.mu.Lock()
	p.stats.Steps, p.stats.Positions, p.stats.RoundTrip = p.stats.Steps+1, p.stats.Positions+m, p.stats.RoundTrip+took
	for i, d := range times {
		p.stats.Forward[i] += d
	}
	p.mu.Unlock()
	return out, nil
}

// watch reads what comes back from stage 0 while the pipeline runs: nothing but one
// error frame (a failure passed back along the chain) is allowed. Anything ends the
// pipeline, unless it is ending already.
func (p *Pipeline) watch(r *frame.Reader) {
	body, err := r.Next()
	if p.broken() != nil || p.relinking.Load() {
		return
	}
	switch {
	case err == nil && len(body) > 0 && body[0] == frameError:
		f, derr := decodeError(body, 0, len(p.stages))
		if derr == nil {
			p.fail(p.faultErr(f))
			return
		}
		err = derr
	case err == nil:
		err = fmt.Errorf("%w: a frame other than an error came back from stage 0", errProtocol)
	case errors.Is(err, io.EOF):
		err = errors.New("stage 0 ended the session")
	}
	p.fail(p.lost(0, "read", err))
}

// Close ends the pipeline in order: the end frame goes along the chain, and each stage
// frees its session as it passes. In a receipted session (WithReceipts) it then waits, at
// most CloseTimeout, for the stages' receipts to come back from the last stage, and checks
// them (Receipts). A Forward running is broken off (its streams reset, every stage freeing
// its session, no receipts) and returns an error. Idempotent.
func (p *Pipeline) Close() error {
	p.mu.Lock()
	first := p.err == nil
	if first {
		p.err = inference.Errorf(inference.CodeUnavailable, "pipeline closed")
		p.closed = true
	}
	p.mu.Unlock()
	up, ret := p.streams()
	switch {
	case !first:
	case p.busy.Load():
		// A step is half run, or a re-link: no orderly end. (A Forward that starts after
		// this sees the error set above and sends nothing; a re-link, its streams reset.)
		p.resetStreams()
	default:
		up.SetWriteDeadline(time.Now().Add(errorWriteTimeout))
		err := frame.Write(up, []byte{frameEnd})
		if err != nil {
			up.Reset()
		}
		up.Close()
		if err == nil && p.receipted {
			p.collect()
		}
		ret.Close()
	}
	p.mu.Lock()
	watched := p.watched
	p.mu.Unlock()
	<-watched
	return nil
}

// Receipts returns the stages' receipts of a receipted session that Close ended in order,
// in chain order, each as its stage signed it and as WithReceipts' check accepted it; ""
// for a stage whose receipt did not come or did not hold. It is nil before Close, and
// when the chain gave none: it was not receipted (a stage predates receipts, or has no
// signer), it broke, or its receipts did not come within CloseTimeout.
func (p *Pipeline) Receipts() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.receipts)
}

// collect reads the last stage's receipts frame, which follows the end frame along the
// chain, and keeps the receipts that check accepts. A receipt it refuses is recorded
// against its stage; a frame that breaks the protocol, against the last stage.
func (p *Pipeline) collect() {
	last := len(p.stages) - 1
	_, ret := p.streams()
	ret.SetReadDeadline(time.Now().Add(CloseTimeout))
	body, err := p.retR.Next()
	switch {
	case err == nil && len(body) > 0 && body[0] == frameError:
		// A stage failed while the end passed (its next hop went away): no receipts.
		if _, err = decodeError(body, headStage, len(p.stages)); err == nil {
			return
		}
	case err == nil:
		var rs []string
		if rs, err = decodeReceipts(body, len(p.stages)); err == nil {
			p.keep(rs)
			return
		}
	}
	observe(p.observer, p.stages[last].Peer, err)
	log.Debugw("no stage receipts", "peer", p.stages[last].Peer, "model", p.model, "err", err)
}

// keep checks each stage's receipt against its part, and keeps those that hold.
func (p *Pipeline) keep(rs []string) {
	st, session := p.Stats(), hex.EncodeToString(p.session[:])
	kept := make([]string, len(rs))
	for i, r := range rs {
		if r == "" {
			continue // the stage had none to give
		}
		part := Part{
			Session: session, Head: p.head, Model: p.model, Index: i,
			Stage: p.stages[i], Steps: st.Steps, Positions: st.Positions,
		}
		if err := p.check(part, r); err != nil {
			observe(p.observer, p.stages[i].Peer, fmt.Errorf("%w: receipt: %w", errProtocol, err))
			log.Debugw("stage receipt refused", "peer", p.stages[i].Peer, "model", p.model, "err", err)
			continue
		}
		kept[i] = r
	}
	p.mu.Lock()
	p.receipts = kept
	p.mu.Unlock()
}

// broken is why no step can run, or nil.
func (p *Pipeline) broken() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// fail breaks the pipeline with err, unless it is broken already, and returns the error it
// is broken with. Its streams are reset: every stage ends its session.
func (p *Pipeline) fail(err error) error {
	p.mu.Lock()
	first := p.err == nil
	if first {
		p.err = err
	}
	err = p.err
	p.mu.Unlock()
	if first {
		p.resetStreams()
	}
	return err
}

// stageErr is an *inference.Error of code about stage i.
func (p *Pipeline) stageErr(code inference.Code, i int, format string, args ...any) error {
	fs := &FailedStage{Index: i}
	if i >= 0 && i < len(p.stages) {
		fs.Peer = p.stages[i].Peer
	}
	return inference.Errorf(code, "%w: "+format, append([]any{fs}, args...)...)
}

// faultErr is a fault a stage reported, as an error.
func (p *Pipeline) faultErr(f stageFault) error { return p.stageErr(f.code, f.stage, "%s", f.msg) }

// lost is peer_lost about stage i, whose stream broke while doing what; a violation is
// recorded against its peer.
func (p *Pipeline) lost(i int, what string, err error) error {
	observe(p.observer, p.stages[i].Peer, err)
	return p.stageErr(inference.CodePeerLost, i, "%s: %v", what, err)
}
