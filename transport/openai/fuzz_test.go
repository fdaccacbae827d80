package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/localonly"
)

// FuzzChatCompletionBody feeds arbitrary bytes as the body of POST /v1/chat/completions. The
// handler must never panic, and every response is either a 200 (a completion, or an event
// stream that ends with [DONE] or an error event) or OpenAI error JSON whose code is in the
// closed set and whose type fits the status.
func FuzzChatCompletionBody(f *testing.F) {
	seeds := []string{
		`{"model":"synth-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`,
		`{"model":"synth-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}`,
		`{"model":"synth-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"synth-tiny","messages":[{"role":"system","content":null},{"role":"user","content":[{"type":"text","text":"a"}]}],"stop":"e","seed":-1,"temperature":0,"max_completion_tokens":3}`,
		`{"model":"synth-tiny","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		`{"model":"synth-nope","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"model":"synth-tiny","messages":[{"role":"user","content":"hi"}],"n":2}`,
		`{"model":"synth-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":1e9,"temperature":-1,"top_p":0}`,
		`{"model":"synth-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"meshinfer":{"tier":"local"}}`,
		`{"model":"synth-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"meshinfer":{"privacy":"local-only"},"stream":true}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"meshinfer":{"privacy":"local-only","route":"auto","priority":"cost"}}`,
		`{"model":"synth-nope","messages":[{"role":"user","content":"hi"}],"meshinfer":{"privacy":"local-only"}}`,
		`{"model":"synth-tiny","messages":[{"role":"user","content":"hi"}],"meshinfer":{"privacy":"strict","route":7}}`,
		`{"model":"auto","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"meshinfer":{"route":"auto"}}`,
		`{"model":"","messages":[]}`,
		`{"stop":[1]}`,
		`{}`, `null`, `[]`, `"x"`, ``, `{`, "\xff\xfe", `{"model":"synth-tiny","messages":[{"role":"user","content":"\ud800"}]}`,
		`{"model":"synth-tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":3}` + "   \n\t",
		strings.Repeat(`[`, 20000),
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	d := newDispatcher(f)
	// Small limits keep each input cheap: at most 64 tokens (those without max_tokens get the
	// fixed default of 256 on synth-tiny, still quick) and 8 KiB bodies.
	h := Handler(d, WithLimits(inference.Limits{MaxBodyBytes: 8 << 10, MaxTokens: 64}), WithLocal(localonly.New(d.b)))
	f.Fuzz(func(t *testing.T, b []byte) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(b)))
		checkResponse(t, w)
	})
}

func checkResponse(t *testing.T, w *httptest.ResponseRecorder) {
	ct := w.Header().Get("Content-Type")
	if w.Code != http.StatusOK {
		var e struct {
			Error *wireError `json:"error"`
		}
		if ct != "application/json" || json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Error == nil {
			t.Fatalf("status %d, Content-Type %q, body not OpenAI error JSON: %q", w.Code, ct, w.Body)
		}
		code, ok := inference.ParseCode(e.Error.Code)
		if !ok {
			t.Fatalf("error code %q is not in the closed set", e.Error.Code)
		}
		if w.Code != code.HTTPStatus() && w.Code != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d for code %s, want %d", w.Code, code, code.HTTPStatus())
		}
		if e.Error.Type != errorType(w.Code) || e.Error.Message == "" {
			t.Fatalf("error %+v for status %d", e.Error, w.Code)
		}
		return
	}
	switch ct {
	case "application/json":
		var c wireCompletion
		if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("200 body is not a completion (%v): %q", err, w.Body)
		}
		if fr := c.Choices[0].FinishReason; fr != "stop" && fr != "length" {
			t.Fatalf("finish_reason %q", fr)
		}
	case "text/event-stream":
		br := bufio.NewReader(w.Body)
		var last string
		for {
			data, err := readEvent(br)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("event stream: %v", err)
			}
			if data != "[DONE]" && !json.Valid([]byte(data)) {
				t.Fatalf("event is not JSON: %q", data)
			}
			last = data
		}
		if last != "[DONE]" && !strings.HasPrefix(last, `{"error":`) {
			t.Fatalf("stream ends with %q, neither [DONE] nor an error", last)
		}
	default:
		t.Fatalf("200 with Content-Type %q", ct)
	}
}
