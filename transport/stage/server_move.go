package stage

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// A stage's side of moves (doc.go, "Moves"): its leaving notice (HandOver), the sessions a
// keep end closed (the kept table: adopted by the re-linked chain, or fetched, or expired),
// and a replacement's load.

// Outcomes of a SessionEnd of a kept session that no re-linked chain adopted.
const (
	// OutcomeMoved: the head fetched the session's rows for a replacement (this stage left).
	OutcomeMoved = "moved"
	// OutcomeExpired: nobody took the kept session within the keep timeout, or the stage
	// closed first.
	OutcomeExpired = "expired"
)

// WithHandOverGrace sets how long a session goes on after HandOver before it ends with
// shutting_down (DefaultHandOverGrace).
func WithHandOverGrace(d time.Duration) ServerOption { return func(s *Server) { s.grace = d } }

// WithKeepTimeout sets how long a session a keep end closed is kept for the head's
// re-linked chain (DefaultKeepTimeout).
func WithKeepTimeout(d time.Duration) ServerOption { return func(s *Server) { s.keepTimeout = d } }

// kept is a session a keep end closed: its backend session (the KV cache), held for the
// head's re-linked chain to adopt or fetch, and its place in the limits.
type kept struct {
	backend inference.StageSession
	end     SessionEnd // the session's as it was kept; Outcome, Time and Duration set when freed
	from    peer.ID
	kv      int64
	width   int
	// what the adopting open must match
	model                string
	lo, hi, maxPositions int
	positions, steps     int
	admitted, leaveBy    time.Time // leaveBy: the leaving stage's grace, carried on
	timer                *time.Timer
}

// HandOver tells the heads of the sessions this stage runs that it is leaving (its node
// pauses or drains): each movable session's next step carries the notice to its head,
// which re-links its chain around this stage and fetches the session's rows; each ends
// after the grace (WithHandOverGrace) with shutting_down if it still runs. A session that
// cannot move ends at its next step. It returns the sessions told.
func (s *Server) HandOver() int {
	s.mu.Lock()
	list := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		list = append(list, ss)
	}
	for _, k := range s.kept {
		if k.leaveBy.IsZero() {
			k.leaveBy = time.Now().Add(s.grace) // an adopting session goes on leaving
		}
	}
	s.mu.Unlock()
	for _, ss := range list {
		ss.leave(s.grace)
	}
	return len(list)
}

// Kept returns the number of sessions kept now for a re-linked chain.
func (s *Server) Kept() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.kept)
}

// movable reports whether ss's backend session can move: it gives and takes its rows, and
// one position of them fits a kv frame.
func (s *Server) movable(ss *session) bool {
	_, ok := ss.backend.(inference.StageMover)
	self := ss.open.hops[0]
	return ok && kvPerFrame(ss.width, self.Hi-self.Lo) > 0
}

// keepSession moves ss's backend session, which a keep end closed, to the kept table,
// still counted in the limits, until DefaultKeepTimeout (WithKeepTimeout).
func (s *Server) keepSession(ss *session) {
	self := ss.open.hops[0]
	leaveBy, _ := ss.leaving()
	k := &kept{
		backend: ss.backend, end: s.sessionEnd(ss, &failure{}), from: ss.from, kv: ss.kv, width: ss.width,
		model: ss.open.model, lo: self.Lo, hi: self.Hi, maxPositions: ss.open.maxPositions,
		positions: ss.positions, steps: ss.steps, admitted: ss.admitted, leaveBy: leaveBy,
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return // Close is ending every session: release frees this one
	}
	delete(s.sessions, ss.key)
	s.kept[ss.key] = k
	k.timer = time.AfterFunc(s.keepTimeout, func() { s.expire(ss.key, k) })
	ss.keptAway = true
}

// expire frees k, kept under key, unless it was taken or the server closed.
func (s *Server) expire(key sessionKey, k *kept) {
	s.mu.Lock()
	if s.closed || s.kept[key] != k {
		s.mu.Unlock()
		return
	}
	delete(s.kept, key)
	s.wg.Add(1) // under mu while open: Close's Wait comes after
	s.mu.Unlock()
	defer s.wg.Done()
	s.freeKept(k, OutcomeExpired)
}

// takeKept removes the session kept under key from the table and returns it, or nil. Its
// taker frees it (freeKept) or counts it as its own.
func (s *Server) takeKept(key sessionKey) *kept {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.kept[key]
	if k != nil {
		delete(s.kept, key)
		k.timer.Stop()
	}
	return k
}

// freeKept closes a kept session taken from the table, gives back its place in the limits
// and reports its end with outcome.
func (s *Server) freeKept(k *kept, outcome string) {
	if err := k.backend.Close(); err != nil {
		log.Warnw("closing a kept stage session", "model", k.model, "err", err)
	}
	s.mu.Lock()
	s.uncount(k.from, k.kv)
	s.mu.Unlock()
	if s.onEnd != nil {
		e := k.end
		e.Time = s.now()
		e.Duration, e.Outcome, e.Failed = e.Time.Sub(k.admitted), outcome, 0
		s.onEnd(e)
	}
}

// adopt gives ss, the open of a re-linked chain at this stage, the session its head kept
// here under the session the open names, with its KV cache and its counts; ss takes its
// place in the limits. Only the same head can adopt (the kept table is keyed by head), for
// the same model, layers and positions.
func (s *Server) adopt(ss *session, up network.Stream) error {
	self, key := ss.open.hops[0], sessionKey{head: ss.key.head, id: ss.open.adopt}
	s.mu.Lock()
	k := s.kept[key]
	switch {
	case s.closed:
		s.mu.Unlock()
		return inference.Errorf(inference.CodeShuttingDown, "stage is shutting down")
	case k == nil || k.model != ss.open.model || k.lo != self.Lo || k.hi != self.Hi ||
		k.positions != ss.open.positions || k.maxPositions != ss.open.maxPositions:
		s.mu.Unlock()
		return inference.Errorf(inference.CodeUnavailable, "no session of this head's kept here to adopt")
	case s.sessions[ss.key] != nil:
		s.mu.Unlock()
		return inference.Errorf(inference.CodeInvalidRequest, "session already open here")
	}
	delete(s.kept, key)
	k.timer.Stop()
	s.uncount(k.from, k.kv)
	s.sessions[ss.key] = ss
	s.perPeer[ss.from]++
	s.kvUsed += ss.kv
	s.mu.Unlock()
	ss.backend, ss.steps, ss.positions, ss.admitted = k.backend, k.steps, k.positions, k.admitted
	if !k.leaveBy.IsZero() {
		ss.leave(max(time.Until(k.leaveBy), 0))
	}
	if err := up.Scope().ReserveMemory(ss.upMax, network.ReservationPriorityHigh); err != nil {
		ss.backend.Close()
		s.unreserve(ss)
		s.refused.Add(1)
		return inference.Errorf(inference.CodeOverloaded, "no memory for the session's %d-byte frames: %v", ss.upMax, err)
	}
	return nil
}

// passLeaving passes a leaving notice from the previous hop on to the next: a stage
// before this one, each once.
func (s *Server) passLeaving(ss *session, body []byte, down network.Stream) *failure {
	i, err := decodeLeaving(body, 0, ss.index)
	if err == nil && ss.seen&(1<<i) != 0 {
		err = fmt.Errorf("%w: stage %d's leaving notice twice", errProtocol, i)
	}
	if err != nil {
		return s.broken(ss, sideUp, err)
	}
	ss.seen |= 1 << i
	down.SetWriteDeadline(time.Now().Add(s.forwardTimeout))
	if err := frame.Write(down, body); err != nil {
		if ss.ctx.Err() != nil {
			return s.finalFailure(ss)
		}
		return s.broken(ss, sideDown, err)
	}
	return nil
}

// serveFetch sends the head the rows of a session it kept here (this stage is leaving, and
// the head moves its layers to a replacement), then frees it: kv frames from position 0,
// then an end frame.
func (s *Server) serveFetch(from peer.ID, st network.Stream, body []byte) {
	id, err := decodeSessionFrame(body, frameFetch)
	if err != nil {
		s.protocolError(from, st, err)
		return
	}
	k := s.takeKept(sessionKey{head: from, id: id})
	if k == nil {
		writeFault(st, stageFault{stage: headStage, code: inference.CodeUnavailable, msg: "no session of this head's kept here"})
		st.Close()
		return
	}
	defer s.freeKept(k, OutcomeMoved)
	mv, ok := k.backend.(inference.StageMover)
	per := kvPerFrame(k.width, k.hi-k.lo)
	if !ok || per < 1 {
		writeFault(st, stageFault{stage: headStage, code: inference.CodeUnavailable, msg: "this stage cannot move its sessions"})
		st.Close()
		return
	}
	var (
		buf []float32
		out []byte
	)
	for pos := 0; pos < k.positions; {
		rows, err := mv.Rows(buf, pos, min(per, k.positions-pos))
		if err != nil {
			writeFault(st, faultOf(headStage, err))
			st.Close()
			return
		}
		buf, out = rows.Data, appendKVFrame(out[:0], rows)
		st.SetWriteDeadline(time.Now().Add(s.forwardTimeout))
		if _, err := st.Write(out); err != nil {
			st.Reset()
			return
		}
		pos += rows.N
	}
	st.SetWriteDeadline(time.Now().Add(errorWriteTimeout))
	if err := frame.Write(st, []byte{frameEnd}); err != nil {
		st.Reset()
		return
	}
	st.Close()
}

// serveLoad hands a head's load stream to the session that awaits it: a replacement hop of
// a re-linked chain that head opened, with the session ID the load names.
func (s *Server) serveLoad(from peer.ID, st network.Stream, body []byte) {
	s.handTo(from, st, body, frameLoad, (*session).takeLoad, "no session awaits rows here")
}

// loadRows reads a replacement hop's rows from the head's load stream into its backend
// session, once the chain is linked and before its first step: exactly the open's
// positions, from 0, then an end frame; it answers ready. Rows that break the protocol or
// that the backend refuses fail the session, naming the head.
func (s *Server) loadRows(ss *session) *failure {
	timer := time.NewTimer(OpenTimeout)
	defer timer.Stop()
	var st network.Stream
	select {
	case st = <-ss.load:
	case <-timer.C:
		return &failure{fault: stageFault{stage: headStage, code: inference.CodeTimeout, msg: "the head sent no rows"}}
	case <-ss.ctx.Done():
		return s.finalFailure(ss)
	}
	stop := context.AfterFunc(ss.ctx, func() { st.Reset() })
	defer stop()
	if err := st.Scope().ReserveMemory(kvFrameMax, network.ReservationPriorityHigh); err != nil {
		st.Reset()
		return &failure{fault: stageFault{stage: ss.index, code: inference.CodeOverloaded, msg: fmt.Sprintf("no memory for kv frames: %v", err)}}
	}
	defer st.Scope().ReleaseMemory(kvFrameMax)
	f := s.readRows(ss, st)
	if f != nil {
		if f.abort {
			st.Reset()
		} else {
			writeFault(st, f.fault)
			st.Close()
		}
		if ss.ctx.Err() != nil {
			return s.finalFailure(ss)
		}
		f.abort, f.from = false, sideSelf // the chain's streams are whole: both get the error
		return f
	}
	st.SetWriteDeadline(time.Now().Add(OpenTimeout))
	if err := frame.Write(st, encodeReady(ss.width, 0)); err != nil {
		st.Reset()
		return &failure{fault: stageFault{stage: headStage, code: inference.CodePeerLost, msg: fmt.Sprintf("answer the load: %v", err)}}
	}
	st.Close()
	return nil
}

// readRows reads the load stream's kv frames into ss's backend session.
func (s *Server) readRows(ss *session, st network.Stream) *failure {
	self := ss.open.hops[0]
	mv := ss.backend.(inference.StageMover) // admit checked
	r := frame.NewReader(st, kvFrameMax)
	head := ss.open.head
	bad := func(err error) *failure {
		s.protoErrs.Add(1)
		observe(s.observer, head, err)
		return &failure{fault: stageFault{stage: headStage, code: inference.CodePeerLost, msg: err.Error()}, abort: true}
	}
	var buf []float32
	for pos := 0; ; {
		st.SetReadDeadline(time.Now().Add(OpenTimeout))
		body, err := r.Next()
		switch {
		case err != nil:
			if _, v := violation(err); v {
				return bad(err)
			}
			return &failure{fault: stageFault{stage: headStage, code: inference.CodePeerLost, msg: fmt.Sprintf("read rows: %v", err)}, abort: true}
		case len(body) == 1 && body[0] == frameEnd:
			if pos != ss.open.positions {
				return bad(fmt.Errorf("%w: rows of %d positions, the chain holds %d", errProtocol, pos, ss.open.positions))
			}
			ss.mu.Lock()
			ss.positions = pos
			ss.mu.Unlock()
			return nil
		}
		rows, err := decodeKV(body, ss.width, self.Hi-self.Lo, pos, buf)
		if err == nil && pos+rows.N > ss.open.positions {
			err = fmt.Errorf("%w: rows past the chain's %d positions", errProtocol, ss.open.positions)
		}
		if err != nil {
			return bad(err)
		}
		if err := mv.Load(rows); err != nil {
			return &failure{fault: faultOf(headStage, err)}
		}
		buf, pos = rows.Data, pos+rows.N
	}
}
