package openai

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
)

// TestServedVisibility: the X-Meshinfer-Route, -Tier and -Attempts headers and the meshinfer
// object of the body (or of the final chunk) say where a request was served: the headers of a
// stream where its first token was, the body where its outcome was.
func TestServedVisibility(t *testing.T) {
	const peerA, peerB = "peer:12D3KooWPeerA", "peer:12D3KooWPeerB"
	at := func(route string, attempts int) func(*synthDispatcher) Dispatcher {
		return func(d *synthDispatcher) Dispatcher {
			d.at = servedAt(route, attempts)
			return d
		}
	}
	tests := []struct {
		name      string
		localOnly bool // privacy local-only (by header)
		noLocal   bool // no WithLocal
		model     string
		dispatch  func(*synthDispatcher) Dispatcher
		status    int
		// Headers of the non-streaming answer, and of a stream or error: nil for none.
		header, streamHeader *wireServed
		body                 wireServed // the meshinfer object of a success
	}{
		{name: "local-only on the gate", localOnly: true, status: 200,
			header: &wireServed{"local", "local", 1}, streamHeader: &wireServed{"local", "local", 1}, body: wireServed{"local", "local", 1}},
		{name: "local by the dispatcher", dispatch: at("local", 1), status: 200,
			header: &wireServed{"local", "local", 1}, streamHeader: &wireServed{"local", "local", 1}, body: wireServed{"local", "local", 1}},
		{name: "peer", dispatch: at(peerA, 1), status: 200,
			header: &wireServed{peerA, "mesh", 1}, streamHeader: &wireServed{peerA, "mesh", 1}, body: wireServed{peerA, "mesh", 1}},
		{name: "cloud", dispatch: at("cloud", 1), status: 200,
			header: &wireServed{"cloud", "cloud", 1}, streamHeader: &wireServed{"cloud", "cloud", 1}, body: wireServed{"cloud", "cloud", 1}},
		{name: "third attempt", dispatch: at(peerB, 3), status: 200,
			header: &wireServed{peerB, "mesh", 3}, streamHeader: &wireServed{peerB, "mesh", 3}, body: wireServed{peerB, "mesh", 3}},
		{name: "resumed on another peer", dispatch: resumedOn(peerA, peerB), status: 200,
			header: &wireServed{peerB, "mesh", 2}, streamHeader: &wireServed{peerA, "mesh", 1}, body: wireServed{peerB, "mesh", 2}},
		{name: "error after failover", dispatch: func(d *synthDispatcher) Dispatcher {
			d.at = servedAt("cloud", 2)
			d.before = func(context.Context) error { return inference.Errorf(inference.CodeOverloaded, "cloud quota") }
			return d
		}, status: 429, header: &wireServed{"cloud", "cloud", 2}, streamHeader: &wireServed{"cloud", "cloud", 2}},
		{name: "error with nothing tried", dispatch: func(d *synthDispatcher) Dispatcher {
			d.at = inference.Served{}
			d.before = func(context.Context) error { return inference.Errorf(inference.CodeNoPeer, "nobody serves it") }
			return d
		}, status: 503},
		{name: "local-only unknown model", localOnly: true, model: "synth-nope", status: 503,
			header: &wireServed{"local", "local", 1}, streamHeader: &wireServed{"local", "local", 1}},
		{name: "local-only without a Local", localOnly: true, noLocal: true, status: 503},
	}
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			d := newDispatcher(t)
			var disp Dispatcher = &forbiddenDispatcher{t: t}
			if tt.dispatch != nil {
				disp = tt.dispatch(d)
			}
			var opts []Option
			if !tt.noLocal {
				opts = append(opts, WithLocal(newGate(t)))
			}
			req := testRequest()
			if tt.model != "" {
				req.Model = tt.model
			}
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body(t, req, stream, false)))
			if tt.localOnly {
				r.Header.Set("X-Meshinfer-Privacy", "local-only")
			}
			w := httptest.NewRecorder()
			Handler(disp, opts...).ServeHTTP(w, r)
			name := tt.name + map[bool]string{false: "", true: "/stream"}[stream]
			if w.Code != tt.status {
				t.Errorf("%s: status %d, want %d: %s", name, w.Code, tt.status, w.Body)
				continue
			}
			want := tt.header
			if stream {
				want = tt.streamHeader
			}
			h := w.Header()
			if want == nil {
				for _, k := range []string{"X-Meshinfer-Route", "X-Meshinfer-Tier", "X-Meshinfer-Attempts"} {
					if v := h.Get(k); v != "" {
						t.Errorf("%s: %s %q, want none", name, k, v)
					}
				}
			} else if h.Get("X-Meshinfer-Route") != want.Route || h.Get("X-Meshinfer-Tier") != want.Tier ||
				h.Get("X-Meshinfer-Attempts") != strconv.Itoa(want.Attempts) {
				t.Errorf("%s: headers route %q tier %q attempts %q, want %+v", name,
					h.Get("X-Meshinfer-Route"), h.Get("X-Meshinfer-Tier"), h.Get("X-Meshinfer-Attempts"), *want)
			}
			if tt.status != http.StatusOK {
				decodeError(t, w.Code, h, w.Body.Bytes())
				continue
			}
			var got wireServed
			if stream {
				st := readStream(t, bufio.NewReader(w.Body))
				got = st.served
			} else {
				var c wireCompletion
				if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil {
					t.Fatalf("%s: %v: %s", name, err, w.Body)
				}
				got = c.Meshinfer
			}
			if got != tt.body {
				t.Errorf("%s: meshinfer %+v, want %+v", name, got, tt.body)
			}
		}
	}
}

// resumedOn serves the first two tokens at first and the rest, and the outcome, at then: a
// stream cut and resumed on another peer.
func resumedOn(first, then string) func(*synthDispatcher) Dispatcher {
	return func(d *synthDispatcher) Dispatcher {
		a, b := servedAt(first, 1), servedAt(then, 2)
		return customDispatcher{d, func(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
			res, _, err := d.Generate(ctx, req, func(_ inference.Served, tok inference.Token) error {
				if tok.Index < 2 {
					return emit(a, tok)
				}
				return emit(b, tok)
			})
			return res, b, err
		}}
	}
}

// servedAt is where a request was served, from its route string.
func servedAt(route string, attempts int) inference.Served {
	at, _ := inference.ParseRoute(route)
	at.Attempts = attempts
	return at
}
