package infer

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/reputation"
)

// handoverModel is the model of the handover tests: big enough that a long prompt's rows
// run to frames of over 64 KiB (8 KiB a position), small enough to be quick.
const handoverModel = "synth-small"

// mesh3 is a requester H with a client, a leaving server A and a replacement B, each
// serving the synthetic models on its own libp2p host.
type mesh3 struct {
	h      *Client
	hh     host.Host
	a, b   *Server
	ah, bh host.Host
	be     *synth.Backend // B's backend, also the uninterrupted reference
}

func newMesh3(t *testing.T, aOpts []synth.Option, bGen func(*synth.Backend) Generator, bOpts []ServerOption, copts ...ClientOption) mesh3 {
	t.Helper()
	beA, err := synth.NewWith([]string{handoverModel}, aOpts)
	if err != nil {
		t.Fatal(err)
	}
	beB, err := synth.New(handoverModel)
	if err != nil {
		t.Fatal(err)
	}
	var genB Generator = beB
	if bGen != nil {
		genB = bGen(beB)
	}
	hh, ah, bh := newHost(t), newHost(t), newHost(t)
	a, b := NewServer(ah, beA), NewServer(bh, genB, bOpts...)
	t.Cleanup(func() { a.Close(); b.Close() })
	connect(t, hh, ah)
	connect(t, hh, bh)
	return mesh3{h: NewClient(hh, copts...), hh: hh, a: a, b: b, ah: ah, bh: bh, be: beB}
}

// handoverRequest is a request to synth-small with a prompt long enough for rows of over
// 64 KiB: greedy (temperature 0) or sampled with a seed.
func handoverRequest(maxTokens int, greedy, stream bool) *inference.Request {
	req := request(maxTokens)
	req.Model = handoverModel
	req.Messages[0].Content = strings.Repeat("move this generation along ", 2)
	req.Stream = stream
	if greedy {
		zero := 0.0
		req.Temperature = &zero
	}
	return req
}

// taken keeps the rows a handover sends, copied (Send may not keep them).
type taken struct {
	mu   sync.Mutex
	rows []inference.KVRows
}

func (k *taken) send(r inference.KVRows) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.rows = append(k.rows, inference.KVRows{Pos: r.Pos, N: r.N, Data: slices.Clone(r.Data)})
	return nil
}

func (k *taken) positions() int {
	n := 0
	for _, r := range k.rows {
		n += r.N
	}
	return n
}

// reference is the uninterrupted run of req on be.
func reference(t *testing.T, be *synth.Backend, req *inference.Request) ([]inference.Token, inference.Result) {
	t.Helper()
	var toks []inference.Token
	r := *req
	r.Move = nil
	res, err := be.Generate(t.Context(), &r, collect(&toks))
	if err != nil {
		t.Fatal(err)
	}
	return toks, res
}

// handOver runs req from H on A, which leaves (HandOver) once H has its first token: it
// returns the tokens H got, the rows it took and the *Moved Generate ended with.
func handOver(t *testing.T, m mesh3, req *inference.Request) ([]inference.Token, *taken, *inference.Moved) {
	t.Helper()
	movedBefore := m.a.Stats().Moved
	k := &taken{}
	r := *req
	r.Move = &inference.Move{Send: k.send}
	var toks []inference.Token
	_, err := m.h.Generate(t.Context(), m.ah.ID(), &r, func(tok inference.Token) error {
		if len(toks) == 0 {
			if n := m.a.HandOver(); n != 1 {
				t.Errorf("HandOver asked %d generations, want 1", n)
			}
		}
		toks = append(toks, tok)
		return nil
	})
	moved, ok := errors.AsType[*inference.Moved](err)
	if !ok {
		t.Fatalf("Generate ended with %v, want *Moved", err)
	}
	if moved.Tokens != len(toks) || moved.Positions != k.positions() || moved.Positions == 0 {
		t.Fatalf("moved %+v, with %d tokens and %d positions received", moved, len(toks), k.positions())
	}
	next := 0
	for _, rows := range k.rows {
		if rows.Pos != next {
			t.Fatalf("rows at %d, want %d", rows.Pos, next)
		}
		next += rows.N
	}
	waitFor(t, "A to count the generation moved", func() bool {
		st := m.a.Stats()
		return st.Moved == movedBefore+1 && st.InFlight == 0
	})
	return toks, k, moved
}

// resume resumes req on B with rows and the tokens H has as replay, and returns the stream
// B answers.
func resume(t *testing.T, m mesh3, req *inference.Request, rows []inference.KVRows, have []inference.Token) ([]inference.Token, inference.Result) {
	t.Helper()
	rs, err := m.h.Resume(t.Context(), m.bh.ID(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	if s := rs.Shape(); s.Layers != 4 || s.Width != 256 {
		t.Fatalf("shape %+v, want synth-small's", s)
	}
	for _, r := range rows {
		if err := rs.Load(r); err != nil {
			t.Fatal(err)
		}
	}
	replay := make([]int, len(have))
	for i, tok := range have {
		replay[i] = tok.ID
	}
	var toks []inference.Token
	res, err := rs.Generate(t.Context(), replay, collect(&toks))
	if err != nil {
		t.Fatal(err)
	}
	return toks, res
}

// cut is rows' first n positions: a transfer cut after them.
func cut(rows []inference.KVRows, n int) []inference.KVRows {
	var out []inference.KVRows
	for _, r := range rows {
		if r.Pos >= n {
			break
		}
		if r.Pos+r.N <= n {
			out = append(out, r)
			continue
		}
		out = append(out, prefixRows(r, n-r.Pos))
	}
	return out
}

// prefixRows is r's first n positions, in KVRows' layout.
func prefixRows(r inference.KVRows, n int) inference.KVRows {
	shape := synthShape()
	w := shape.Width
	p := inference.KVRows{Pos: r.Pos, N: n}
	for l := range shape.Layers {
		base := l * 2 * r.N * w
		p.Data = append(p.Data, r.Data[base:base+n*w]...)
		p.Data = append(p.Data, r.Data[base+r.N*w:base+r.N*w+n*w]...)
	}
	return p
}

func synthShape() inference.ModelShape {
	p, _ := synth.LookupPreset(handoverModel)
	return p.Shape()
}

// A generation handed over from A through H to B goes on with exactly the tokens of an
// uninterrupted run, greedy or sampled, streamed or batched, whether B got every row, half
// of them or none (a transfer cut: the rest is prefilled from the replay), and on either
// protocol version.
func TestHandoverResumesTheSameStream(t *testing.T) {
	m := newMesh3(t, nil, nil, nil)
	for _, greedy := range []bool{true, false} {
		req := handoverRequest(24, greedy, true)
		want, wantRes := reference(t, m.be, req)
		have, k, moved := handOver(t, m, req)
		if len(have) >= len(want) || !slices.Equal(have, want[:len(have)]) {
			t.Fatalf("greedy %v: the %d tokens before the move are not the reference's", greedy, len(have))
		}
		for _, part := range []struct {
			name string
			rows []inference.KVRows
		}{
			{"all rows", k.rows},
			{"half the rows", cut(k.rows, moved.Positions/2)},
			{"no rows", nil},
		} {
			got, res := resume(t, m, handoverRequest(24, greedy, true), part.rows, have)
			if !slices.Equal(got, want) {
				t.Fatalf("greedy %v, %s: resumed stream differs from the uninterrupted one:\n got %v\nwant %v", greedy, part.name, got, want)
			}
			if res.FinishReason != wantRes.FinishReason || res.Usage.CompletionTokens != len(want) {
				t.Fatalf("greedy %v, %s: result %+v, want %+v", greedy, part.name, res, wantRes)
			}
		}
	}
	// On 1.0.0: a replacement that does not speak 1.1.0.
	m.bh.RemoveStreamHandler(ReuseID)
	req := handoverRequest(24, false, true)
	want, _ := reference(t, m.be, req)
	have, k, _ := handOver(t, m, req)
	if got, _ := resume(t, m, handoverRequest(24, false, true), k.rows, have); !slices.Equal(got, want) {
		t.Fatalf("resumed on 1.0.0: got %v, want %v", got, want)
	}
	waitFor(t, "B to count its resumptions served", func() bool {
		st := m.b.Stats()
		return st.Served == 7 && st.InFlight == 0 && st.ProtocolErrors == 0
	})
}

// A non-streaming answer's batched tokens go out before the first kv frame: a generation
// asked to move before its first token sends that token, then its rows (all of them, a
// small cache, in one pre-copy), then the next token, and stops with the one row that
// token added (a tick that pre-copied does not stop too).
func TestHandoverFlushesBatchedTokensFirst(t *testing.T) {
	gate := make(chan struct{})
	m := newMesh3(t, []synth.Option{synth.WithLoadGate(gate)}, nil, nil)
	req := handoverRequest(24, true, false)
	want, _ := reference(t, m.be, req)
	k := &taken{}
	r := *req
	r.Move = &inference.Move{Send: func(rows inference.KVRows) error {
		if k.positions() == 0 && rows.Pos != 0 {
			t.Errorf("first rows at %d", rows.Pos)
		}
		return k.send(rows)
	}}
	var toks []inference.Token
	var rowsBefore []int // positions received before each token
	done := make(chan error, 1)
	go func() {
		_, err := m.h.Generate(context.Background(), m.ah.ID(), &r, func(tok inference.Token) error {
			toks, rowsBefore = append(toks, tok), append(rowsBefore, k.positions())
			return nil
		})
		done <- err
	}()
	waitFor(t, "A to admit the request", func() bool { return m.a.Stats().InFlight == 1 })
	if n := m.a.HandOver(); n != 1 {
		t.Fatalf("HandOver asked %d generations, want 1", n)
	}
	close(gate)
	err := <-done
	moved, ok := errors.AsType[*inference.Moved](err)
	if !ok || moved.Tokens != len(toks) || moved.Tokens != 2 || moved.Positions != k.positions() {
		t.Fatalf("Generate ended with %v after %d tokens and %d positions, want *Moved after the second token", err, len(toks), k.positions())
	}
	if rowsBefore[0] != 0 || rowsBefore[1] != moved.Positions-1 {
		t.Fatalf("positions received before each token %v, want none before the first and all but the last before the second (of %d)", rowsBefore, moved.Positions)
	}
	if !slices.Equal(toks, want[:2]) {
		t.Fatalf("tokens %+v, want %+v", toks, want[:2])
	}
	if got, _ := resume(t, m, handoverRequest(24, true, false), k.rows, toks); !slices.Equal(got, want) {
		t.Fatalf("resumed: got %v, want %v", got, want)
	}
}

// A kv frame of at least 64 KiB is a transfer, timed and reported on both sides: by H as
// it reads A's rows, by B as it reads H's.
func TestHandoverTransfersAreMetered(t *testing.T) {
	var mu sync.Mutex
	var atH, atB []bandwidth.Transfer
	note := func(to *[]bandwidth.Transfer) func(peer.ID, bandwidth.Transfer) {
		return func(_ peer.ID, tr bandwidth.Transfer) {
			mu.Lock()
			defer mu.Unlock()
			*to = append(*to, tr)
		}
	}
	m := newMesh3(t, nil, nil, []ServerOption{WithServerTransfers(note(&atB))}, WithClientTransfers(note(&atH)))
	req := handoverRequest(24, true, true)
	have, k, _ := handOver(t, m, req)
	resume(t, m, handoverRequest(24, true, true), k.rows, have)
	big := 0
	for _, r := range k.rows {
		if len(appendKV(nil, r)) >= bandwidth.MinBytes {
			big++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if big == 0 || len(atH) != big {
		t.Fatalf("H reported %d transfers, want the %d kv frames of 64 KiB or more", len(atH), big)
	}
	// B also reports its request frame (a short one, no sample).
	if len(atB) != big+1 {
		t.Fatalf("B reported %d transfers, want its request and the %d big kv frames", len(atB), big)
	}
	for _, tr := range append(slices.Clone(atH), atB[1:]...) {
		if tr.Dir != bandwidth.Down || tr.Bytes < bandwidth.MinBytes/2 {
			t.Fatalf("transfer %+v: not a kv frame's", tr)
		}
	}
}

// plain hides its backend's Resumer: a node that cannot resume.
type plain struct{ g Generator }

func (p plain) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	return p.g.Generate(ctx, req, emit)
}

// A replacement whose backend cannot resume refuses with unavailable, before any row.
func TestResumeOnANodeThatCannotResume(t *testing.T) {
	m := newMesh3(t, nil, func(be *synth.Backend) Generator { return plain{be} }, nil)
	_, err := m.h.Resume(t.Context(), m.bh.ID(), handoverRequest(8, true, true))
	if inference.CodeOf(err) != inference.CodeUnavailable || !strings.Contains(err.Error(), "cannot resume") {
		t.Fatalf("err %v, want unavailable", err)
	}
	// And the requester's own checks: a replay goes to Generate.
	req := handoverRequest(8, true, true)
	req.Replay = []int{1}
	if _, err := m.h.Resume(t.Context(), m.bh.ID(), req); inference.CodeOf(err) != inference.CodeInvalidRequest {
		t.Fatalf("a request with a replay: %v, want invalid_request", err)
	}
}

// rawResume opens a resumption on B by hand: a stream, the request frame, its ready frame.
func rawResume(t *testing.T, m mesh3, req *inference.Request) (network.Stream, *frame.Reader) {
	t.Helper()
	st, err := m.hh.NewStream(t.Context(), m.bh.ID(), ReuseID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Reset() })
	body, err := encodeBounded(req, requestOpts{resume: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := frame.Write(st, body); err != nil {
		t.Fatal(err)
	}
	r := frame.NewReader(st, MaxKVFrame)
	fb, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodeReady(fb); err != nil {
		t.Fatalf("first frame %q: %v", fb, err)
	}
	return st, r
}

// A requester that breaks a resumption's transfer phase gets the right answer from B, never
// a hang: rows B refuses and a bad replay are invalid_request error frames; a frame that has
// no place there, an oversized kv frame, a kv frame that does not decode, or a replay in the
// request frame reset the stream and count against the requester.
func TestHostileResumption(t *testing.T) {
	var seen observed
	m := newMesh3(t, nil, nil, []ServerOption{WithServerObserver(&seen)})
	shape := synthShape()
	goFrame := append([]byte{frameGo}, `{"replay":[4]}`...)
	tests := []struct {
		name     string
		frames   [][]byte // sent after the ready frame
		wantCode inference.Code
	}{
		{"rows out of order", [][]byte{appendKV(nil, kvRows(shape, 0, 2)), appendKV(nil, kvRows(shape, 5, 1)), goFrame}, inference.CodeInvalidRequest},
		{"rows of another shape", [][]byte{appendKV(nil, kvRows(tinyShape, 0, 1)), goFrame}, inference.CodeInvalidRequest},
		// Refused at the second frame: the rest is read on, and the refusal answers the go frame.
		{"rows past the generation", [][]byte{appendKV(nil, kvRows(shape, 0, 120)), appendKV(nil, kvRows(shape, 120, 120)),
			appendKV(nil, kvRows(shape, 240, 120)), appendKV(nil, kvRows(shape, 360, 120)), goFrame}, inference.CodeInvalidRequest},
		{"a negative replay", [][]byte{appendKV(nil, kvRows(shape, 0, 2)), append([]byte{frameGo}, `{"replay":[4,-1]}`...)}, inference.CodeInvalidRequest},
		{"a replay of the whole budget", [][]byte{append([]byte{frameGo}, `{"replay":[1,2,3,4,5,6,7,8]}`...)}, inference.CodeInvalidRequest},
		{"a token frame", [][]byte{encodeToken(nil, inference.Token{Index: 0, ID: 1, Text: "a"})}, ""},
		{"a kv frame that does not decode", [][]byte{kvFrame(0, 1, make([]byte, 6))}, ""},
		{"a go frame that does not decode", [][]byte{append([]byte{frameGo}, `{"replay":`...)}, ""},
		{"an oversized kv frame", [][]byte{append(kvFrame(0, 1, nil), make([]byte, MaxKVFrame)...)}, ""},
		{"an empty frame", [][]byte{{}}, ""},
	}
	violations := 0
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, r := rawResume(t, m, handoverRequest(8, true, true))
			for _, f := range tt.frames {
				if frame.Write(st, f) != nil {
					break // B reset the stream already
				}
			}
			fb, err := r.Next()
			if tt.wantCode == "" {
				violations++
				if err == nil {
					t.Fatalf("B answered %q, want a reset", fb)
				}
				waitFor(t, "B to record the violation", func() bool { return len(seen.events()) == violations })
				return
			}
			if err != nil || len(fb) == 0 || fb[0] != frameError {
				t.Fatalf("B answered %q, %v; want an error frame", fb, err)
			}
			if _, err := decodeTerminal(fb); inference.CodeOf(err) != tt.wantCode {
				t.Fatalf("B answered %v, want %s", err, tt.wantCode)
			}
		})
	}
	// A request frame with resume and a replay is refused before anything is readied.
	st, err := m.hh.NewStream(t.Context(), m.bh.ID(), ID)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Reset()
	body, _ := encodeRequestOpts(handoverRequest(8, true, true), requestOpts{resume: true})
	body = append(body[:len(body)-1], `,"replay":[3]}`...)
	frame.Write(st, body)
	if fb, err := frame.ReadOne(st, MaxKVFrame); err == nil {
		t.Fatalf("B answered %q a resumption's request with a replay, want a reset", fb)
	}
	waitFor(t, "B to record the violation", func() bool { return len(seen.events()) == violations+1 })
	for _, e := range seen.events() {
		if !strings.HasPrefix(e, m.hh.ID().String()+" ") {
			t.Fatalf("observed %q, not of the requester", e)
		}
	}
	waitFor(t, "B to free every slot", func() bool { return m.b.Stats().InFlight == 0 })
	// The requester's side refuses a bad replay and rows that are not the next before
	// sending them.
	rs, err := m.h.Resume(t.Context(), m.bh.ID(), handoverRequest(8, true, true))
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	if err := rs.Load(kvRows(shape, 3, 1)); inference.CodeOf(err) != inference.CodeInvalidRequest {
		t.Fatalf("rows at 3 first: %v, want invalid_request", err)
	}
	if _, err := rs.Generate(t.Context(), []int{-1}, collect(new([]inference.Token))); inference.CodeOf(err) != inference.CodeInvalidRequest {
		t.Fatalf("a negative replay: %v, want invalid_request", err)
	}
}

// handoverLiar answers a handover request with the frames of answer: a leaving peer that
// sends what it likes.
func handoverLiar(t *testing.T, answer [][]byte, opts ...ClientOption) (*Client, peer.ID) {
	t.Helper()
	_, c, p := lyingServer(t, func(_ *inference.Request, write func([]byte) error) {
		for _, f := range answer {
			if write(f) != nil {
				return
			}
		}
	}, opts...)
	return c, p
}

// A leaving peer is held to what the requester asked and got: kv frames when no handover
// was asked, rows out of order, a moved frame whose counts are not what it sent, an
// oversized kv frame, and a moved frame without handover are protocol violations
// (peer_lost, recorded); an error from Move.Send ends Generate with it.
func TestHostileHandover(t *testing.T) {
	shape := synthShape()
	tok := func(i int) []byte { return encodeToken(nil, inference.Token{Index: i, ID: 7, Text: "a"}) }
	kv := func(pos, n int) []byte { return appendKV(nil, kvRows(shape, pos, n)) }
	moved := func(p, n int) []byte { return encodeMoved(&inference.Moved{Positions: p, Tokens: n}) }
	errSend := errors.New("the replacement is gone")
	tests := []struct {
		name     string
		handover bool
		sendErr  error
		answer   [][]byte
		wantErr  func(error) bool
		event    reputation.Event
	}{
		{name: "kv frame without handover", answer: [][]byte{tok(0), appendKV(nil, kvRows(tinyShape, 0, 1))}, event: reputation.ProtocolViolation},
		{name: "big kv frame without handover", answer: [][]byte{tok(0), kv(0, 2)}, event: reputation.MalformedFrame},
		{name: "moved frame without handover", answer: [][]byte{tok(0), moved(0, 1)}, event: reputation.ProtocolViolation},
		{name: "rows out of order", handover: true, answer: [][]byte{tok(0), kv(0, 2), kv(3, 1)}, event: reputation.ProtocolViolation},
		{name: "rows not from 0", handover: true, answer: [][]byte{tok(0), kv(1, 2)}, event: reputation.ProtocolViolation},
		{name: "more positions claimed", handover: true, answer: [][]byte{tok(0), kv(0, 2), moved(3, 1)}, event: reputation.ProtocolViolation},
		{name: "more tokens claimed", handover: true, answer: [][]byte{tok(0), kv(0, 2), moved(2, 2)}, event: reputation.ProtocolViolation},
		{name: "fewer tokens claimed", handover: true, answer: [][]byte{tok(0), tok(1), kv(0, 2), moved(2, 1)}, event: reputation.ProtocolViolation},
		{name: "oversized kv frame", handover: true, answer: [][]byte{tok(0), append(kvFrame(0, 1, nil), make([]byte, MaxKVFrame)...)}, event: reputation.MalformedFrame},
		{name: "oversized token frame", handover: true, answer: [][]byte{encodeToken(nil, inference.Token{Text: strings.Repeat("a", 2*MaxTokenFrame)})}, event: reputation.MalformedFrame},
		{name: "send fails", handover: true, sendErr: errSend, answer: [][]byte{tok(0), kv(0, 2), moved(2, 1)},
			wantErr: func(err error) bool { return errors.Is(err, errSend) }},
		{name: "an honest handover", handover: true, answer: [][]byte{tok(0), kv(0, 2), tok(1), kv(2, 3), moved(5, 2)},
			wantErr: func(err error) bool {
				m, ok := errors.AsType[*inference.Moved](err)
				return ok && *m == inference.Moved{Positions: 5, Tokens: 2}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen observed
			c, p := handoverLiar(t, tt.answer, WithClientObserver(&seen))
			req := handoverRequest(8, true, true)
			if tt.handover {
				req.Move = &inference.Move{Send: func(inference.KVRows) error { return tt.sendErr }}
			}
			_, err := c.Generate(t.Context(), p, req, collect(new([]inference.Token)))
			if tt.wantErr != nil {
				if !tt.wantErr(err) || len(seen.events()) != 0 {
					t.Fatalf("err %v, observed %q", err, seen.events())
				}
				return
			}
			if inference.CodeOf(err) != inference.CodePeerLost {
				t.Fatalf("err %v, want peer_lost", err)
			}
			if got := seen.events(); len(got) != 1 || got[0] != p.String()+" "+tt.event.String() {
				t.Fatalf("observed %q, want one %s of %s", got, tt.event, p)
			}
		})
	}
}

// A requester that goes silent in the transfer phase holds B's slot for TransferTimeout,
// then gets a timeout error frame; B's Close ends a transfer at once with shutting_down.
func TestTransferTimeout(t *testing.T) {
	be, err := synth.New(handoverModel)
	if err != nil {
		t.Fatal(err)
	}
	for _, closing := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			srv := newServer(be)
			defer srv.Close()
			a, b := net.Pipe()
			client := pipeStream{a}
			served := make(chan struct{})
			go func() {
				defer close(served)
				srv.ServeStream("client", pipeStream{b})
			}()
			body, _ := encodeBounded(handoverRequest(8, true, true), requestOpts{resume: true})
			if err := frame.Write(client, body); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			r := frame.NewReader(client, MaxKVFrame)
			if fb, err := r.Next(); err != nil || fb[0] != frameReady {
				t.Fatalf("first frame %q, %v", fb, err)
			}
			if err := frame.Write(client, appendKV(nil, kvRows(synthShape(), 0, 3))); err != nil {
				t.Fatal(err)
			}
			want := inference.CodeTimeout
			if closing {
				synctest.Wait()
				go srv.Close()
				want = inference.CodeShuttingDown
			}
			fb, err := r.Next()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := decodeTerminal(fb); inference.CodeOf(err) != want {
				t.Fatalf("B answered %v, want %s", err, want)
			}
			if since := time.Since(start); !closing && since != TransferTimeout {
				t.Fatalf("timed out after %v, want %v", since, TransferTimeout)
			}
			<-served
			if st := srv.Stats(); st.InFlight != 0 {
				t.Fatalf("stats %+v after the transfer ended", st)
			}
		})
	}
}
