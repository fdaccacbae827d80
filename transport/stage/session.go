package stage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// sessionKey names a session at a stage: the head that runs it and the ID it chose. Keyed
// by head, a session ID learnt by another peer cannot be used to attach to or squat it.
type sessionKey struct {
	head peer.ID
	id   [sessionIDLen]byte
}

// session is one chain's part on this stage. Its handler goroutine (Server.run) owns it:
// the streams, the backend session and the counters below; the watcher only reads the next
// hop's stream and records a failure.
type session struct {
	key      sessionKey
	from     peer.ID // the previous hop: the head for stage 0
	index    int     // this stage's place in the chain
	stages   int     // the chain's length
	open     *open   // the open frame, this stage's hop first
	width    int
	batch    int   // the most positions of one step
	frameMax int   // the bound of a hidden frame
	upMax    int   // the bound of a frame from the previous hop: frameMax, or a receipts frame's
	kv       int64 // the KV cache's bytes, against the server's budget
	backend  inference.StageSession

	ctx    context.Context // cancelled when the session ends, or by Server.Close
	cancel context.CancelFunc

	// timed: this stage reports its layers' time in each step, as every stage after it
	// does (the open asked for times and the next hop answered timed): its output goes out
	// in timed frames, and its input comes in them unless it is stage 0.
	timed bool
	// receipted: this stage sends its receipt at the end, as every stage after it does
	// (the open asked for receipts, this stage signs them, and the next hop answered
	// receipted): its end goes out as a receipts frame, and comes in as one unless it is
	// stage 0. closing holds the receipts of the stages before it, from that frame.
	receipted bool
	closing   []string
	// endedAt is when the session ended, on the server's clock: the time of its receipt
	// and of its SessionEnd alike. Set by end.
	endedAt time.Time

	// Run so far: written by the handler goroutine under mu, read by Server.Running.
	steps, positions int
	forward          time.Duration // its layers' time over those steps
	admitted         time.Time     // when the server admitted it (its clock), set before it runs

	// ret hands the head's return stream from its attach handler to the last stage's
	// session, once (buffered: the hand-over never blocks).
	ret chan network.Stream

	// Moves (move.go). moves: the session is movable (the open asked, this stage's
	// backend can move its sessions, and every stage after it can too). loading: this hop
	// is a re-linked chain's replacement, whose rows come on the head's load stream (load,
	// handed over once like ret). noticed: this stage's leaving notice went out; seen: the
	// stages before it whose notices it passed on (bit per index). keptAway: a keep end
	// moved the backend session to the kept table.
	moves, loading, noticed, keptAway bool
	seen                              uint64
	load                              chan network.Stream

	mu       sync.Mutex
	ended    bool     // no hand-over after this
	returned bool     // a return stream was handed over
	loadIn   bool     // a load stream was handed over
	failed   *failure // the first reason the session ended
	// leaveBy is when a leaving stage (Server.HandOver) ends the session, zero when it
	// stays; grace ends it then.
	leaveBy time.Time
	grace   *time.Timer
}

func newSession(parent context.Context, from peer.ID, o *open, shape inference.ModelShape) *session {
	self := o.hops[0]
	batch := maxBatch(shape.Width, o.maxPositions, o.maxBatch)
	ctx, cancel := context.WithCancel(parent)
	frameMax := stepFrameMax(shape.Width, batch)
	upMax := frameMax
	if o.receipts && o.index > 0 {
		upMax = max(upMax, receiptsFrameMax(o.index))
	}
	return &session{
		key: sessionKey{head: o.head, id: o.session}, from: from, index: o.index, stages: o.stages(),
		open: o, width: shape.Width, batch: batch, frameMax: frameMax, upMax: upMax,
		kv:  shape.KVBytesPerToken * int64(self.Hi-self.Lo) * int64(o.maxPositions) / int64(max(shape.Layers, 1)),
		ctx: ctx, cancel: cancel, ret: make(chan network.Stream, 1),
		loading: o.adopting && o.loads[0], load: make(chan network.Stream, 1),
	}
}

// last reports whether this stage is the chain's last: it returns its output to the head.
func (ss *session) last() bool { return len(ss.open.hops) == 1 }

// receiptsIn reports whether the session's end comes as a receipts frame: it is receipted
// and has a stage before it (stage 0 gets the head's end frame).
func (ss *session) receiptsIn() bool { return ss.receipted && ss.index > 0 }

// nextIndex is the index of the stage after this one, or headStage for the last stage
// (whose output goes to the head).
func (ss *session) nextIndex() int {
	if ss.last() {
		return headStage
	}
	return ss.index + 1
}

// nextPeer is the peer this stage writes to: the next hop, or the head.
func (ss *session) nextPeer() peer.ID {
	if ss.last() {
		return ss.open.head
	}
	return ss.open.hops[1].Peer
}

// handOver gives the session the head's return stream, if it is the last stage and still
// awaits one.
func (ss *session) handOver(st network.Stream) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.ended || !ss.last() || ss.returned {
		return false
	}
	ss.returned = true
	ss.ret <- st
	return true
}

// takeLoad gives the session the head's load stream, if it loads its rows and still awaits
// them.
func (ss *session) takeLoad(st network.Stream) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.ended || !ss.loading || ss.loadIn {
		return false
	}
	ss.loadIn = true
	ss.load <- st
	return true
}

// leave marks the session as its stage's leaving: its next step's output carries the
// notice (a movable session), and it ends with shutting_down after grace, unless it ended
// before. A second call changes nothing.
func (ss *session) leave(grace time.Duration) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.ended || !ss.leaveBy.IsZero() {
		return
	}
	ss.leaveBy = time.Now().Add(grace)
	ss.grace = time.AfterFunc(grace, func() {
		ss.fail(failure{fault: stageFault{stage: ss.index, code: inference.CodeShuttingDown, msg: "stage left"}})
	})
}

// leaving reports whether the stage is leaving, and until when it serves the session.
func (ss *session) leaving() (time.Time, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.leaveBy, !ss.leaveBy.IsZero()
}

// side is where a session's failure came from.
type side int

const (
	sideSelf side = iota // this stage: its layers, its limits, its idle timer
	sideUp               // the previous hop's stream
	sideDown             // the next hop's stream (the head's return stream at the last stage)
)

// failure is why a session ends: the fault to pass on along the chain (none, code "", for
// an orderly close) and the side it came from, which is not written to.
type failure struct {
	fault stageFault
	from  side
	abort bool // that side broke its stream or the protocol: reset it rather than close it
	keep  bool // an orderly end by a keep frame: the backend session is kept for adoption
}

// fail records f as the session's end, if it has none yet, and cancels the session.
func (ss *session) fail(f failure) {
	ss.mu.Lock()
	if ss.failed == nil {
		ss.failed = &f
	}
	ss.mu.Unlock()
	ss.cancel()
}

func (ss *session) failure() *failure {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.failed
}

// run serves an admitted session to its end: it links the session into the chain, runs
// its steps, then passes its failure on (forward to the next hop, back to the previous
// one) and closes its streams. It returns why the session ended.
func (s *Server) run(ss *session, up network.Stream) *failure {
	down, downR, f := s.link(ss, up)
	if f != nil {
		s.free(ss, up)
		s.end(ss, f, up, down)
		return f
	}
	// The watcher reads the next hop's stream (backward: error frames only) for the
	// session's life; it returns when that stream's read fails, at the latest when end
	// below closes or resets it.
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		s.watch(ss, down, downR)
	}()
	// A failure seen by the watcher, or Close, interrupts the step loop's read or write.
	interrupted := make(chan struct{})
	stop := context.AfterFunc(ss.ctx, func() {
		defer close(interrupted)
		past := time.Now().Add(-time.Hour)
		up.SetReadDeadline(past)
		down.SetWriteDeadline(past)
	})
	if ss.loading {
		// The rows come before the first step; the watcher, running, ends the wait when
		// the chain breaks meanwhile (the head gone: the last stage passes it back).
		if f := s.loadRows(ss); f != nil {
			ss.fail(*f)
		}
	}
	if ss.ctx.Err() == nil {
		s.steps(ss, up, down)
	}
	ss.cancel()
	if !stop() {
		<-interrupted // the deadlines are set before end clears them for its error frames
	}
	f = s.finalFailure(ss)
	if f.keep {
		// Kept before the keep goes on: the head re-links once the last stage passed it,
		// and its adopting open must find the session here.
		s.keepSession(ss)
	}
	s.free(ss, up)
	s.end(ss, f, up, down)
	<-watched
	return f
}

// finalFailure is the session's recorded failure or, when only Close cancelled it,
// shutting_down.
func (s *Server) finalFailure(ss *session) *failure {
	if f := ss.failure(); f != nil {
		return f
	}
	return &failure{fault: stageFault{stage: ss.index, code: inference.CodeShuttingDown, msg: "stage is shutting down"}}
}

// link connects the session into the chain: it opens the next hop's session (which sets
// up the rest of the chain before it answers) and answers ready to the previous hop; the
// last stage answers ready and then waits for the head's return stream, and answers ready
// on it. It returns the next hop's stream (or the head's) and its reader, or a failure.
func (s *Server) link(ss *session, up network.Stream) (network.Stream, *frame.Reader, *failure) {
	var down network.Stream
	var downR *frame.Reader
	flags := ss.open.asked() // what it was asked: the last stage does all of it
	if !s.movable(ss) {
		flags &^= flagMoves
	}
	if !ss.last() {
		var f *failure
		var next byte
		if down, downR, next, f = s.dialNext(ss); f != nil {
			return down, nil, f
		}
		flags &= next // of that, what every stage after it does too
	}
	ss.timed, ss.receipted, ss.moves = flags&flagTimed != 0, flags&flagReceipts != 0, flags&flagMoves != 0
	if ss.open.adopting && !ss.moves {
		// A re-linked chain is movable from end to end: a stage that cannot move is no part
		// of one (its kept session, if any, expires).
		return down, nil, &failure{fault: stageFault{stage: ss.index, code: inference.CodeUnavailable, msg: "a re-linked chain's stage cannot move its session"}}
	}
	up.SetWriteDeadline(time.Now().Add(OpenTimeout))
	if err := frame.Write(up, encodeReady(ss.width, flags)); err != nil {
		return down, nil, s.broken(ss, sideUp, err)
	}
	if !ss.last() {
		return down, downR, nil
	}
	timer := time.NewTimer(OpenTimeout)
	defer timer.Stop()
	select {
	case down = <-ss.ret:
	case <-timer.C:
		return nil, nil, &failure{fault: stageFault{stage: headStage, code: inference.CodeTimeout, msg: "the head did not attach its return stream"}}
	case <-ss.ctx.Done():
		return nil, nil, s.finalFailure(ss)
	}
	down.SetWriteDeadline(time.Now().Add(OpenTimeout))
	if err := frame.Write(down, encodeReady(ss.width, 0)); err != nil {
		return down, nil, s.broken(ss, sideDown, err)
	}
	return down, frame.NewReader(down, MaxErrorFrame), nil
}

// dialNext opens the next hop's session and waits for its answer: ready once the rest of
// the chain is set up, with the flags of what it and every stage after it do (report
// their times, send their receipts), or an error frame to pass back.
func (s *Server) dialNext(ss *session) (network.Stream, *frame.Reader, byte, *failure) {
	next, addrs := ss.open.hops[1], ss.open.addrs[1]
	// The head's addresses for the next hop help only where this host knows none: a head
	// cannot make it dial more than MaxAddrsPerHop, nor replace what it knows.
	if len(addrs) > 0 && len(s.h.Peerstore().Addrs(next.Peer)) == 0 {
		s.h.Peerstore().AddAddrs(next.Peer, addrs, peerstore.TempAddrTTL)
	}
	ctx, cancel := context.WithTimeout(ss.ctx, OpenTimeout)
	defer cancel()
	down, err := s.h.NewStream(ctx, next.Peer, ID)
	if err != nil {
		if ss.ctx.Err() != nil {
			return nil, nil, 0, s.finalFailure(ss)
		}
		return nil, nil, 0, &failure{
			fault: stageFault{stage: ss.index + 1, code: inference.CodeUnavailable, msg: fmt.Sprintf("open stream: %v", err)},
			from:  sideDown, abort: true,
		}
	}
	if err := down.Scope().SetService(ServiceName); err != nil {
		down.Reset()
		return nil, nil, 0, &failure{fault: stageFault{stage: ss.index, code: inference.CodeOverloaded, msg: err.Error()}}
	}
	// The set-up's timeout or Close resets the stream, which ends the wait below.
	stop := context.AfterFunc(ctx, func() { down.Reset() })
	defer stop()
	next1 := *ss.open
	next1.index, next1.hops, next1.addrs = ss.index+1, ss.open.hops[1:], ss.open.addrs[1:]
	if len(ss.open.loads) > 1 {
		next1.loads = ss.open.loads[1:]
	}
	down.SetWriteDeadline(time.Now().Add(OpenTimeout))
	if err := frame.Write(down, encodeOpen(&next1)); err != nil {
		return down, nil, 0, s.setUpFailure(ctx, ss, err)
	}
	r := frame.NewReader(down, MaxErrorFrame)
	down.SetReadDeadline(time.Now().Add(OpenTimeout))
	body, err := r.Next()
	if err != nil {
		return down, nil, 0, s.setUpFailure(ctx, ss, err)
	}
	switch {
	case len(body) == 0:
		return down, nil, 0, s.broken(ss, sideDown, fmt.Errorf("%w: empty frame in answer to open", errProtocol))
	case body[0] == frameError:
		f, err := decodeError(body, ss.index+1, ss.stages)
		if err != nil {
			return down, nil, 0, s.broken(ss, sideDown, err)
		}
		return down, nil, 0, &failure{fault: f, from: sideDown}
	case body[0] != frameReady:
		return down, nil, 0, s.broken(ss, sideDown, fmt.Errorf("%w: frame %#x in answer to open", errProtocol, body[0]))
	}
	w, flags, err := decodeReady(body, ss.open.asked())
	if err != nil {
		return down, nil, 0, s.broken(ss, sideDown, err)
	}
	if w != ss.width {
		return down, nil, 0, &failure{
			fault: stageFault{stage: ss.index + 1, code: inference.CodeUnavailable, msg: fmt.Sprintf("model width %d, the previous stage's is %d", w, ss.width)},
			from:  sideDown, abort: true,
		}
	}
	if !stop() {
		return down, nil, 0, s.setUpFailure(ctx, ss, context.Canceled)
	}
	down.SetDeadline(time.Time{})
	return down, r, flags, nil
}

// setUpFailure classifies a failed exchange with the next hop during set-up: Close, the
// set-up's timeout, or the next hop's.
func (s *Server) setUpFailure(ctx context.Context, ss *session, err error) *failure {
	switch {
	case ss.ctx.Err() != nil:
		return s.finalFailure(ss)
	case ctx.Err() != nil || isTimeout(err):
		return &failure{
			fault: stageFault{stage: ss.index + 1, code: inference.CodeTimeout, msg: fmt.Sprintf("no answer to open within %v", OpenTimeout)},
			from:  sideDown, abort: true,
		}
	}
	return s.broken(ss, sideDown, err)
}

// broken is the failure of a side whose stream broke (reset, lost connection, a failed
// write) or that broke the protocol: peer_lost, naming the stage on that side. A violation
// is counted and recorded against that peer.
func (s *Server) broken(ss *session, sd side, err error) *failure {
	stage, p := ss.index-1, ss.from
	if sd == sideDown {
		stage, p = ss.nextIndex(), ss.nextPeer()
	}
	msg := err.Error()
	if _, bad := violation(err); bad {
		s.protoErrs.Add(1)
		observe(s.observer, p, err)
		log.Debugw("stage protocol violation", "peer", p, "err", err)
	}
	return &failure{fault: stageFault{stage: stage, code: inference.CodePeerLost, msg: msg}, from: sd, abort: true}
}

// steps runs the session's steps: each hidden frame from the previous hop goes through the
// layers and on to the next hop, until a frame, the stream's end, the idle timer, the
// layers or the next hop end the session. It records why, unless the session was
// cancelled already.
func (s *Server) steps(ss *session, up, down network.Stream) {
	m := bandwidth.NewMeter(up) // times each step's frame (WithServerTransfers)
	r := frame.NewReader(m, max(ss.upMax, MaxErrorFrame))
	var out []byte // reused: the frame is written before the next step
	for step := uint64(0); ; step++ {
		up.SetReadDeadline(time.Now().Add(s.idle))
		if ss.ctx.Err() != nil {
			return // cancelled before the deadline above replaced the interrupting one
		}
		m.Take() // the step's frame alone
		body, err := r.Next()
		for err == nil && ss.moves && len(body) > 0 && body[0] == frameLeaving {
			// A stage before this one is leaving: its notice goes on towards the head,
			// between two steps.
			if f := s.passLeaving(ss, body, down); f != nil {
				ss.fail(*f)
				return
			}
			up.SetReadDeadline(time.Now().Add(s.idle))
			m.Take()
			body, err = r.Next()
		}
		if ss.ctx.Err() != nil {
			return
		}
		switch {
		case errors.Is(err, io.EOF):
			// Without an end frame: the previous hop went away (a closed connection
			// reads as EOF too).
			ss.fail(*s.broken(ss, sideUp, errors.New("its stream ended without an end frame")))
			return
		case err != nil && isTimeout(err):
			ss.fail(failure{fault: stageFault{stage: ss.index, code: inference.CodeTimeout, msg: fmt.Sprintf("session idle for %v", s.idle)}})
			return
		case err != nil:
			ss.fail(*s.broken(ss, sideUp, err))
			return
		case len(body) == 1 && body[0] == frameKeep && ss.moves:
			ss.fail(failure{from: sideUp, keep: true}) // the head re-links the chain
			return
		case len(body) == 1 && body[0] == frameEnd && !ss.receiptsIn():
			ss.fail(failure{from: sideUp}) // the head closed the session: an orderly end
			return
		case len(body) > 0 && body[0] == frameReceipts && ss.receiptsIn():
			// The head closed the session, and the stages before this one sent their receipts.
			if ss.closing, err = decodeReceipts(body, ss.index); err != nil {
				ss.fail(*s.broken(ss, sideUp, err))
				return
			}
			ss.fail(failure{from: sideUp})
			return
		case len(body) > 0 && (body[0] == frameEnd || body[0] == frameReceipts):
			ss.fail(*s.broken(ss, sideUp, fmt.Errorf("%w: end frame of type %#x in a session receipted: %v", errProtocol, body[0], ss.receipted)))
			return
		case len(body) > 0 && body[0] == frameError:
			f, err := decodeError(body, headStage, ss.index)
			if err != nil {
				ss.fail(*s.broken(ss, sideUp, err))
				return
			}
			ss.fail(failure{fault: f, from: sideUp})
			return
		}
		if s.transfers != nil {
			s.transfers(ss.from, m.Take())
		}
		// Fresh values for each step: the backend may keep what it is given.
		var (
			got   uint64
			n     int
			times []time.Duration
			h     []float32
		)
		if ss.timed && ss.index > 0 {
			got, n, times, h, err = decodeTimed(body, ss.width, ss.batch, ss.index, nil)
		} else {
			got, n, h, err = decodeHidden(body, ss.width, ss.batch, nil)
		}
		if err == nil && got != step {
			err = fmt.Errorf("%w: step %d, want %d", errProtocol, got, step)
		}
		if err != nil {
			ss.fail(*s.broken(ss, sideUp, err))
			return
		}
		if ss.positions+n > ss.open.maxPositions {
			ss.fail(failure{fault: stageFault{stage: ss.index, code: inference.CodeContextOverflow,
				msg: fmt.Sprintf("%d positions past the session's %d", ss.positions+n, ss.open.maxPositions)}})
			return
		}
		ctx, cancel := context.WithTimeout(ss.ctx, s.forwardTimeout)
		// The layers' time is measured on the monotonic clock, as the deadlines are: it is a
		// duration of work here, not a time anyone compares (the server's clock dates the
		// session's end).
		began := time.Now()
		res, err := ss.backend.Forward(ctx, h, n)
		took := min(time.Since(began), MaxStageTime)
		cancel()
		if ss.ctx.Err() != nil {
			return
		}
		if err == nil && len(res) != n*ss.width {
			err = inference.Errorf(inference.CodeUnavailable, "layers returned %d values for %d positions of width %d", len(res), n, ss.width)
		}
		if err != nil {
			ss.fail(failure{fault: faultOf(ss.index, err)})
			return
		}
		ss.mu.Lock()
		ss.steps, ss.positions, ss.forward = ss.steps+1, ss.positions+n, ss.forward+took
		ss.mu.Unlock()
		out = out[:0]
		if _, leaving := ss.leaving(); leaving && !ss.noticed {
			if !ss.moves {
				// The head cannot move the session: it ends now, as it would have without
				// the notice, and the head replays the generation elsewhere.
				ss.fail(failure{fault: stageFault{stage: ss.index, code: inference.CodeShuttingDown, msg: "stage left"}})
				return
			}
			// The notice goes before the step's output, on the way to the head, which
			// re-links the chain at its next step.
			out = frame.Append(out, encodeLeaving(ss.index))
			ss.noticed = true
		}
		if ss.timed {
			out = appendTimedFrame(out, step, n, append(times, took), res)
		} else {
			out = appendHiddenFrame(out, step, n, res)
		}
		down.SetWriteDeadline(time.Now().Add(s.forwardTimeout))
		if ss.ctx.Err() != nil {
			return
		}
		if _, err := down.Write(out); err != nil {
			if ss.ctx.Err() == nil {
				ss.fail(*s.broken(ss, sideDown, err))
			}
			return
		}
	}
}

// watch reads what comes back on the next hop's stream while the session runs: nothing
// but one error frame is allowed (to pass back), or its orderly end. Any of them ends the
// session.
func (s *Server) watch(ss *session, down network.Stream, r *frame.Reader) {
	down.SetReadDeadline(time.Time{})
	body, err := r.Next()
	if ss.ctx.Err() != nil {
		return // the session is ending already; its end closed the stream
	}
	switch {
	case err == nil && len(body) == 0:
		err = fmt.Errorf("%w: empty frame from the next hop", errProtocol)
	case err == nil && !ss.last() && body[0] == frameError:
		f, derr := decodeError(body, ss.index+1, ss.stages)
		if derr != nil {
			// The last stage names the head when it finds the head gone (its return stream
			// broken): passed back like a stage's fault, nobody on the chain to blame.
			if hf, herr := decodeError(body, headStage, headStage+1); herr == nil {
				f, derr = hf, nil
			}
		}
		if derr == nil {
			ss.fail(failure{fault: f, from: sideDown})
			return
		}
		err = derr
	case err == nil:
		err = fmt.Errorf("%w: frame %#x from the next hop", errProtocol, body[0])
	case errors.Is(err, io.EOF) && ss.last():
		// The head closed its return stream: it writes nothing on it, and closes it when it
		// closes the session, whose end frame is on its way along the chain. If the head
		// went away instead, stage 0 finds out and tells the chain.
		return
	case errors.Is(err, io.EOF):
		// A next hop ends its stream only after this stage's: before, it went away (a
		// closed connection reads as EOF too).
		err = errors.New("its stream ended while the session ran")
	}
	ss.fail(*s.broken(ss, sideDown, err))
}

// end passes the session's failure on and closes its streams: each side that did not
// cause it gets the error frame, then an orderly close; the side that broke is reset. An
// orderly end (the previous hop's end frame) passes the end frame on to the next hop.
func (s *Server) end(ss *session, f *failure, up, down network.Stream) {
	ss.endedAt = s.now()
	for _, l := range []struct {
		st network.Stream
		sd side
	}{{down, sideDown}, {up, sideUp}} {
		switch {
		case l.st == nil:
		case l.sd == f.from && f.abort:
			l.st.Reset()
		case l.sd == f.from:
			l.st.Close()
		case f.fault.code == "":
			// Only the next hop gets here: the previous one sent the end.
			end := []byte{frameEnd}
			switch {
			case f.keep:
				end = []byte{frameKeep}
			case ss.receipted:
				end = encodeReceipts(append(ss.closing, s.receipt(ss, f)))
			}
			l.st.SetWriteDeadline(time.Now().Add(errorWriteTimeout))
			if err := frame.Write(l.st, end); err != nil {
				l.st.Reset()
				continue
			}
			l.st.Close()
		default:
			if err := writeFault(l.st, f.fault); err != nil {
				l.st.Reset()
				continue
			}
			l.st.Close()
		}
	}
	if f.fault.code != "" {
		log.Debugw("stage session failed", "peer", ss.from, "model", ss.open.model, "err", f.fault.msg)
	}
}
