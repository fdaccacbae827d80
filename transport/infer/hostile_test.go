package infer

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/reputation"
)

// lyingServer answers every request on h with what answer writes: a serving peer that
// ignores the request's bounds and claims what it likes. It counts the frames it managed to
// write, so a test can see where the requester cut it off.
func lyingServer(t *testing.T, answer func(req *inference.Request, write func([]byte) error), opts ...ClientOption) (*atomic.Int64, *Client, peer.ID) {
	t.Helper()
	ch, sh := newHost(t), newHost(t)
	var written atomic.Int64
	sh.SetStreamHandler(ID, func(st network.Stream) {
		defer st.Close()
		body, err := frame.ReadOne(st, MaxRequestFrame)
		if err != nil {
			st.Reset()
			return
		}
		req, _, err := decodeRequest(body)
		if err != nil {
			return
		}
		answer(req, func(b []byte) error {
			if err := frame.Write(st, b); err != nil {
				return err
			}
			written.Add(1)
			return nil
		})
	})
	connect(t, ch, sh)
	return &written, NewClient(ch, opts...), sh.ID()
}

// observed is an Observer that keeps what it is told, as "peer event".
type observed struct {
	mu  sync.Mutex
	got []string
}

func (o *observed) Observe(p string, e reputation.Event, _ time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, p+" "+e.String())
}

func (o *observed) events() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.got)
}

// A peer that streams past max_tokens, or sends more text than the request can need, is cut
// off at the bound with peer_lost (so the router fails over), not read to the end, and the
// violation is recorded in its score; and the usage a requester reports is what it counted,
// whatever the peer claims.
func TestHostilePeerIsHeldToTheRequest(t *testing.T) {
	const maxTokens = 16
	flood := func(text string, n int, usage inference.Usage) func(*inference.Request, func([]byte) error) {
		return func(_ *inference.Request, write func([]byte) error) {
			for i := range n {
				if write(encodeToken(nil, inference.Token{Index: i, ID: 1, Text: text})) != nil {
					return
				}
			}
			write(encodeDone(inference.Result{FinishReason: inference.FinishLength, Usage: usage}))
		}
	}
	million := inference.Usage{PromptTokens: 1_000_000, CompletionTokens: 1_000_000, TotalTokens: 2_000_000}
	req := request(maxTokens)
	bigToken := strings.Repeat("x", MaxTokenFrame-16) // one frame each, far above any real token
	tests := []struct {
		name       string
		sent       int // token frames the peer tries to send
		answer     func(*inference.Request, func([]byte) error)
		wantTokens int
		wantErr    bool
	}{
		{"tokens past max_tokens", 100_000, flood("a", 100_000, million), maxTokens, true},
		{"text past the byte bound", 1_000, flood(bigToken, 1_000, million), req.MaxCompletionBytes() / len(bigToken), true},
		{"the right length, a made-up usage", maxTokens, flood("a", maxTokens, million), maxTokens, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen observed
			written, c, p := lyingServer(t, tt.answer, WithClientObserver(&seen))
			var toks []inference.Token
			res, err := c.Generate(t.Context(), p, req, collect(&toks))
			if tt.wantErr {
				if inference.CodeOf(err) != inference.CodePeerLost || !strings.Contains(err.Error(), "protocol") {
					t.Fatalf("error %v, want peer_lost for a protocol violation", err)
				}
				if got := seen.events(); len(got) != 1 || got[0] != p.String()+" "+reputation.ProtocolViolation.String() {
					t.Fatalf("observed %q, want one protocol_violation of %s", got, p)
				}
			} else if got := seen.events(); len(got) != 0 {
				t.Fatalf("observed %q for a peer within the bounds", got)
			} else if err != nil {
				t.Fatal(err)
			}
			if len(toks) != tt.wantTokens {
				t.Fatalf("%d tokens reached the caller, want %d", len(toks), tt.wantTokens)
			}
			if !tt.wantErr {
				bound := req.PromptTokensBound()
				if res.Usage.CompletionTokens != maxTokens || res.Usage.PromptTokens != bound || res.Usage.TotalTokens != maxTokens+bound {
					t.Fatalf("usage %+v, want %d completion (counted) and the prompt bound %d", res.Usage, maxTokens, bound)
				}
			}
			// The stream was reset at the bound: the peer could not write its flood, only what
			// the muxer's receive window held (yamux: 256 KiB) when the reset reached it.
			if n := written.Load(); tt.wantErr && n >= int64(tt.sent) {
				t.Fatalf("the peer wrote all %d frames: it was not cut off", n)
			}
		})
	}
}
