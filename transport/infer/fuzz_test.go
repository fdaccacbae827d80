package infer

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/internal/frame"
)

// Fuzz targets of the peer inference protocol's decoders: each frame decoder alone, then
// both ends' read loops over a stream of the fuzzer's bytes. Seeds are real messages, made
// by the encoders from the synthetic model's output.

// typed reports whether err is one of the protocol's typed errors: a protocol violation
// (the stream is reset) or an *inference.Error with a code of the closed set.
func typed(err error) bool {
	if errors.Is(err, errProtocol) {
		return true
	}
	e, ok := errors.AsType[*inference.Error](err)
	return ok && slices.Contains(inference.Codes(), e.Code)
}

// realTokens are the synthetic model's answer to request(n).
func realTokens(tb testing.TB, n int) ([]inference.Token, inference.Result) {
	tb.Helper()
	be, err := synth.New(model)
	if err != nil {
		tb.Fatal(err)
	}
	var toks []inference.Token
	res, err := be.Generate(context.Background(), request(n), func(t inference.Token) error {
		toks = append(toks, t)
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return toks, res
}

// FuzzRequestFrame: a request frame decodes, or fails typed (not a request, or a
// resumption's with a replay: a protocol error; a request that does not decode:
// invalid_request); a request the server would serve (it validates) encodes and decodes
// again to itself, with what the frame asks besides (receipt, handover, resume).
func FuzzRequestFrame(f *testing.F) {
	for _, o := range []requestOpts{{}, {receipt: true}, {handover: true}, {resume: true, receipt: true}} {
		b, err := encodeRequestOpts(request(16), o)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	replayed := request(16)
	replayed.Replay = []int{3, 1}
	b, err := encodeRequestOpts(replayed, requestOpts{resume: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b) // a resumption's request with a replay: a protocol error
	f.Add([]byte{frameRequest, '{', '}'})
	f.Add([]byte{frameToken, 0, 1, 'a'})
	f.Add([]byte{frameRequest, 'n', 'u', 'l', 'l'})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		req, o, err := decodeRequest(body)
		if err != nil {
			if !typed(err) || !errors.Is(err, errProtocol) && inference.CodeOf(err) != inference.CodeInvalidRequest {
				t.Fatalf("%q: error %v is neither a protocol error nor invalid_request", body, err)
			}
			return
		}
		if o.receipt != (body[0] == frameRequestReceipt) {
			t.Fatalf("%q: receipt %v for frame type %#x", body, o.receipt, body[0])
		}
		if o.resume && len(req.Replay) > 0 {
			t.Fatalf("%q: a resumption's request decoded with a replay", body)
		}
		if req.Validate(inference.Limits{}) != nil {
			return // refused by the server with invalid_request
		}
		again, err := encodeRequestOpts(req, o)
		if err != nil || len(again) > MaxRequestFrame {
			t.Fatalf("%q decodes to a valid request that does not encode: %d bytes, %v", body, len(again), err)
		}
		back, oBack, err := decodeRequest(again)
		if err != nil || oBack != o || !reflect.DeepEqual(back, req) {
			t.Fatalf("%q: round trip gave %+v, %+v, %v; want %+v, %+v", body, back, oBack, err, req, o)
		}
	})
}

// FuzzResponseFrame: every frame a server sends (token, done, error) and a direct task's
// result frames (result, failed) decode, or fail with a protocol error; what decodes is in
// its bounds (a token's text non-empty UTF-8, a done frame's finish reason stop or length,
// an error's code one of the closed set) and encodes and decodes again to the same thing.
func FuzzResponseFrame(f *testing.F) {
	toks, res := realTokens(f, 4)
	for _, tok := range toks {
		f.Add(encodeToken(nil, tok))
	}
	f.Add(encodeToken(nil, inference.Token{Index: 1 << 31, ID: -1, Text: "é"}))
	f.Add(encodeDone(res))
	f.Add(encodeError(inference.Errorf(inference.CodeOverloaded, "busy")))
	f.Add(EncodeResult(res, nil))
	f.Add(EncodeResult(inference.Result{Usage: res.Usage}, inference.Errorf(inference.CodePeerLost, "gone: %w", ErrClientDisconnected)))
	f.Add([]byte{frameError, '{', '"', 'c', 'o', 'd', 'e', '"', ':', '"', 'x', '"', '}'})
	f.Add([]byte{frameToken, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0, 'a'})
	f.Add([]byte{frameDone, '{', '}'})
	f.Add([]byte{0x06})
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) == 0 {
			return // the client refuses an empty frame before decoding
		}
		switch {
		case body[0] == frameToken:
			tok, err := decodeToken(body)
			if err != nil {
				if !errors.Is(err, errProtocol) {
					t.Fatalf("%q: untyped error %v", body, err)
				}
				return
			}
			if tok.Text == "" || tok.Index < 0 || tok.ID < -1 {
				t.Fatalf("%q: accepted %+v", body, tok)
			}
			again := encodeToken(nil, tok)
			if len(again) > len(body) {
				t.Fatalf("%q re-encodes longer: %q", body, again)
			}
			if back, err := decodeToken(again); err != nil || back != tok {
				t.Fatalf("%q: round trip gave %+v, %v; want %+v", body, back, err, tok)
			}
		case IsResultFrame(body):
			res, err := DecodeResult(body)
			if err != nil && !typed(err) {
				t.Fatalf("%q: untyped error %v", body, err)
			}
			if errors.Is(err, errProtocol) {
				return
			}
			back, berr := DecodeResult(EncodeResult(res, err))
			if back != res || inference.CodeOf(berr) != inference.CodeOf(err) ||
				errors.Is(berr, ErrClientDisconnected) != errors.Is(err, ErrClientDisconnected) {
				t.Fatalf("%q: round trip gave %+v, %v; want %+v, %v", body, back, berr, res, err)
			}
		default:
			res, err := decodeTerminal(body)
			if err != nil {
				if !typed(err) {
					t.Fatalf("%q: untyped error %v", body, err)
				}
				if errors.Is(err, errProtocol) {
					return
				}
				if _, berr := decodeTerminal(encodeError(err)); inference.CodeOf(berr) != inference.CodeOf(err) {
					t.Fatalf("%q: error %v re-encodes as %v", body, err, berr)
				}
				return
			}
			if res.FinishReason != inference.FinishStop && res.FinishReason != inference.FinishLength {
				t.Fatalf("%q: finish reason %q accepted", body, res.FinishReason)
			}
			if back, err := decodeTerminal(encodeDone(res)); err != nil || back != res {
				t.Fatalf("%q: round trip gave %+v, %v; want %+v", body, back, err, res)
			}
		}
	})
}

// script is a Stream whose reads are the fuzzer's bytes. Once they are spent a read ends as
// a deadline would, when one is set (nothing more will come, so it passes), or else as the
// other end closing (eof) or keeping its side open until Close or Reset (a client's write
// side during the request). Writes are kept.
type script struct {
	in  *bytes.Reader
	eof bool

	mu       sync.Mutex
	out      bytes.Buffer
	deadline bool // a read deadline is set
	reset    bool
	ended    chan struct{} // closed by Close or Reset
	endOnce  sync.Once
}

func newScript(in []byte, eof bool) *script {
	return &script{in: bytes.NewReader(in), eof: eof, ended: make(chan struct{})}
}

type timeoutError struct{}

func (timeoutError) Error() string { return "deadline exceeded" }
func (timeoutError) Timeout() bool { return true }

func (s *script) Read(p []byte) (int, error) {
	if n, _ := s.in.Read(p); n > 0 {
		return n, nil
	}
	s.mu.Lock()
	deadline := s.deadline
	s.mu.Unlock()
	switch {
	case deadline:
		return 0, timeoutError{}
	case s.eof:
		return 0, io.EOF
	}
	<-s.ended
	return 0, io.ErrClosedPipe
}

func (s *script) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reset {
		return 0, io.ErrClosedPipe
	}
	return s.out.Write(p)
}

func (s *script) Close() error { s.endOnce.Do(func() { close(s.ended) }); return nil }

func (s *script) Reset() error {
	s.mu.Lock()
	s.reset = true
	s.mu.Unlock()
	return s.Close()
}

func (s *script) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deadline = !t.IsZero()
	return nil
}

func (s *script) SetWriteDeadline(time.Time) error { return nil }

// FuzzServeStream: whatever a client sends, the server never panics or hangs, and what it
// writes has the protocol's shape: token frames with indices 0, 1, … within the request's
// max_tokens, then exactly one terminal frame, whose error (if any) is typed, and the stream
// closed; or, when it resets the stream (a first frame that is not a request, the client
// gone), a prefix of that without a terminal frame.
func FuzzServeStream(f *testing.F) {
	for _, n := range []int{1, 8} {
		for _, want := range []bool{false, true} {
			b, err := EncodeRequest(request(n), want)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(frame.Append(nil, b))
		}
	}
	b, _ := EncodeRequest(request(4), false)
	f.Add(frame.Append(frame.Append(nil, b), []byte{frameToken, 0, 0, 'x'})) // a frame after the request
	f.Add(frame.Append(nil, b)[:len(b)/2])                                   // cut short
	f.Add(frame.Append(nil, []byte{frameRequest, '{', '}'}))                 // decodes, does not validate
	f.Add(frame.Append(nil, encodeDone(inference.Result{FinishReason: inference.FinishStop})))
	f.Add([]byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})
	f.Add([]byte{0x81, 0x00})
	be, err := synth.New(model)
	if err != nil {
		f.Fatal(err)
	}
	// Generations stay short: a request for more tokens is refused as invalid (one that
	// sets none gets DefaultCompletionTokens).
	limits := inference.Limits{MaxTokens: 16}
	f.Fuzz(func(t *testing.T, in []byte) {
		ctx, cancel := context.WithCancel(context.Background())
		gen := &seen{g: be}
		s := &Server{gen: gen, limits: limits, maxTotal: 1, maxPeer: 1, ctx: ctx, cancel: cancel, perPeer: make(map[peer.ID]int)}
		st := newScript(in, false)
		s.ServeStream("peer", st)
		cancel()
		s.wg.Wait()

		out := st.out.Bytes()
		r := frame.NewReader(bytes.NewReader(out), MaxRequestFrame)
		for next := 0; ; next++ {
			fb, err := r.Next()
			if err == io.EOF && st.reset {
				return // reset before the terminal frame
			}
			if err != nil || len(fb) == 0 {
				t.Fatalf("response %q ends without a terminal frame, not reset: %v", out, err)
			}
			if fb[0] == frameToken {
				tok, err := decodeToken(fb)
				if err != nil || tok.Index != next || gen.req == nil || next >= gen.req.EffectiveMaxTokens() {
					t.Fatalf("token frame %d: %+v, %v", next, tok, err)
				}
				continue
			}
			if _, err := decodeTerminal(fb); err != nil && !typed(err) || errors.Is(err, errProtocol) {
				t.Fatalf("terminal frame %q: %v", fb, err)
			}
			if _, err := r.Next(); err != io.EOF || st.reset {
				t.Fatalf("after the terminal frame of %q: %v, reset %v", out, err, st.reset)
			}
			return
		}
	})
}

// seen is a Generator that keeps the request it was given.
type seen struct {
	g   Generator
	req *inference.Request
}

func (s *seen) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	s.req = req
	return s.g.Generate(ctx, req, emit)
}

// FuzzAnswerStream: whatever a server sends, the client never panics and ends with exactly
// one outcome: a result whose usage is what it counted, or a typed error (peer_lost for a
// broken protocol or a stream cut short, timeout for a silent server); the tokens it passed
// on have indices 0, 1, … and stay within the request's max_tokens and text bound, however
// much the server sends.
func FuzzAnswerStream(f *testing.F) {
	toks, res := realTokens(f, 8)
	var honest []byte
	for _, tok := range toks {
		honest = frame.Append(honest, encodeToken(nil, tok))
	}
	f.Add(frame.Append(slices.Clone(honest), encodeDone(res)))
	f.Add(frame.Append(slices.Clone(honest), encodeError(inference.Errorf(inference.CodeTimeout, "slow"))))
	f.Add(honest)                                                         // no terminal frame
	f.Add(honest[:len(honest)-1])                                         // cut inside a frame
	f.Add(frame.Append(nil, encodeDone(res)))                             // done without tokens
	f.Add(frame.Append(nil, []byte{frameToken, 1, 0, 'a'}))               // index 1 first
	f.Add(frame.Append(nil, make([]byte, maxFrame+1)))                    // over the frame bound
	f.Add(frame.Append(nil, []byte{}))                                    // an empty frame
	f.Add(frame.Append(frame.Append(nil, encodeDone(res)), []byte{0x06})) // done, then more
	f.Fuzz(func(t *testing.T, in []byte) {
		req := request(8)
		c := &Client{firstToken: DefaultFirstTokenTimeout, interToken: DefaultInterTokenTimeout}
		var got []inference.Token
		text := 0
		res, err := c.ReadAnswer(context.Background(), newScript(in, true), "peer", req, func(tok inference.Token) error {
			if tok.Index != len(got) {
				t.Fatalf("token %d passed on as index %d", len(got), tok.Index)
			}
			got = append(got, tok)
			text += len(tok.Text)
			return nil
		})
		if len(got) > req.EffectiveMaxTokens() || text > req.MaxCompletionBytes() {
			t.Fatalf("%d tokens, %d bytes of text passed on for max_tokens %d", len(got), text, req.EffectiveMaxTokens())
		}
		if err != nil {
			if !typed(err) || errors.Is(err, errProtocol) {
				t.Fatalf("error %v is not a typed inference error", err)
			}
			return
		}
		if res.FinishReason != inference.FinishStop && res.FinishReason != inference.FinishLength {
			t.Fatalf("result with finish reason %q", res.FinishReason)
		}
		if res.Usage.CompletionTokens != len(got) || res.Usage.PromptTokens > req.PromptTokensBound() {
			t.Fatalf("usage %+v for %d tokens received (prompt bound %d)", res.Usage, len(got), req.PromptTokensBound())
		}
	})
}

// FuzzKVFrame: a kv frame decodes to well-formed rows (at least one position, within
// maxKVPositions, a whole number of rows of values within inference.MaxKVRowsBytes) that
// encode to the same bytes, or fails with a protocol error.
func FuzzKVFrame(f *testing.F) {
	f.Add(appendKV(nil, kvRows(tinyShape, 0, 1)))
	f.Add(appendKV(nil, kvRows(tinyShape, 511, 1)))
	f.Add(appendKV(nil, inference.KVRows{Pos: 3, N: 2, Data: []float32{float32(math.NaN()), 1, 2, 3}}))
	f.Add(kvFrame(1<<31-1, 2, make([]byte, 16)))
	f.Add(kvFrame(0, 1, make([]byte, 6)))
	f.Add([]byte{frameKV, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 1, 0, 0, 0, 0})
	f.Add([]byte{frameKV})
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := decodeKV(body, nil)
		if err != nil {
			if !errors.Is(err, errProtocol) {
				t.Fatalf("%q: untyped error %v", body, err)
			}
			return
		}
		if r.Pos < 0 || r.N < 1 || r.Pos+r.N > maxKVPositions || len(r.Data) == 0 ||
			4*len(r.Data) > inference.MaxKVRowsBytes || len(r.Data)%(2*r.N) != 0 {
			t.Fatalf("%q: accepted rows at %d of %d positions, %d values", body, r.Pos, r.N, len(r.Data))
		}
		again := appendKV(nil, r)
		if len(again) > len(body) {
			t.Fatalf("%q re-encodes longer: %q", body, again)
		}
		back, err := decodeKV(again, nil)
		if err != nil || back.Pos != r.Pos || back.N != r.N || !bytes.Equal(again[len(again)-4*len(r.Data):], body[len(body)-4*len(r.Data):]) ||
			len(back.Data) != len(r.Data) {
			t.Fatalf("%q: round trip gave rows at %d of %d, %v", body, back.Pos, back.N, err)
		}
	})
}

// FuzzGoFrame: a go frame decodes to a replay or fails with a protocol error (or, past
// MaxRequestFrame, frame.ErrTooLarge); a replay the server takes (checkReplay) encodes and
// decodes again to itself.
func FuzzGoFrame(f *testing.F) {
	for _, replay := range [][]int{nil, {1}, {5, 0, 2047, 3}} {
		b, err := encodeGo(replay)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(append([]byte{frameGo}, `{"replay":[-1]}`...))
	f.Add(append([]byte{frameGo}, `{"replay":[1e30]}`...))
	f.Add(append([]byte{frameGo}, `{"replay":null,"replay":[1]}`...))
	f.Add([]byte{frameKV, '{', '}'})
	req := request(16)
	f.Fuzz(func(t *testing.T, body []byte) {
		replay, err := decodeGo(body)
		if err != nil {
			if !errors.Is(err, errProtocol) && !errors.Is(err, frame.ErrTooLarge) {
				t.Fatalf("%q: untyped error %v", body, err)
			}
			return
		}
		if err := checkReplay(req, replay); err != nil {
			if inference.CodeOf(err) != inference.CodeInvalidRequest {
				t.Fatalf("%q: replay %v refused with %v, not invalid_request", body, replay, err)
			}
			return
		}
		if len(replay) >= req.EffectiveMaxTokens() || slices.ContainsFunc(replay, func(id int) bool { return id < 0 }) {
			t.Fatalf("%q: replay %v accepted for max_tokens %d", body, replay, req.EffectiveMaxTokens())
		}
		again, err := encodeGo(replay)
		if err != nil {
			t.Fatalf("%q: replay %v does not encode: %v", body, replay, err)
		}
		if back, err := decodeGo(again); err != nil || !slices.Equal(back, replay) {
			t.Fatalf("%q: round trip gave %v, %v; want %v", body, back, err, replay)
		}
	})
}

// FuzzMovedReadyFrame: a moved frame decodes to counts in [0, maxKVPositions] and a ready
// frame to a shape whose dimensions are in [1, maxShapeDim] and whose one position of rows
// fits a kv frame, each encoding and decoding again to itself; anything else is a protocol
// error.
func FuzzMovedReadyFrame(f *testing.F) {
	f.Add(encodeMoved(&inference.Moved{Positions: 30, Tokens: 9}))
	f.Add(encodeMoved(&inference.Moved{}))
	f.Add(append([]byte{frameMoved}, `{"positions":-3,"tokens":1}`...))
	f.Add(encodeReady(inference.ModelShape{Layers: 4, Width: 256, Context: 1024, Params: 4458752}))
	f.Add(encodeReady(inference.ModelShape{Layers: 16, Width: 768, Context: 1024}))
	f.Add(append([]byte{frameReady}, `{"shape":{"layers":9007199254740993,"width":1,"context":1}}`...))
	f.Add([]byte{frameReady})
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) > 0 && body[0] == frameMoved {
			m, err := decodeMoved(body)
			if err != nil {
				if !errors.Is(err, errProtocol) {
					t.Fatalf("%q: untyped error %v", body, err)
				}
				return
			}
			if m.Positions < 0 || m.Tokens < 0 || m.Positions > maxKVPositions || m.Tokens > maxKVPositions {
				t.Fatalf("%q: accepted %+v", body, m)
			}
			if back, err := decodeMoved(encodeMoved(m)); err != nil || *back != *m {
				t.Fatalf("%q: round trip gave %+v, %v; want %+v", body, back, err, m)
			}
			return
		}
		s, err := decodeReady(body)
		if err != nil {
			if !errors.Is(err, errProtocol) {
				t.Fatalf("%q: untyped error %v", body, err)
			}
			return
		}
		for _, d := range []int{s.Layers, s.Width, s.Context} {
			if d < 1 || d > maxShapeDim {
				t.Fatalf("%q: accepted %+v", body, s)
			}
		}
		if inference.KVValues(s, 1)*4 > inference.MaxKVRowsBytes {
			t.Fatalf("%q: accepted %+v, whose one position exceeds a kv frame", body, s)
		}
		if back, err := decodeReady(encodeReady(s)); err != nil || back != s {
			t.Fatalf("%q: round trip gave %+v, %v; want %+v", body, back, err, s)
		}
	})
}
