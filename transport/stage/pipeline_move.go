package stage

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// The head's side of moves (doc.go, "Moves"): a stage said it is leaving; at the next
// step boundary the head ends the chain with a keep end, opens a re-linked chain in which
// every other stage adopts its kept session and replacements hold the leaving stage's
// layers, and relays the leaving stage's rows into them.

// Replacer finds the stages that take over layers [lo, hi) from leaving, a stage of the
// pipeline that is leaving: contiguous hops covering exactly [lo, hi), none of them the
// head, leaving or another stage of the chain (chain lists them). An error, or hops that
// do not fit, leaves the chain as it is: the stage serves on until it leaves, and the
// pipeline then fails as it would have.
type Replacer func(ctx context.Context, lo, hi int, leaving peer.ID, chain []Hop) ([]Hop, error)

// WithMoves makes the pipeline movable: a stage that leaves with notice (its node pauses
// or drains: Server.HandOver) is replaced at the next step by the hops replace returns,
// with its KV cache moved to them, and every other stage keeps its own; the generation
// goes on with no replay (Moves lists what moved). A re-linked chain gives no receipts.
func WithMoves(replace Replacer) PipelineOption {
	return func(c *pipelineConfig) { c.moves = replace }
}

// Move is a stage the pipeline moved: the stage at Index, its peer From, and the hops To
// that took its layers, with its Positions of KV rows, Bytes of them, and what the move
// took at the head, from the decision to the re-linked chain's readiness.
type Move struct {
	Index     int
	From      peer.ID
	To        []Hop
	Positions int
	Bytes     int64
	Took      time.Duration
}

// Moves returns the stages moved so far, in order.
func (p *Pipeline) Moves() []Move {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.moved)
}

// Stages returns the chain's stages now: those it was opened with, or after a move those
// of the re-linked chain.
func (p *Pipeline) Stages() []Hop {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.stages)
}

// relink moves the stage that said it is leaving, if there is a replacement and its rows
// fit the bounds; else the chain goes on as it is. A failure once the chain was ended
// breaks the pipeline, with a retryable error naming the leaving stage: the caller
// replays the generation elsewhere, as for any stage lost.
func (p *Pipeline) relink(ctx context.Context) error {
	i := p.leaving
	p.leaving = -1 // one try per notice
	old := p.stages[i]
	began := time.Now()
	layers, width := old.Hi-old.Lo, p.width
	if p.moves == nil || kvPerFrame(width, layers) < 1 || int64(p.positions)*int64(rowBytes(width, layers)) > MaxMoveBytes {
		return nil
	}
	repl, err := p.moves(ctx, old.Lo, old.Hi, old.Peer, slices.Clone(p.stages))
	if err == nil {
		err = p.checkReplacement(i, repl)
	}
	if err != nil {
		log.Debugw("leaving stage not moved", "peer", old.Peer, "model", p.model, "err", err)
		return nil
	}
	if err := p.keepChain(); err != nil {
		return err
	}
	bytes, err := p.reopen(ctx, i, repl)
	if err != nil {
		code := inference.CodeOf(err)
		if !code.Retryable() {
			code = inference.CodeUnavailable
		}
		return p.fail(inference.Errorf(code, "%w: moving its layers [%d, %d): %v", &FailedStage{Index: i, Peer: old.Peer}, old.Lo, old.Hi, err))
	}
	p.mu.Lock()
	p.moved = append(p.moved, Move{Index: i, From: old.Peer, To: slices.Clone(repl), Positions: p.positions, Bytes: bytes, Took: time.Since(began)})
	p.mu.Unlock()
	return nil
}

// checkReplacement checks that repl can take stage i's layers: contiguous hops covering
// them exactly, on peers that are neither the head nor in the chain.
func (p *Pipeline) checkReplacement(i int, repl []Hop) error {
	old := p.stages[i]
	if len(repl) == 0 || repl[0].Lo != old.Lo || repl[len(repl)-1].Hi != old.Hi || len(p.stages)-1+len(repl) > MaxStages {
		return fmt.Errorf("replacement %v does not cover layers [%d, %d)", repl, old.Lo, old.Hi)
	}
	for j, h := range repl {
		if h.Hi <= h.Lo || j > 0 && h.Lo != repl[j-1].Hi {
			return fmt.Errorf("replacement %v is not contiguous", repl)
		}
		if h.Peer == p.head || slices.ContainsFunc(p.stages, func(s Hop) bool { return s.Peer == h.Peer }) ||
			slices.ContainsFunc(repl[:j], func(s Hop) bool { return s.Peer == h.Peer }) {
			return fmt.Errorf("replacement peer %s is the head or in the chain", h.Peer)
		}
	}
	return nil
}

// keepChain ends the chain with a keep end: every stage passes it on and keeps its
// session, and the last stage's keep on the return stream says they all did, within
// CloseTimeout. It then closes the chain's streams.
func (p *Pipeline) keepChain() error {
	last := len(p.stages) - 1
	p.relinking.Store(true)
	up, ret := p.streams()
	deadline := time.Now().Add(CloseTimeout)
	up.SetWriteDeadline(deadline)
	if err := frame.Write(up, []byte{frameKeep}); err != nil {
		return p.fail(p.lost(0, "keep", err))
	}
	ret.SetReadDeadline(deadline)
	body, err := p.retR.Next()
	switch {
	case err != nil:
		if e := p.broken(); e != nil {
			return e
		}
		if isTimeout(err) {
			return p.fail(p.stageErr(inference.CodeTimeout, last, "no keep within %v", CloseTimeout))
		}
		return p.fail(p.lost(last, "keep", err))
	case len(body) > 0 && body[0] == frameError:
		f, derr := decodeError(body, headStage, len(p.stages))
		if derr != nil {
			return p.fail(p.lost(last, "keep", derr))
		}
		return p.fail(p.faultErr(f))
	case len(body) != 1 || body[0] != frameKeep:
		return p.fail(p.lost(last, "keep", fmt.Errorf("%w: frame %#x in answer to keep", errProtocol, body[0])))
	}
	up.Close()
	ret.Close()
	p.mu.Lock()
	watched := p.watched
	p.mu.Unlock()
	<-watched
	return nil
}

// reopen opens the re-linked chain: stage i replaced by repl, every other stage adopting
// its kept session, and the rows moved from the leaving stage into repl. It returns the
// rows' bytes.
func (p *Pipeline) reopen(ctx context.Context, i int, repl []Hop) (int64, error) {
	old := p.stages[i]
	hops := slices.Concat(p.stages[:i], repl, p.stages[i+1:])
	o := &open{
		head: p.head, model: p.model, maxPositions: p.maxPos, maxBatch: p.askBatch, hops: hops, timing: true,
		moves: true, adopt: p.session, adopting: true, positions: p.positions, loads: make([]bool, len(hops)),
	}
	for j := range repl {
		o.loads[i+j] = true
	}
	rand.Read(o.session[:])
	for _, hop := range hops {
		o.addrs = append(o.addrs, dialable(p.h.Peerstore().Addrs(hop.Peer)))
	}
	body := encodeOpen(o)
	if err := checkChain(p.h, o, body); err != nil {
		return 0, err
	}
	oldSession, width := p.session, p.width
	watched := make(chan struct{})
	p.mu.Lock()
	p.stages, p.session, p.up, p.ret, p.watched = hops, o.session, nil, nil, watched
	p.mu.Unlock()
	p.step, p.seen, p.receipted = 0, 0, false
	octx, cancel := context.WithTimeout(ctx, OpenTimeout)
	defer cancel()
	upR, err := p.open(octx, p.h, o, body, p.askBatch)
	if err == nil && (p.width != width || !p.movable) {
		err = inference.Errorf(inference.CodeUnavailable, "the re-linked chain is not the same model's, or not movable")
	}
	if err != nil {
		close(watched) // no watcher: nothing to wait for
		return 0, err
	}
	p.relinking.Store(false)
	p.startWatch(upR, watched)
	if e := p.broken(); e != nil {
		return 0, e // Close came during the set-up
	}
	tctx, cancel := context.WithTimeout(ctx, DefaultStepTimeout)
	defer cancel()
	return p.moveRows(tctx, old, oldSession, i, repl)
}

// moveRows fetches the leaving stage's rows (old, its session oldSession) and relays them,
// split by layer, into the replacements repl at stage i of the re-linked chain, which
// answer ready once loaded. Every wait is bounded by ctx.
func (p *Pipeline) moveRows(ctx context.Context, old Hop, oldSession [sessionIDLen]byte, i int, repl []Hop) (bytes int64, err error) {
	var (
		streams []network.Stream
		stops   []func() bool
	)
	defer func() {
		for _, stop := range stops {
			stop()
		}
		for _, st := range streams {
			if err != nil {
				st.Reset()
			} else {
				st.Close()
			}
		}
	}()
	dial := func(to peer.ID, first []byte) (network.Stream, error) {
		st, err := p.h.NewStream(ctx, to, ID)
		if err != nil {
			return nil, fmt.Errorf("open stream to %s: %w", to, err)
		}
		streams = append(streams, st)
		stops = append(stops, context.AfterFunc(ctx, func() { st.Reset() })) // cuts a wait past ctx
		if err := st.Scope().SetService(ServiceName); err != nil {
			return nil, err
		}
		if d, ok := ctx.Deadline(); ok {
			st.SetDeadline(d)
		}
		return st, frame.Write(st, first)
	}
	fetch, err := dial(old.Peer, encodeSessionFrame(frameFetch, oldSession))
	if err != nil {
		return 0, err
	}
	if err := fetch.Scope().ReserveMemory(kvFrameMax, network.ReservationPriorityHigh); err != nil {
		return 0, inference.Errorf(inference.CodeOverloaded, "head: no memory for kv frames: %v", err)
	}
	defer fetch.Scope().ReleaseMemory(kvFrameMax)
	loads := make([]network.Stream, len(repl))
	for j, h := range repl {
		if loads[j], err = dial(h.Peer, encodeSessionFrame(frameLoad, p.session)); err != nil {
			return 0, err
		}
	}
	r := frame.NewReader(fetch, kvFrameMax)
	var (
		buf []float32
		out []byte
	)
	for pos := 0; ; {
		body, err := r.Next()
		switch {
		case err != nil:
			observe(p.observer, old.Peer, err)
			return bytes, fmt.Errorf("fetch rows: %w", err)
		case len(body) == 1 && body[0] == frameEnd:
			if pos != p.positions {
				err = fmt.Errorf("%w: rows of %d positions, the chain holds %d", errProtocol, pos, p.positions)
				observe(p.observer, old.Peer, err)
				return bytes, err
			}
			return bytes, p.loaded(loads, i)
		case len(body) > 0 && body[0] == frameError:
			f, derr := decodeError(body, headStage, headStage+1)
			if derr != nil {
				return bytes, derr
			}
			return bytes, inference.Errorf(f.code, "the leaving stage: %s", f.msg)
		}
		rows, err := decodeKV(body, p.width, old.Hi-old.Lo, pos, buf)
		if err == nil && pos+rows.N > p.positions {
			err = fmt.Errorf("%w: rows past the chain's %d positions", errProtocol, p.positions)
		}
		if err != nil {
			observe(p.observer, old.Peer, err)
			return bytes, err
		}
		per := 2 * rows.N * p.width // values of one layer
		for j, h := range repl {
			sub := inference.KVRows{Pos: pos, N: rows.N, Data: rows.Data[(h.Lo-old.Lo)*per : (h.Hi-old.Lo)*per]}
			out = appendKVFrame(out[:0], sub)
			if _, err := loads[j].Write(out); err != nil {
				return bytes, p.lost(i+j, "load rows", err)
			}
		}
		buf, pos, bytes = rows.Data, pos+rows.N, bytes+int64(4*len(rows.Data))
	}
}

// loaded ends each load stream and reads its answer: ready once the replacement loaded
// the rows, or an error frame.
func (p *Pipeline) loaded(loads []network.Stream, i int) error {
	for j, st := range loads {
		if err := frame.Write(st, []byte{frameEnd}); err != nil {
			return p.lost(i+j, "end rows", err)
		}
		body, err := frame.NewReader(st, MaxErrorFrame).Next()
		switch {
		case err != nil:
			return p.lost(i+j, "read load answer", err)
		case len(body) > 0 && body[0] == frameError:
			f, derr := decodeError(body, headStage, len(p.stages))
			if derr != nil {
				return p.lost(i+j, "read load answer", derr)
			}
			f.stage = i + j // it concerns the load at that stage alone
			return p.faultErr(f)
		}
		if w, _, err := decodeReady(body, 0); err != nil || w != p.width {
			return p.lost(i+j, "read load answer", errors.Join(err, fmt.Errorf("%w: width %d", errProtocol, w)))
		}
	}
	return nil
}

// timesAfter is the per-stage times of a chain of n stages opened by o: those of old for
// the stages a re-linked chain kept (old being the chain's before, with the leaving stage
// where o's loading hops are), none for the others.
func timesAfter(old []time.Duration, n int, o *open) []time.Duration {
	out := make([]time.Duration, n)
	loads := 0
	for _, l := range o.loads {
		if l {
			loads++
		}
	}
	if !o.adopting || len(old) != n-loads+1 {
		return out
	}
	src := 0
	for j := range n {
		if o.loads[j] {
			if j == 0 || !o.loads[j-1] {
				src++ // the leaving stage's slot
			}
			continue
		}
		out[j] = old[src]
		src++
	}
	return out
}
