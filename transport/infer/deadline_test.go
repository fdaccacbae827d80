package infer

import (
	"context"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
)

// forever is a pause of paced that lasts until the request's context ends: a frozen peer.
const forever = time.Duration(-1)

// paced is a backend with pauses on the test's clock (virtual under synctest): before the
// token of each index in before, and after the last token, before the result (end).
type paced struct {
	inference.Backend
	before map[int]time.Duration
	end    time.Duration
}

func (b paced) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	res, err := b.Backend.Generate(ctx, req, func(tok inference.Token) error {
		if err := pause(ctx, b.before[tok.Index]); err != nil {
			return err
		}
		return emit(tok)
	})
	if err == nil {
		err = pause(ctx, b.end)
	}
	return res, err
}

func pause(ctx context.Context, d time.Duration) error {
	if d == 0 {
		return nil
	}
	var wake <-chan time.Time
	if d != forever {
		t := time.NewTimer(d)
		defer t.Stop()
		wake = t.C
	}
	select {
	case <-wake:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pipeStream is one end of a net.Pipe as a Stream: its deadlines run on the test's clock,
// so that the client's rules can be checked on virtual time, where no libp2p host can run.
// A pipe has no half-close: Reset and Close both end it.
type pipeStream struct{ net.Conn }

func (s pipeStream) Reset() error { return s.Close() }

// The client's two deadlines on virtual time, against the real server and the synthetic
// model paced by the test: a peer may take up to the first-token timeout before its first
// token (a cold load, a long prompt) and up to the inter-token timeout between two frames
// after it; silence past either is timeout, exactly when the deadline passes. The time a
// slow emit takes is not the peer's. The answer to a direct task (ReadAnswer, a WebRTC data
// channel's) is held to the same rules.
func TestClientDeadlines(t *testing.T) {
	const n = 12 // tokens asked for; synth-tiny makes them all
	cases := []struct {
		name      string
		stream    bool                  // a streaming request (false: the server batches)
		direct    bool                  // the answer to a direct task, read by ReadAnswer
		before    map[int]time.Duration // the backend's pauses before a token
		end       time.Duration         // and before its result
		slowEmit  map[int]time.Duration // the client's emit takes this long after a token
		wantCode  inference.Code        // "" for a completed request
		wantToks  int                   // tokens received (all n when completed)
		wantSince time.Duration         // from the last token (or the request) to the timeout
	}{
		{name: "cold start within the first-token timeout", stream: true,
			before: map[int]time.Duration{0: DefaultFirstTokenTimeout - time.Second}, wantToks: n},
		{name: "silent before the first token", stream: true,
			before: map[int]time.Duration{0: forever}, wantCode: inference.CodeTimeout, wantSince: DefaultFirstTokenTimeout},
		{name: "slow tokens within the inter-token timeout", stream: true,
			before:   map[int]time.Duration{1: 4 * time.Second, 5: 4900 * time.Millisecond, 11: 4 * time.Second},
			end:      4 * time.Second,
			wantToks: n},
		{name: "frozen mid-stream", stream: true,
			before: map[int]time.Duration{5: forever}, wantCode: inference.CodeTimeout, wantToks: 5, wantSince: DefaultInterTokenTimeout},
		{name: "a gap just past the inter-token timeout", stream: true,
			before: map[int]time.Duration{5: DefaultInterTokenTimeout + time.Millisecond}, wantCode: inference.CodeTimeout, wantToks: 5, wantSince: DefaultInterTokenTimeout},
		{name: "frozen before the terminal frame", stream: true,
			end: forever, wantCode: inference.CodeTimeout, wantToks: n, wantSince: DefaultInterTokenTimeout},
		// Batched: tokens 0-3 go out at 4.8 s, 4-9 at 9.65 s, the rest with the terminal
		// frame; the client's longest wait is 4.85 s.
		{name: "batched answer with slow tokens",
			before: map[int]time.Duration{3: 4800 * time.Millisecond, 4: 50 * time.Millisecond, 9: 4800 * time.Millisecond}, wantToks: n},
		// Tokens 0-3 go out together at token 3, 4-6 wait for the next batch, which never
		// comes: the client has 4.
		{name: "batched answer frozen mid-stream",
			before: map[int]time.Duration{3: 200 * time.Millisecond, 7: forever}, wantCode: inference.CodeTimeout, wantToks: 4, wantSince: DefaultInterTokenTimeout},
		{name: "slow consumer", stream: true,
			slowEmit: map[int]time.Duration{0: 20 * time.Second, 6: 20 * time.Second}, wantToks: n},
		{name: "direct answer frozen mid-stream", stream: true, direct: true,
			before: map[int]time.Duration{4: forever}, wantCode: inference.CodeTimeout, wantToks: 4, wantSince: DefaultInterTokenTimeout},
	}
	be, err := synth.New(model)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := newServer(paced{Backend: be, before: tc.before, end: tc.end})
				defer srv.Close()
				req := request(n)
				req.Stream = tc.stream
				a, b := net.Pipe()
				client, server := pipeStream{a}, pipeStream{b}
				served := make(chan struct{})
				go func() { // ends with the exchange: the server closes or resets its end
					defer close(served)
					if tc.direct {
						srv.ServeRequest("client", req, false, server)
					} else {
						srv.ServeStream("client", server)
					}
				}()
				var toks []inference.Token
				last := time.Now()
				emit := func(tok inference.Token) error {
					toks = append(toks, tok)
					time.Sleep(tc.slowEmit[tok.Index])
					last = time.Now()
					return nil
				}
				c := NewClient(nil)
				var res inference.Result
				if tc.direct {
					res, err = c.ReadAnswer(t.Context(), client, peer.ID("server"), req, emit)
				} else {
					res, err = c.GenerateOn(t.Context(), client, peer.ID("server"), req, emit)
				}
				<-served
				if inference.CodeOf(err) != tc.wantCode || len(toks) != tc.wantToks {
					t.Fatalf("err %v (%q) after %d tokens; want %q after %d", err, inference.CodeOf(err), len(toks), tc.wantCode, tc.wantToks)
				}
				for i, tok := range toks {
					if tok.Index != i {
						t.Fatalf("token %d has index %d", i, tok.Index)
					}
				}
				if err != nil {
					if since := time.Since(last); since != tc.wantSince {
						t.Fatalf("timeout %v after the last token (or the request), want %v", since, tc.wantSince)
					}
					if st := srv.Stats(); st.ClientDisconnected != 1 {
						t.Fatalf("server stats %+v: the timed-out request is not counted client_disconnected", st)
					}
					return
				}
				if res.Usage.CompletionTokens != n {
					t.Fatalf("usage %+v, want %d completion tokens", res.Usage, n)
				}
			})
		})
	}
}
