package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/localonly"
)

// spyDispatcher records the requests the Dispatcher receives and serves them on next.
type spyDispatcher struct {
	next Dispatcher

	mu   sync.Mutex
	seen []inference.Request
}

func (s *spyDispatcher) Models(ctx context.Context) []Model { return s.next.Models(ctx) }

func (s *spyDispatcher) Generate(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
	s.mu.Lock()
	s.seen = append(s.seen, *req)
	s.mu.Unlock()
	return s.next.Generate(ctx, req, emit)
}

func (s *spyDispatcher) calls() []inference.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen
}

// spyLocal records the requests the Local receives and serves them on next.
type spyLocal struct {
	next Local

	mu   sync.Mutex
	seen []inference.Request
}

func (s *spyLocal) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	s.mu.Lock()
	s.seen = append(s.seen, *req)
	s.mu.Unlock()
	return s.next.Generate(ctx, req, emit)
}

func (s *spyLocal) calls() []inference.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen
}

// newGate is the privacy gate's Local over a fresh synthetic backend.
func newGate(t testing.TB) *localonly.Gate {
	t.Helper()
	return localonly.New(newDispatcher(t).b)
}

// chatBody encodes a chat request with the given meshinfer object (raw JSON; "" for none).
func chatBody(t testing.TB, req inference.Request, stream bool, meshinfer string) []byte {
	t.Helper()
	b := body(t, req, stream, false)
	if meshinfer == "" {
		return b
	}
	return append([]byte(`{"meshinfer":`+meshinfer+`,`), b[1:]...)
}

// TestPrefsPrecedence: each field comes from the body's meshinfer object, else its header,
// else the node's default, else inference.DefaultPrefs; local-only goes to the Local.
func TestPrefsPrecedence(t *testing.T) {
	const (
		local = inference.PrivacyLocalOnly
		mesh  = inference.PrivacyMesh
		anyp  = inference.PrivacyAny
		cost  = inference.PriorityCost
		lat   = inference.PriorityLatency
		bal   = inference.PriorityBalanced
		auto  = inference.RouteAuto
		expl  = inference.RouteExplicit
	)
	tests := []struct {
		name     string
		body     string            // the meshinfer object
		header   map[string]string // X-Meshinfer-*
		defaults *inference.Prefs  // WithDefaultPrefs; nil for none
		want     inference.Prefs
	}{
		{name: "built-in", want: inference.Prefs{Privacy: mesh, Priority: bal, Route: expl}},
		{name: "transport by body", body: `{"transport":"webrtc"}`,
			want: inference.Prefs{Privacy: mesh, Priority: bal, Route: expl, Transport: inference.TransportWebRTC}},
		{name: "transport by header over node default", header: map[string]string{"X-Meshinfer-Transport": "libp2p"},
			defaults: &inference.Prefs{Transport: inference.TransportWebRTC},
			want:     inference.Prefs{Privacy: mesh, Priority: bal, Route: expl, Transport: inference.TransportLibp2p}},
		{name: "transport by node default", defaults: &inference.Prefs{Transport: inference.TransportWebRTC},
			want: inference.Prefs{Privacy: mesh, Priority: bal, Route: expl, Transport: inference.TransportWebRTC}},
		{name: "node defaults", defaults: &inference.Prefs{Privacy: anyp, Priority: cost, Route: auto},
			want: inference.Prefs{Privacy: anyp, Priority: cost, Route: auto}},
		{name: "partial node defaults", defaults: &inference.Prefs{Priority: lat},
			want: inference.Prefs{Privacy: mesh, Priority: lat, Route: expl}},
		{name: "headers over node defaults", header: map[string]string{"X-Meshinfer-Privacy": "any", "X-Meshinfer-Priority": "cost"},
			defaults: &inference.Prefs{Privacy: mesh, Priority: lat},
			want:     inference.Prefs{Privacy: anyp, Priority: cost, Route: expl}},
		{name: "body over header", body: `{"privacy":"mesh","priority":"latency"}`,
			header: map[string]string{"X-Meshinfer-Privacy": "local-only", "X-Meshinfer-Priority": "cost"},
			want:   inference.Prefs{Privacy: mesh, Priority: lat, Route: expl}},
		{name: "field by field", body: `{"priority":"cost"}`, header: map[string]string{"X-Meshinfer-Privacy": "any"},
			defaults: &inference.Prefs{Privacy: mesh, Priority: lat, Route: auto},
			want:     inference.Prefs{Privacy: anyp, Priority: cost, Route: auto}},
		{name: "body route over default", body: `{"route":"auto"}`, defaults: &inference.Prefs{Route: expl},
			want: inference.Prefs{Privacy: mesh, Priority: bal, Route: auto}},
		{name: "body route explicit over default auto", body: `{"route":"explicit"}`, defaults: &inference.Prefs{Route: auto},
			want: inference.Prefs{Privacy: mesh, Priority: bal, Route: expl}},
		{name: "empty body value is not given", body: `{"privacy":"","priority":null}`,
			header: map[string]string{"X-Meshinfer-Privacy": "any"}, defaults: &inference.Prefs{Priority: cost},
			want: inference.Prefs{Privacy: anyp, Priority: cost, Route: expl}},
		{name: "unknown keys ignored", body: `{"future":"webrtc","privacy":"any","x":{"y":[1]}}`,
			want: inference.Prefs{Privacy: anyp, Priority: bal, Route: expl}},
		{name: "null object", body: `null`, header: map[string]string{"X-Meshinfer-Priority": "latency"},
			want: inference.Prefs{Privacy: mesh, Priority: lat, Route: expl}},
		{name: "local-only by header", header: map[string]string{"X-Meshinfer-Privacy": "local-only"},
			defaults: &inference.Prefs{Privacy: anyp},
			want:     inference.Prefs{Privacy: local, Priority: bal, Route: expl}},
		{name: "local-only by body", body: `{"privacy":"local-only"}`, header: map[string]string{"X-Meshinfer-Privacy": "any"},
			want: inference.Prefs{Privacy: local, Priority: bal, Route: expl}},
		{name: "local-only by node default", defaults: &inference.Prefs{Privacy: local, Priority: cost},
			want: inference.Prefs{Privacy: local, Priority: cost, Route: expl}},
		{name: "body lifts the node's local-only", body: `{"privacy":"mesh"}`, defaults: &inference.Prefs{Privacy: local},
			want: inference.Prefs{Privacy: mesh, Priority: bal, Route: expl}},
		{name: "header lifts the node's local-only", header: map[string]string{"X-Meshinfer-Privacy": "any"},
			defaults: &inference.Prefs{Privacy: local},
			want:     inference.Prefs{Privacy: anyp, Priority: bal, Route: expl}},
	}
	base := newDispatcher(t) // one backend: its weights load once
	gate := localonly.New(base.b)
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			d := &spyDispatcher{next: base}
			l := &spyLocal{next: gate}
			opts := []Option{WithLocal(l)}
			if tt.defaults != nil {
				opts = append(opts, WithDefaultPrefs(*tt.defaults))
			}
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(chatBody(t, testRequest(), stream, tt.body)))
			for k, v := range tt.header {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			Handler(d, opts...).ServeHTTP(w, r)
			if w.Code != http.StatusOK {
				t.Errorf("%s (stream %v): status %d: %s", tt.name, stream, w.Code, w.Body)
				continue
			}
			wantLocal := tt.want.Privacy == local
			got, other := d.calls(), l.calls()
			if wantLocal {
				got, other = other, got
			}
			if len(got) != 1 || len(other) != 0 {
				t.Errorf("%s (stream %v): %d calls to the expected server and %d to the other, want 1 and 0 (local-only %v)",
					tt.name, stream, len(got), len(other), wantLocal)
				continue
			}
			want := tt.want
			if want.Transport == "" {
				want.Transport = inference.TransportLibp2p
			}
			if got[0].Prefs != want {
				t.Errorf("%s (stream %v): prefs %+v, want %+v", tt.name, stream, got[0].Prefs, want)
			}
		}
	}
}

// TestPrefsInvalid: an unknown value, in the body or a header, is a 400 invalid_request that
// names the field's accepted values, and reaches neither the Dispatcher nor the Local.
func TestPrefsInvalid(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		header map[string]string
		want   []string // in the message
	}{
		{name: "body privacy", body: `{"privacy":"strict"}`,
			want: []string{"meshinfer object", `privacy "strict"`, "local-only, mesh, any"}},
		{name: "body priority", body: `{"priority":"fast"}`,
			want: []string{"meshinfer object", `priority "fast"`, "cost, latency, balanced"}},
		{name: "body route", body: `{"route":"manual"}`,
			want: []string{"meshinfer object", `route "manual"`, "auto, explicit"}},
		{name: "body transport", body: `{"transport":"quic"}`,
			want: []string{"meshinfer object", `transport "quic"`, "libp2p, webrtc"}},
		{name: "header transport", header: map[string]string{"X-Meshinfer-Transport": "WebRTC"},
			want: []string{"X-Meshinfer-Transport header", `transport "WebRTC"`, "libp2p, webrtc"}},
		{name: "header privacy", header: map[string]string{"X-Meshinfer-Privacy": "Local-Only"},
			want: []string{"X-Meshinfer-Privacy header", `privacy "Local-Only"`, "local-only, mesh, any"}},
		{name: "header priority", header: map[string]string{"X-Meshinfer-Priority": "cheap"},
			want: []string{"X-Meshinfer-Priority header", `priority "cheap"`, "cost, latency, balanced"}},
		// A bad header is refused even when the body sets the field: it is not silently dropped.
		{name: "bad header under a good body", body: `{"privacy":"local-only"}`, header: map[string]string{"X-Meshinfer-Privacy": "nowhere"},
			want: []string{"X-Meshinfer-Privacy header", "local-only, mesh, any"}},
		{name: "bad body over a good header", body: `{"privacy":"nowhere"}`, header: map[string]string{"X-Meshinfer-Privacy": "local-only"},
			want: []string{"meshinfer object", "local-only, mesh, any"}},
		{name: "long value cut", body: `{"privacy":"` + strings.Repeat("x", 500) + `"}`,
			want: []string{"local-only, mesh, any"}},
		{name: "not an object", body: `"local-only"`, want: []string{"not a chat completion request"}},
		{name: "wrong type", body: `{"privacy":1}`, want: []string{"not a chat completion request"}},
	}
	base := newDispatcher(t)
	gate := localonly.New(base.b)
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			d := &spyDispatcher{next: base}
			l := &spyLocal{next: gate}
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(chatBody(t, testRequest(), stream, tt.body)))
			for k, v := range tt.header {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			Handler(d, WithLocal(l), WithDefaultPrefs(inference.Prefs{Privacy: inference.PrivacyLocalOnly})).ServeHTTP(w, r)
			if !checkRefusedPref(t, tt.name, w, tt.want) {
				continue
			}
			if n, m := len(d.calls()), len(l.calls()); n+m != 0 {
				t.Errorf("%s: reached the Dispatcher %d times and the Local %d times", tt.name, n, m)
			}
		}
	}
}

// TestDefaultPrefsInvalid: New refuses unknown default preferences; Handler, which cannot
// fail, drops them for the built-in ones.
func TestDefaultPrefsInvalid(t *testing.T) {
	bad := inference.Prefs{Privacy: "everywhere"}
	if s, err := New("127.0.0.1:0", newDispatcher(t), WithDefaultPrefs(bad)); err == nil || !strings.Contains(err.Error(), "local-only, mesh, any") {
		if s != nil {
			s.Close()
		}
		t.Errorf("New with default privacy %q: %v, want an error naming the accepted values", bad.Privacy, err)
	}
	d := &spyDispatcher{next: newDispatcher(t)}
	w := httptest.NewRecorder()
	Handler(d, WithDefaultPrefs(bad)).ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		bytes.NewReader(body(t, testRequest(), false, false))))
	if c := d.calls(); w.Code != http.StatusOK || len(c) != 1 || c[0].Prefs != inference.DefaultPrefs() {
		t.Errorf("Handler with bad defaults: status %d, calls %+v; want the built-in defaults", w.Code, c)
	}
}

// TestRouteAuto: with route auto a request may name no model (or "auto"); a local-only one
// then runs on the gate's pick, others reach the Dispatcher as they are. Without route auto
// the model is required.
func TestRouteAuto(t *testing.T) {
	tests := []struct {
		name, model, meshinfer string
		status                 int
		toLocal, toDispatcher  bool
	}{
		{"local-only no model", "", `{"privacy":"local-only","route":"auto"}`, 200, true, false},
		{"local-only auto", "auto", `{"privacy":"local-only","route":"auto"}`, 200, true, false},
		{"local-only explicit no model", "", `{"privacy":"local-only"}`, 400, false, false},
		{"mesh no model", "", `{"route":"auto"}`, 404, false, true}, // synthDispatcher knows no model ""
		{"mesh explicit no model", "", `{"route":"explicit"}`, 400, false, false},
	}
	for _, tt := range tests {
		d := &spyDispatcher{next: newDispatcher(t)}
		l := &spyLocal{next: newGate(t)}
		req := testRequest()
		req.Model = tt.model
		w := httptest.NewRecorder()
		Handler(d, WithLocal(l)).ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
			bytes.NewReader(chatBody(t, req, false, tt.meshinfer))))
		if w.Code != tt.status {
			t.Errorf("%s: status %d, want %d: %s", tt.name, w.Code, tt.status, w.Body)
		}
		if got := len(l.calls()) == 1; got != tt.toLocal {
			t.Errorf("%s: reached the Local %v, want %v", tt.name, got, tt.toLocal)
		}
		if got := len(d.calls()) == 1; got != tt.toDispatcher {
			t.Errorf("%s: reached the Dispatcher %v, want %v", tt.name, got, tt.toDispatcher)
		}
		if tt.status == 200 {
			var c wireCompletion
			if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil || c.Choices[0].Message.Content == "" || c.Model != "auto" {
				t.Errorf("%s: completion %s (%v), want content and model auto", tt.name, w.Body, err)
			}
		}
	}
}

// checkRefusedPref reports unless w answers a refused preference: a 400 invalid_request
// whose message contains each of want and does not echo a long value. It returns false when
// the status is not 400 (the rest is not checked then).
func checkRefusedPref(t *testing.T, name string, w *httptest.ResponseRecorder, want []string) bool {
	t.Helper()
	if w.Code != http.StatusBadRequest {
		t.Errorf("%s: status %d, want 400: %s", name, w.Code, w.Body)
		return false
	}
	e := decodeError(t, w.Code, w.Header(), w.Body.Bytes())
	if e.Code != string(inference.CodeInvalidRequest) {
		t.Errorf("%s: code %q, want invalid_request", name, e.Code)
	}
	for _, s := range want {
		if !strings.Contains(e.Message, s) {
			t.Errorf("%s: message %q does not contain %q", name, e.Message, s)
		}
	}
	if len(e.Message) > 300 {
		t.Errorf("%s: message of %d bytes echoes the value", name, len(e.Message))
	}
	return true
}
