package infer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// A live handover on the wire (doc.go, "Handing a generation over"): the leaving server's
// side is its answerWriter's kv frames and moved frame (server.go) and HandOver; the
// requester's is its answer's reading of them (client.go) and Resume; the replacement's is
// transfer.

// HandOver asks every running generation whose client takes a handover (its request frame
// said "handover") to move: from its next token it sends its KV cache in kv frames and ends
// with the moved frame, and its client resumes it elsewhere. A Generator that cannot hand
// a generation over runs it on to its end. It returns how many generations were asked; the
// node calls it when it leaves with notice, before Close.
func (s *Server) HandOver() int {
	s.mu.Lock()
	moves := make([]*inference.Move, 0, len(s.moves))
	for m := range s.moves {
		moves = append(moves, m)
	}
	s.mu.Unlock()
	for _, m := range moves {
		m.Start()
	}
	return len(moves)
}

// track adds m to the moves HandOver starts, or removes it (add false).
func (s *Server) track(m *inference.Move, add bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		s.moves[m] = struct{}{}
	} else {
		delete(s.moves, m)
	}
}

// transfer runs a resumption's transfer phase, admitted and holding its slot: it readies
// the generation (the Resumer's Resume), writes the ready frame with its shape, then loads
// the kv frames the client sends, in order, until its go frame, whose replay it returns.
// The phase is bounded by TransferTimeout from its start. Otherwise it has answered the
// client and returns false with the outcome: an error frame (the backend's error; rows
// refused or a bad replay, at the go frame; the timeout; shutting down), or a reset
// (OutcomeClientDisconnected: the client went away or broke the protocol). rs, when not
// nil, is the caller's to close either way.
func (s *Server) transfer(from peer.ID, st Stream, req *inference.Request, resumer inference.Resumer, in *inbound) (rs inference.Resumption, replay []int, outcome string, ok bool) {
	deadline := time.Now().Add(TransferTimeout)
	ctx, cancel := context.WithDeadline(s.ctx, deadline)
	defer cancel()
	fail := func(err error) (inference.Resumption, []int, string, bool) {
		if s.ctx.Err() != nil {
			err = inference.Errorf(inference.CodeShuttingDown, "node is shutting down")
		}
		return rs, nil, s.finish(st, nil, nil, err, nil), false
	}
	violated := func(err error) (inference.Resumption, []int, string, bool) {
		s.violated(from, st, err)
		return rs, nil, OutcomeClientDisconnected, false
	}
	rs, err := resumer.Resume(ctx, req)
	if err != nil {
		return fail(err)
	}
	shape := rs.Shape()
	st.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if err := frame.Write(st, encodeReady(shape)); err != nil {
		s.disconnected.Add(1)
		st.Reset()
		return rs, nil, OutcomeClientDisconnected, false
	}
	// Close ends the wait at once (the client gets a shutting_down frame).
	stop := context.AfterFunc(s.ctx, func() { st.SetReadDeadline(time.Now().Add(-time.Hour)) })
	defer stop()
	st.SetReadDeadline(deadline)
	r := frame.NewReader(in.r, MaxKVFrame)
	// refused is why the rows or the replay were refused. The error frame waits for the go
	// frame, where the answer would come: the client writes its rows without reading, so
	// the rows after a refusal are read on (and dropped) rather than left to fill the
	// stream's window, where its writes would block.
	var refused error
	var kvData []float32 // the last kv frame's values, reused for the next
	for {
		in.m.Take() // the frame alone
		body, err := r.Next()
		switch {
		case err != nil && s.ctx.Err() != nil:
			return fail(err)
		case err != nil && isTimeout(err):
			return fail(inference.Errorf(inference.CodeTimeout, "no go frame within %v", TransferTimeout))
		case err != nil && !errors.Is(err, frame.ErrTooLarge) && !errors.Is(err, frame.ErrMalformed):
			s.disconnected.Add(1) // EOF, a reset: the client went away
			st.Reset()
			return rs, nil, OutcomeClientDisconnected, false
		case err != nil:
			return violated(err)
		case len(body) == 0:
			return violated(fmt.Errorf("%w: an empty frame in a transfer", errProtocol))
		}
		switch body[0] {
		case frameKV:
			rows, err := decodeKV(body, kvData)
			if err != nil {
				return violated(err)
			}
			kvData = rows.Data
			if s.transfers != nil && len(body) >= bandwidth.MinBytes {
				s.transfers(from, in.m.Take())
			}
			if refused == nil {
				if refused = rows.Check(shape); refused == nil {
					refused = rs.Load(rows)
				}
			}
		case frameGo:
			replay, err := decodeGo(body)
			if err != nil {
				return violated(err)
			}
			if refused == nil {
				refused = checkReplay(req, replay)
			}
			if refused != nil {
				return fail(refused)
			}
			return rs, replay, "", true
		default:
			return violated(fmt.Errorf("%w: frame type %#x in a transfer", errProtocol, body[0]))
		}
	}
}

// Resume opens a resumption of req on peer p: a generation another peer began and handed
// over (Generate ended with *inference.Moved). p checks req as it checks a request, readies
// the generation and answers with its model's shape; the returned Resumption then takes the
// rows the leaving peer sent (Load) and runs the generation on (Generate, with the tokens
// the caller has as replay). req.Replay must be empty: the replay goes to Generate. The
// stream is fresh and never reused; ctx bounds the set-up only (Load is bounded by
// WriteTimeout, Generate by its own ctx). Failures are Generate's: unavailable when no
// stream could be opened or p cannot resume, timeout when it stays silent for the
// first-token timeout, the peer's error, peer_lost.
func (c *Client) Resume(ctx context.Context, p peer.ID, req *inference.Request) (inference.Resumption, error) {
	if len(req.Replay) > 0 {
		return nil, inference.Errorf(inference.CodeInvalidRequest, "a resumption's replay goes to its Generate, not its request")
	}
	body, err := encodeBounded(req, requestOpts{receipt: c.receipts, handover: req.Move != nil, resume: true})
	if err != nil {
		return nil, err
	}
	st, err := c.open(ctx, p)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()
	st.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if err := frame.Write(st, body); err != nil {
		st.Reset()
		return nil, c.lost(ctx, p, "send request", err)
	}
	a := c.newAnswer(st, p, req)
	st.SetReadDeadline(time.Now().Add(c.firstToken))
	fb, err := a.r.Next()
	if err != nil {
		st.Reset()
		if isTimeout(err) && ctx.Err() == nil {
			return nil, inference.Errorf(inference.CodeTimeout, "peer %s not ready within %v", p, c.firstToken)
		}
		return nil, c.lost(ctx, p, "read", err)
	}
	var shape inference.ModelShape
	switch {
	case len(fb) > maxFrame:
		err = fmt.Errorf("%w: frame of %d bytes, max %d", frame.ErrTooLarge, len(fb), maxFrame)
	case len(fb) > 0 && fb[0] == frameReady:
		shape, err = decodeReady(fb)
	case len(fb) > 0 && fb[0] == frameError:
		if _, err = decodeTerminal(fb); !errors.Is(err, errProtocol) {
			st.Close()
			return nil, err
		}
	default:
		err = fmt.Errorf("%w: no ready frame", errProtocol)
	}
	if err != nil {
		st.Reset()
		return nil, c.lost(ctx, p, "read", err)
	}
	return &resumption{a: a, shape: shape}, nil
}

// resumption is the requester's side of a Resume: the stream to the replacement, its rows
// sent, then its answer.
type resumption struct {
	a       *answer // the stream, and its answer once the go frame is sent
	shape   inference.ModelShape
	loaded  int    // positions sent
	kvFrame []byte // reused for each kv frame

	mu      sync.Mutex
	started bool // Generate was called
	ended   bool // the answer was read to its terminal frame
	closed  bool
}

func (r *resumption) Shape() inference.ModelShape { return r.shape }

// Load sends rows in a kv frame. They must be well formed for the shape, start where the
// rows sent so far end and stay within the context window; otherwise invalid_request, and
// nothing is sent. A failed write resets the stream (peer_lost).
func (r *resumption) Load(rows inference.KVRows) error {
	if err := rows.Check(r.shape); err != nil {
		return err
	}
	r.mu.Lock()
	usable := !r.started && !r.closed
	r.mu.Unlock()
	switch {
	case !usable:
		return inference.Errorf(inference.CodeInvalidRequest, "KV rows loaded into a resumption generating or closed")
	case rows.Pos != r.loaded:
		return inference.Errorf(inference.CodeInvalidRequest, "KV rows at %d, want %d", rows.Pos, r.loaded)
	case rows.Pos+rows.N > r.shape.Context:
		return inference.Errorf(inference.CodeInvalidRequest, "KV rows up to %d past the context of %d", rows.Pos+rows.N, r.shape.Context)
	}
	if err := checkKV(rows); err != nil {
		return inference.Errorf(inference.CodeInvalidRequest, "%v", err)
	}
	r.kvFrame = appendKVFrame(r.kvFrame[:0], rows)
	st := r.a.st
	st.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if _, err := st.Write(r.kvFrame); err != nil {
		st.Reset()
		return r.a.c.lost(context.Background(), r.a.p, "send KV rows", err)
	}
	r.loaded += rows.N
	return nil
}

// Generate sends the go frame with replay (checked as a request's replay is) and reads the
// answer as Client.Generate does: tokens from index 0, then the result or an error.
func (r *resumption) Generate(ctx context.Context, replay []int, emit func(inference.Token) error) (inference.Result, error) {
	r.mu.Lock()
	usable := !r.started && !r.closed
	r.started = true
	r.mu.Unlock()
	if !usable {
		return inference.Result{}, inference.Errorf(inference.CodeInvalidRequest, "a resumption generates once, and not once closed")
	}
	if err := checkReplay(r.a.req, replay); err != nil {
		return inference.Result{}, err
	}
	body, err := encodeGo(replay)
	if err != nil {
		return inference.Result{}, err
	}
	a := r.a
	stop := context.AfterFunc(ctx, func() { a.st.Reset() })
	defer stop()
	a.st.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if err := frame.Write(a.st, body); err != nil {
		a.st.Reset()
		return inference.Result{}, a.c.lost(ctx, a.p, "send go frame", err)
	}
	res, err := a.read(ctx, emit)
	r.mu.Lock()
	r.ended = a.ended
	r.mu.Unlock()
	return res, err
}

// Close closes the stream once the answer was read to its end, and resets it otherwise (the
// replacement drops the generation). Idempotent.
func (r *resumption) Close() error {
	r.mu.Lock()
	closed, ended := r.closed, r.ended
	r.closed = true
	r.mu.Unlock()
	switch {
	case closed:
		return nil
	case ended:
		return r.a.st.Close()
	}
	return r.a.st.Reset()
}
