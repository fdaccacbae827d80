package openai

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

func TestChatCompletion(t *testing.T) {
	d := newDispatcher(t)
	s := startServer(t, d)
	c := newClient(t)
	req := testRequest()
	want, wantRes := reference(t, req)

	resp := post(t, context.Background(), c, s.Addr(), body(t, req, false, false))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if r := resp.Header.Get("X-Meshinfer-Route"); r != "local" {
		t.Errorf("X-Meshinfer-Route %q, want local", r)
	}
	var got wireCompletion
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if got.Object != "chat.completion" || !strings.HasPrefix(got.ID, "chatcmpl-") || len(got.ID) != len("chatcmpl-")+24 ||
		got.Model != testModel || got.Created == 0 {
		t.Errorf("completion header: %+v", got)
	}
	if len(got.Choices) != 1 {
		t.Fatalf("%d choices, want 1", len(got.Choices))
	}
	ch := got.Choices[0]
	if ch.Index != 0 || ch.Message.Role != "assistant" {
		t.Errorf("choice: %+v", ch)
	}
	if ch.Message.Content != want {
		t.Errorf("content %q\nwant    %q", ch.Message.Content, want)
	}
	if ch.FinishReason != string(wantRes.FinishReason) {
		t.Errorf("finish_reason %q, want %q", ch.FinishReason, wantRes.FinishReason)
	}
	if got.Usage != wantRes.Usage {
		t.Errorf("usage %+v, want %+v", got.Usage, wantRes.Usage)
	}
	if got.Meshinfer.Route != "local" {
		t.Errorf("meshinfer.route %q, want local", got.Meshinfer.Route)
	}
}

func TestChatCompletionStream(t *testing.T) {
	for _, includeUsage := range []bool{false, true} {
		t.Run(fmt.Sprintf("include_usage=%v", includeUsage), func(t *testing.T) {
			d := newDispatcher(t)
			s := startServer(t, d)
			c := newClient(t)
			req := testRequest()
			want, wantRes := reference(t, req)

			resp := post(t, context.Background(), c, s.Addr(), body(t, req, true, includeUsage))
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			h := resp.Header
			if h.Get("Content-Type") != "text/event-stream" || h.Get("Cache-Control") != "no-cache" || h.Get("X-Meshinfer-Route") != "local" {
				t.Errorf("headers: %v", h)
			}
			got := readStream(t, bufio.NewReader(resp.Body))
			if got.text != want {
				t.Errorf("streamed %q\nwant     %q", got.text, want)
			}
			if got.finish != string(wantRes.FinishReason) || got.served != (wireServed{"local", "local", 1}) || !got.done || got.err != nil {
				t.Errorf("stream end: %+v, want finish %q route local [DONE]", got, wantRes.FinishReason)
			}
			switch {
			case includeUsage && (got.usage == nil || *got.usage != wantRes.Usage):
				t.Errorf("usage %+v, want %+v", got.usage, wantRes.Usage)
			case !includeUsage && got.usage != nil:
				t.Errorf("usage chunk %+v without include_usage", got.usage)
			}
			// One event per token: usage counts the generated tokens, which here (no stop
			// strings) are exactly the emitted ones.
			if got.tokens != wantRes.Usage.CompletionTokens {
				t.Errorf("%d token events, want %d", got.tokens, wantRes.Usage.CompletionTokens)
			}
		})
	}
}

// TestStreamIncremental checks that events reach the client while the generation is still
// running: the dispatcher holds after each of the first two tokens until the test has read
// that token's event.
func TestStreamIncremental(t *testing.T) {
	d := newDispatcher(t)
	release := []chan struct{}{make(chan struct{}), make(chan struct{})}
	d.after = func(ctx context.Context, tok inference.Token) error {
		if tok.Index >= len(release) {
			return nil
		}
		select {
		case <-release[tok.Index]:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s := startServer(t, d)
	c := newClient(t)
	req := testRequest()
	want, _ := reference(t, req)

	// A stream that is not flushed token by token fails here instead of hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp := post(t, ctx, c, s.Addr(), body(t, req, true, false))
	defer resp.Body.Close()
	if resp.Header.Get("X-Meshinfer-Route") != "local" {
		t.Errorf("X-Meshinfer-Route %q", resp.Header.Get("X-Meshinfer-Route"))
	}
	br := bufio.NewReader(resp.Body)
	var seen strings.Builder // the events read while the dispatcher was held, re-encoded
	for i, ch := range release {
		data, err := readEvent(br) // the dispatcher is held: this event was flushed on its own
		if err != nil {
			t.Fatalf("event %d while the handler runs: %v", i, err)
		}
		var c wireChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil || len(c.Choices) != 1 || c.Choices[0].Delta.Content == nil {
			t.Fatalf("event %d is not a token chunk: %q (%v)", i, data, err)
		}
		seen.WriteString("data: " + data + "\n\n")
		close(ch)
	}
	got := readStream(t, bufio.NewReader(io.MultiReader(strings.NewReader(seen.String()), br)))
	if got.text != want || !got.done {
		t.Errorf("streamed %q (done %v)\nwant     %q", got.text, got.done, want)
	}
}

// longPrompt is printable text long enough to overflow synth-tiny's 512-token context while
// staying far below the content limit.
func longPrompt() string {
	r := rand.New(rand.NewPCG(1, 2))
	const alphabet = "abcdefghijklmnopqrstuvwxyz ,.;:!?0123456789"
	b := make([]byte, 8<<10)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

func TestErrorMapping(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*inference.Request)
		before func(context.Context) error
		after  func(context.Context, inference.Token) error
		status int
		code   inference.Code
		tokens int // tokens streamed before the error
	}{
		{name: "unknown model", mutate: func(r *inference.Request) { r.Model = "synth-nope" },
			status: 404, code: inference.CodeModelNotFound},
		{name: "temperature out of range", mutate: func(r *inference.Request) { r.Temperature = ptr(3.0) },
			status: 400, code: inference.CodeInvalidRequest},
		{name: "unknown role", mutate: func(r *inference.Request) { r.Messages[0].Role = "tool" },
			status: 400, code: inference.CodeInvalidRequest},
		{name: "max_tokens over limit", mutate: func(r *inference.Request) { r.MaxTokens = ptr(4097) },
			status: 400, code: inference.CodeInvalidRequest},
		{name: "context overflow", mutate: func(r *inference.Request) { r.Messages[1].Content = longPrompt() },
			status: 400, code: inference.CodeContextOverflow},
		{name: "overloaded", before: func(context.Context) error {
			return inference.Errorf(inference.CodeOverloaded, "node at its limit")
		}, status: 429, code: inference.CodeOverloaded},
		{name: "no peer", before: func(context.Context) error {
			return inference.Errorf(inference.CodeNoPeer, "nobody serves it")
		}, status: 503, code: inference.CodeNoPeer},
		{name: "deadline", before: func(context.Context) error {
			return fmt.Errorf("first token: %w", context.DeadlineExceeded)
		}, status: 504, code: inference.CodeTimeout},
		{name: "untyped error", before: func(context.Context) error {
			return errors.New("backend exploded")
		}, status: 503, code: inference.CodeUnavailable},
		{name: "peer lost mid-stream", after: func(_ context.Context, tok inference.Token) error {
			if tok.Index == 2 {
				return inference.Errorf(inference.CodePeerLost, "stream reset")
			}
			return nil
		}, status: 502, code: inference.CodePeerLost, tokens: 3},
	}
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tt.name, stream), func(t *testing.T) {
				d := newDispatcher(t)
				d.before, d.after = tt.before, tt.after
				s := startServer(t, d)
				c := newClient(t)
				req := testRequest()
				if tt.mutate != nil {
					tt.mutate(&req)
				}
				resp := post(t, context.Background(), c, s.Addr(), body(t, req, stream, true))
				defer resp.Body.Close()
				if stream && tt.tokens > 0 {
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("status %d, want 200 for an error after the first token", resp.StatusCode)
					}
					got := readStream(t, bufio.NewReader(resp.Body))
					if got.err == nil || got.err.Code != string(tt.code) || got.done || got.tokens != tt.tokens {
						t.Errorf("stream %+v (error %+v), want %d tokens then a %s error event and no [DONE]",
							got, got.err, tt.tokens, tt.code)
					}
					if got.err != nil && got.err.Type != errorType(tt.status) {
						t.Errorf("error event type %q, want %q", got.err.Type, errorType(tt.status))
					}
					if want, _ := reference(t, testRequest()); !strings.HasPrefix(want, got.text) {
						t.Errorf("streamed %q is not a prefix of %q", got.text, want)
					}
					return
				}
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != tt.status {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, b)
				}
				if e := decodeError(t, resp.StatusCode, resp.Header, b); e.Code != string(tt.code) {
					t.Errorf("code %q, want %q", e.Code, tt.code)
				}
				// The route is known whenever the dispatcher was reached.
				if reached := tt.status != 400 || tt.code == inference.CodeContextOverflow; reached && resp.Header.Get("X-Meshinfer-Route") != "local" {
					t.Errorf("X-Meshinfer-Route %q, want local", resp.Header.Get("X-Meshinfer-Route"))
				}
			})
		}
	}
}

// TestDispatcherContract checks that a Dispatcher breaking its contract yields an unavailable
// error, not a malformed response.
func TestDispatcherContract(t *testing.T) {
	tests := []struct {
		name string
		gen  func(d *synthDispatcher) dispatchFunc
	}{
		{"index gap", func(d *synthDispatcher) dispatchFunc {
			return func(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
				return d.Generate(ctx, req, func(at inference.Served, tok inference.Token) error {
					tok.Index++
					return emit(at, tok)
				})
			}
		}},
		{"no finish reason", func(d *synthDispatcher) dispatchFunc {
			return func(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
				res, at, err := d.Generate(ctx, req, emit)
				res.FinishReason = ""
				return res, at, err
			}
		}},
	}
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tt.name, stream), func(t *testing.T) {
				d := newDispatcher(t)
				h := Handler(customDispatcher{d, tt.gen(d)})
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body(t, testRequest(), stream, false))))
				if w.Code == http.StatusOK { // tokens went out first: the stream ends in an error event
					got := readStream(t, bufio.NewReader(w.Body))
					if got.err == nil || got.err.Code != string(inference.CodeUnavailable) {
						t.Errorf("stream ended with %+v, want an unavailable error event", got.err)
					}
					return
				}
				if e := decodeError(t, w.Code, w.Header(), w.Body.Bytes()); w.Code != 503 || e.Code != string(inference.CodeUnavailable) {
					t.Errorf("status %d code %q, want 503 unavailable", w.Code, e.Code)
				}
			})
		}
	}
}

type dispatchFunc func(context.Context, *inference.Request, func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error)

// customDispatcher lists the models of d and generates with gen.
type customDispatcher struct {
	d   *synthDispatcher
	gen dispatchFunc
}

func (c customDispatcher) Models(ctx context.Context) []Model { return c.d.Models(ctx) }
func (c customDispatcher) Generate(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
	return c.gen(ctx, req, emit)
}

func TestModels(t *testing.T) {
	d := newDispatcher(t)
	s := startServer(t, d)
	c := newClient(t)
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := c.Get("http://" + s.Addr() + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	wantModel := func(warm bool) map[string]any {
		return map[string]any{"id": testModel, "object": "model", "created": 0.0, "owned_by": "meshinfer",
			"meshinfer": map[string]any{"warm": warm, "routes": []any{"local"}, "deterministic": true}}
	}
	check := func(warm bool) {
		t.Helper()
		status, b := get("/v1/models")
		var list map[string]any
		if err := json.Unmarshal(b, &list); status != 200 || err != nil {
			t.Fatalf("GET /v1/models: %d %v %s", status, err, b)
		}
		want := map[string]any{"object": "list", "data": []any{wantModel(warm)}}
		if fmt.Sprint(list) != fmt.Sprint(want) {
			t.Errorf("GET /v1/models = %v\nwant               %v", list, want)
		}
		status, b = get("/v1/models/" + testModel)
		var one map[string]any
		if err := json.Unmarshal(b, &one); status != 200 || err != nil || fmt.Sprint(one) != fmt.Sprint(wantModel(warm)) {
			t.Errorf("GET /v1/models/%s = %d %s", testModel, status, b)
		}
	}
	check(false) // cold until its first request
	resp := post(t, context.Background(), c, s.Addr(), body(t, testRequest(), false, false))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	check(true)

	status, b := get("/v1/models/org/absent")
	if e := decodeError(t, status, http.Header{"Content-Type": {"application/json"}}, b); status != 404 || e.Code != "model_not_found" {
		t.Errorf("GET unknown model: %d %s", status, b)
	}

	// No model reachable: data is an empty array, not null.
	w := httptest.NewRecorder()
	Handler(noModels{d}).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/models", nil))
	if got := strings.TrimSpace(w.Body.String()); w.Code != 200 || got != `{"object":"list","data":[]}` {
		t.Errorf("GET /v1/models with no model = %d %s", w.Code, got)
	}
}

// noModels reaches no model.
type noModels struct{ *synthDispatcher }

func (noModels) Models(context.Context) []Model { return nil }

func TestRoutes(t *testing.T) {
	h := Handler(newDispatcher(t))
	valid := string(body(t, testRequest(), false, false))
	tests := []struct {
		method, path, body string
		header             map[string]string
		status             int
		allow              string
	}{
		{method: "GET", path: "/v1/nothing", status: 404},
		{method: "GET", path: "/", status: 404},
		{method: "POST", path: "/v1/completions", body: valid, status: 404},
		{method: "GET", path: "/v1/chat/completions", status: 405, allow: "POST"},
		{method: "PUT", path: "/v1/chat/completions", body: valid, status: 405, allow: "POST"},
		{method: "DELETE", path: "/v1/models", status: 405, allow: "GET, HEAD"},
		{method: "POST", path: "/v1/models/" + testModel, status: 405, allow: "GET, HEAD"},
		// Content-Type is not checked: a body that parses is a request.
		{method: "POST", path: "/v1/chat/completions", body: valid, header: map[string]string{"Content-Type": "text/plain"}, status: 200},
		{method: "POST", path: "/v1/chat/completions", body: valid, status: 200},
		// Unknown fields, unknown keys of the meshinfer object and unknown X-Meshinfer-*
		// headers pass through.
		{method: "POST", path: "/v1/chat/completions", body: strings.Replace(valid, `{`, `{"meshinfer":{"transport":"webrtc","privacy":"mesh"},"n":1,"user":"u",`, 1),
			header: map[string]string{"X-Meshinfer-Tier": "local"}, status: 200},
		{method: "POST", path: "/v1/chat/completions", body: strings.Replace(valid, `{`, `{"meshinfer":{"privacy":"strict"},`, 1), status: 400},
		{method: "POST", path: "/v1/chat/completions", body: strings.Replace(valid, `{`, `{"meshinfer":"local",`, 1), status: 400},
		{method: "POST", path: "/v1/chat/completions", body: strings.Replace(valid, `{`, `{"n":2,`, 1), status: 400},
		{method: "POST", path: "/v1/chat/completions", body: valid + "x", status: 400},
		{method: "POST", path: "/v1/chat/completions", body: "", status: 400},
		{method: "POST", path: "/v1/chat/completions", body: "[]", status: 400},
		{method: "POST", path: "/v1/chat/completions", body: `{"model":"synth-tiny"}`, status: 400},
		// Browsers: only loopback pages may call the API.
		{method: "POST", path: "/v1/chat/completions", body: valid, header: map[string]string{"Origin": "https://evil.example"}, status: 403},
		{method: "GET", path: "/v1/models", header: map[string]string{"Origin": "null"}, status: 403},
		{method: "POST", path: "/v1/chat/completions", body: valid, header: map[string]string{"Origin": "http://localhost:3000"}, status: 200},
		{method: "GET", path: "/v1/models", header: map[string]string{"Origin": "http://127.0.0.1:8080"}, status: 200},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body))
		for k, v := range tt.header {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tt.status {
			t.Errorf("%s %s %v: status %d, want %d: %s", tt.method, tt.path, tt.header, w.Code, tt.status, w.Body)
			continue
		}
		if tt.status >= 400 {
			if e := decodeError(t, w.Code, w.Header(), w.Body.Bytes()); e.Code != string(inference.CodeInvalidRequest) {
				t.Errorf("%s %s: code %q, want invalid_request", tt.method, tt.path, e.Code)
			}
		}
		if got := w.Header().Get("Allow"); got != tt.allow {
			t.Errorf("%s %s: Allow %q, want %q", tt.method, tt.path, got, tt.allow)
		}
	}
}

func TestErrorType(t *testing.T) {
	tests := []struct {
		status int
		want   string
	}{
		{400, "invalid_request_error"}, {403, "invalid_request_error"}, {404, "invalid_request_error"},
		{405, "invalid_request_error"}, {413, "invalid_request_error"}, {429, "rate_limit_error"},
		{500, "server_error"}, {502, "server_error"}, {503, "server_error"}, {504, "server_error"},
	}
	for _, tt := range tests {
		if got := errorType(tt.status); got != tt.want {
			t.Errorf("errorType(%d) = %q, want %q", tt.status, got, tt.want)
		}
	}
	for _, c := range inference.Codes() {
		if st := c.HTTPStatus(); st < 400 || st > 599 {
			t.Errorf("%s has status %d", c, st)
		}
	}
}

// TestEmptyCompletion: a completion with no token (a stop string at the very start) still
// ends properly: an empty message, or a role chunk, the final chunk and [DONE].
func TestEmptyCompletion(t *testing.T) {
	req := testRequest()
	want, _ := reference(t, req)
	req.Stop = inference.StopList{want[:1]}
	h := Handler(newDispatcher(t))

	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body(t, req, false, false))))
	var got wireCompletion
	if err := json.Unmarshal(w.Body.Bytes(), &got); w.Code != 200 || err != nil || len(got.Choices) != 1 {
		t.Fatalf("non-streaming: %d %v %s", w.Code, err, w.Body)
	}
	if c := got.Choices[0]; c.Message.Content != "" || c.Message.Role != "assistant" || c.FinishReason != "stop" {
		t.Errorf("non-streaming choice %+v, want empty content, finish stop", c)
	}

	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body(t, req, true, true))))
	if w.Code != 200 || w.Header().Get("X-Meshinfer-Route") != "local" {
		t.Fatalf("streaming: status %d, route %q", w.Code, w.Header().Get("X-Meshinfer-Route"))
	}
	st := readStream(t, bufio.NewReader(w.Body))
	if st.text != "" || st.tokens != 0 || st.finish != "stop" || !st.done || st.usage == nil {
		t.Errorf("streaming: %+v, want no token, finish stop, usage and [DONE]", st)
	}
}
