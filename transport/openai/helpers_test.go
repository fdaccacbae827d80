package openai

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testModel = "synth-tiny"

func ptr[T any](v T) *T { return &v }

// synthDispatcher serves every request with the real synthetic backend, reporting every
// token and outcome as served at one place. Its hooks only fail or hold a request: tokens
// always come from the backend.
type synthDispatcher struct {
	b  *synth.Backend
	at inference.Served
	// before, if set, runs before generation; a non-nil error is Generate's outcome.
	before func(ctx context.Context) error
	// after, if set, runs after each token has been emitted; a non-nil error ends Generate
	// with it (as a backend failing mid-stream would).
	after func(ctx context.Context, t inference.Token) error
}

func newDispatcher(t testing.TB) *synthDispatcher {
	t.Helper()
	b, err := synth.New(testModel)
	if err != nil {
		t.Fatalf("synth.New: %v", err)
	}
	return &synthDispatcher{b: b, at: inference.Served{Tier: inference.TierLocal, Attempts: 1}}
}

func (d *synthDispatcher) Models(ctx context.Context) []Model {
	infos, _ := d.b.Models(ctx) // never fails
	out := make([]Model, 0, len(infos))
	for _, m := range infos {
		out = append(out, Model{ID: m.Name, Warm: m.Warm, Routes: []string{d.at.Route()}, Deterministic: m.Deterministic})
	}
	return out
}

func (d *synthDispatcher) Generate(ctx context.Context, req *inference.Request, emit func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
	if d.before != nil {
		if err := d.before(ctx); err != nil {
			return inference.Result{}, d.at, err
		}
	}
	res, err := d.b.Generate(ctx, req, func(t inference.Token) error {
		if err := emit(d.at, t); err != nil {
			return err
		}
		if d.after != nil {
			return d.after(ctx, t)
		}
		return nil
	})
	return res, d.at, err
}

// testRequest is a small sampled request: a few dozen tokens of synth-tiny.
func testRequest() inference.Request {
	return inference.Request{
		Model:       testModel,
		Messages:    []inference.Message{{Role: inference.RoleSystem, Content: "be brief"}, {Role: inference.RoleUser, Content: "hello mesh"}},
		MaxTokens:   ptr(24),
		Temperature: ptr(0.8),
		Seed:        ptr[int64](7),
	}
}

// reference runs req on a fresh backend directly: what the API must return for it.
func reference(t testing.TB, req inference.Request) (string, inference.Result) {
	t.Helper()
	b, err := synth.New(testModel)
	if err != nil {
		t.Fatalf("synth.New: %v", err)
	}
	var text strings.Builder
	res, err := b.Generate(context.Background(), &req, func(tok inference.Token) error {
		text.WriteString(tok.Text)
		return nil
	})
	if err != nil {
		t.Fatalf("reference Generate: %v", err)
	}
	if text.Len() == 0 {
		t.Fatalf("reference produced no text")
	}
	return text.String(), res
}

// startServer serves d on a loopback port for the test's duration.
func startServer(t testing.TB, d Dispatcher, opts ...Option) *Server {
	t.Helper()
	s, err := New("127.0.0.1:0", d, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newClient is an HTTP client whose connections are closed when the test ends (goleak).
func newClient(t testing.TB) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// body encodes req as a request body; stream and includeUsage set those fields.
func body(t testing.TB, req inference.Request, stream, includeUsage bool) []byte {
	t.Helper()
	cr := chatRequest{Request: req}
	cr.Stream = stream
	if includeUsage {
		cr.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	b, err := json.Marshal(cr)
	if err != nil {
		t.Fatalf("marshal request: %v", err)
	}
	return b
}

// post sends a chat completion with ctx and returns the response; the caller closes it.
func post(t testing.TB, ctx context.Context, c *http.Client, addr string, b []byte) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("NewRequest: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	return resp
}

// wireCompletion and wireChunk decode responses as a client would, independently of the
// package's own types.
type wireCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage     inference.Usage `json:"usage"`
	Meshinfer wireServed      `json:"meshinfer"`
}

// wireServed is a response's meshinfer object.
type wireServed struct {
	Route    string `json:"route"`
	Tier     string `json:"tier"`
	Attempts int    `json:"attempts"`
}

type wireChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage     *inference.Usage `json:"usage"`
	Meshinfer *wireServed      `json:"meshinfer"`
	Error     *wireError       `json:"error"`
}

type wireError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// decodeError reads an error response and checks its shape: JSON content type, a code of
// the closed set, a type fitting the status, a null param.
func decodeError(t testing.TB, status int, header http.Header, b []byte) wireError {
	t.Helper()
	if ct := header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("error response Content-Type %q, want application/json", ct)
	}
	var body struct {
		Error *wireError `json:"error"`
	}
	if err := json.Unmarshal(b, &body); err != nil || body.Error == nil {
		t.Fatalf("error response %d is not OpenAI error JSON (%v): %q", status, err, b)
	}
	e := *body.Error
	if _, ok := inference.ParseCode(e.Code); !ok {
		t.Errorf("error code %q is not in the closed set", e.Code)
	}
	if want := errorType(status); e.Type != want {
		t.Errorf("status %d: error type %q, want %q", status, e.Type, want)
	}
	if e.Param != nil {
		t.Errorf("error param = %q, want null", *e.Param)
	}
	if e.Message == "" {
		t.Errorf("error %s has no message", e.Code)
	}
	return e
}

// readEvent returns the data of the next server-sent event, or io.EOF at a clean end.
func readEvent(br *bufio.Reader) (string, error) {
	var data []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if line == "" && len(data) == 0 {
				return "", err
			}
			return "", fmt.Errorf("unterminated event %q: %w", line, err)
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			if len(data) == 0 {
				continue
			}
			return strings.Join(data, "\n"), nil
		}
		v, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			return "", fmt.Errorf("unexpected line %q", line)
		}
		data = append(data, v)
	}
}

// streamed is what a client learns from a whole event stream.
type streamed struct {
	text   string
	tokens int              // token chunks (content deltas)
	finish string           // finish_reason of the final chunk
	served wireServed       // meshinfer object of the final chunk
	usage  *inference.Usage // from the usage chunk
	err    *wireError       // the error event, if the stream ended with one
	done   bool             // [DONE] seen
}

// readStream reads every event of br until EOF and checks the stream's grammar: chunks with
// one id, the role first, content chunks, then either a final chunk, an optional usage chunk
// and [DONE], or one error event; nothing after either end.
func readStream(t testing.TB, br *bufio.Reader) streamed {
	t.Helper()
	var (
		s      streamed
		id     string
		events int
		text   strings.Builder
	)
	for {
		data, err := readEvent(br)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading event %d: %v", events, err)
		}
		if s.done || s.err != nil {
			t.Fatalf("event %q after the end of the stream", data)
		}
		events++
		if data == "[DONE]" {
			if s.finish == "" {
				t.Errorf("[DONE] without a final chunk")
			}
			s.done = true
			continue
		}
		var c wireChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("event %d is not JSON: %v: %q", events, err, data)
		}
		if c.Error != nil {
			if _, ok := inference.ParseCode(c.Error.Code); !ok {
				t.Errorf("error event code %q is not in the closed set", c.Error.Code)
			}
			s.err = c.Error
			continue
		}
		if c.Object != "chat.completion.chunk" || !strings.HasPrefix(c.ID, "chatcmpl-") || c.Model == "" || c.Created == 0 {
			t.Errorf("chunk %d header: %+v", events, c)
		}
		if id == "" {
			id = c.ID
		} else if c.ID != id {
			t.Errorf("chunk id changed from %q to %q", id, c.ID)
		}
		if c.Usage != nil {
			if len(c.Choices) != 0 || s.finish == "" {
				t.Errorf("usage chunk %d: %d choices, after final chunk %v", events, len(c.Choices), s.finish != "")
			}
			s.usage = c.Usage
			continue
		}
		if len(c.Choices) != 1 || c.Choices[0].Index != 0 {
			t.Fatalf("chunk %d has choices %+v, want one with index 0", events, c.Choices)
		}
		ch := c.Choices[0]
		if s.finish != "" {
			t.Errorf("chunk %d after the final chunk", events)
		}
		if (events == 1) != (ch.Delta.Role == "assistant") {
			t.Errorf("chunk %d has role %q; only the first has role assistant", events, ch.Delta.Role)
		}
		if ch.FinishReason != nil {
			if ch.Delta.Content != nil || ch.Delta.Role != "" {
				t.Errorf("final chunk has a non-empty delta %+v", ch.Delta)
			}
			s.finish = *ch.FinishReason
			if c.Meshinfer != nil {
				s.served = *c.Meshinfer
			}
			continue
		}
		if ch.Delta.Content == nil {
			t.Errorf("chunk %d has no content", events)
			continue
		}
		if *ch.Delta.Content != "" {
			s.tokens++
			text.WriteString(*ch.Delta.Content)
		}
	}
	if !s.done && s.err == nil {
		t.Errorf("stream ended with neither [DONE] nor an error event")
	}
	s.text = text.String()
	return s
}

// recv waits for a signal from a dispatcher hook; a missing one fails the test rather than
// hanging it.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}
