package openai

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/localonly"
	"github.com/meshinfer/meshinfer/inference/synth"
)

// deadlineSeen records the deadline of the context a Dispatcher's Generate received.
type deadlineSeen struct {
	at  time.Time // when Generate began
	dl  time.Time
	set bool
}

// TestTimeoutPref: the timeout preference comes from the body's meshinfer object, else
// X-Meshinfer-Timeout, as a Go duration in (0, 1h]; a valid one is Request.Prefs.Timeout and
// the deadline of the context the Dispatcher receives, counted from when the request was
// accepted. Anything else is a 400 invalid_request naming the source, the value and the
// accepted form, and reaches no Dispatcher: a bad header under a good body too.
func TestTimeoutPref(t *testing.T) {
	tests := []struct {
		name   string
		body   string // the meshinfer object; "" for none
		header string // X-Meshinfer-Timeout; "" for none
		want   time.Duration
		bad    []string // for a refusal: what its message says
	}{
		{name: "none"},
		{name: "body", body: `{"timeout":"30s"}`, want: 30 * time.Second},
		{name: "header", header: "2m", want: 2 * time.Minute},
		{name: "composite", header: "1m30s", want: 90 * time.Second},
		{name: "sub-second", body: `{"timeout":"250ms"}`, want: 250 * time.Millisecond},
		{name: "the bound", body: `{"timeout":"1h"}`, want: time.Hour},
		{name: "body beats header", body: `{"timeout":"5s"}`, header: "10m", want: 5 * time.Second},
		{name: "empty body value is not given", body: `{"timeout":""}`, header: "7s", want: 7 * time.Second},
		{name: "null body value is not given", body: `{"timeout":null}`, header: "7s", want: 7 * time.Second},
		{name: "beside other prefs", body: `{"privacy":"mesh","timeout":"45s"}`, want: 45 * time.Second},

		{name: "zero", body: `{"timeout":"0s"}`, bad: []string{"meshinfer object", `timeout "0s"`, "a duration such as 30s or 2m, at most 1h"}},
		{name: "bare zero", header: "0", bad: []string{"X-Meshinfer-Timeout header", `timeout "0"`, "at most 1h"}},
		{name: "negative", header: "-5s", bad: []string{"X-Meshinfer-Timeout header", `timeout "-5s"`, "a duration such as 30s or 2m"}},
		{name: "over 1h", body: `{"timeout":"61m"}`, bad: []string{"meshinfer object", `timeout "61m"`, "at most 1h"}},
		{name: "over 1h by a nanosecond", header: "1h0m0.000000001s", bad: []string{"X-Meshinfer-Timeout header", "at most 1h"}},
		{name: "plain seconds", header: "30", bad: []string{"X-Meshinfer-Timeout header", `timeout "30"`, "a duration such as 30s or 2m"}},
		{name: "garbage", body: `{"timeout":"soon"}`, bad: []string{"meshinfer object", `timeout "soon"`, "a duration such as 30s or 2m, at most 1h"}},
		{name: "long garbage cut", header: strings.Repeat("9", 500), bad: []string{"X-Meshinfer-Timeout header", "at most 1h"}},
		{name: "bad header under a good body", body: `{"timeout":"30s"}`, header: "forever",
			bad: []string{"X-Meshinfer-Timeout header", `timeout "forever"`, "at most 1h"}},
		{name: "bad body over a good header", body: `{"timeout":"-1s"}`, header: "30s",
			bad: []string{"meshinfer object", `timeout "-1s"`}},
		{name: "number", body: `{"timeout":30}`, bad: []string{"not a chat completion request"}},
	}
	base := newDispatcher(t) // one backend: its weights load once
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			var seen deadlineSeen
			d := &spyDispatcher{next: &synthDispatcher{b: base.b, at: base.at, before: func(ctx context.Context) error {
				seen.at = time.Now()
				seen.dl, seen.set = ctx.Deadline()
				return nil
			}}}
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(chatBody(t, testRequest(), stream, tt.body)))
			if tt.header != "" {
				r.Header.Set("X-Meshinfer-Timeout", tt.header)
			}
			w := httptest.NewRecorder()
			sent := time.Now()
			Handler(d).ServeHTTP(w, r)

			if tt.bad != nil {
				if !checkRefusedPref(t, fmt.Sprintf("%s (stream %v)", tt.name, stream), w, tt.bad) {
					continue
				}
				if n := len(d.calls()); n != 0 {
					t.Errorf("%s: reached the Dispatcher %d times", tt.name, n)
				}
				continue
			}
			if w.Code != http.StatusOK {
				t.Errorf("%s (stream %v): status %d: %s", tt.name, stream, w.Code, w.Body)
				continue
			}
			calls := d.calls()
			if len(calls) != 1 || calls[0].Prefs.Timeout != tt.want {
				t.Errorf("%s (stream %v): calls %+v; want one with timeout %v", tt.name, stream, calls, tt.want)
				continue
			}
			switch {
			case tt.want == 0 && seen.set:
				t.Errorf("%s: the Dispatcher's context has a deadline %v without a time limit", tt.name, seen.dl)
			case tt.want == 0:
			case !seen.set:
				t.Errorf("%s (stream %v): the Dispatcher's context has no deadline, want one %v after acceptance", tt.name, stream, tt.want)
			case seen.dl.Before(sent.Add(tt.want)) || seen.dl.After(seen.at.Add(tt.want)):
				// accepted is between sent and the Dispatcher's call: so is the deadline, shifted by the limit.
				t.Errorf("%s (stream %v): deadline %v, want in [%v, %v]", tt.name, stream, seen.dl, sent.Add(tt.want), seen.at.Add(tt.want))
			}
		}
	}
}

// TestTimeoutDefaultPref: a node's default timeout (WithDefaultPrefs) applies to a request
// that gives none, below the request's own; New refuses one out of bounds.
func TestTimeoutDefaultPref(t *testing.T) {
	d := &spyDispatcher{next: newDispatcher(t)}
	h := Handler(d, WithDefaultPrefs(inference.Prefs{Timeout: time.Minute}))
	for _, hdr := range []string{"", "3s"} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body(t, testRequest(), false, false)))
		if hdr != "" {
			r.Header.Set("X-Meshinfer-Timeout", hdr)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("header %q: status %d: %s", hdr, w.Code, w.Body)
		}
	}
	if c := d.calls(); len(c) != 2 || c[0].Prefs.Timeout != time.Minute || c[1].Prefs.Timeout != 3*time.Second {
		t.Fatalf("calls %+v, want timeouts 1m (the node's) then 3s (the header's)", c)
	}
	if s, err := New("127.0.0.1:0", newDispatcher(t), WithDefaultPrefs(inference.Prefs{Timeout: 2 * time.Hour})); err == nil || !strings.Contains(err.Error(), "at most 1h") {
		if s != nil {
			s.Close()
		}
		t.Errorf("New with a 2h default timeout: %v, want an error naming the bound", err)
	}
}

// holdBackend is the real synthetic backend with one hold: before its first token
// (holdAt 0) or after token holdAt-1 was emitted, it waits for the request's context to end
// and returns its error, as a backend too slow for the time limit would. The wait is on the
// context, not on the clock: the test does not race the limit.
type holdBackend struct {
	*synth.Backend
	holdAt int
}

func (b *holdBackend) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	if b.holdAt == 0 {
		<-ctx.Done()
		return inference.Result{}, ctx.Err()
	}
	return b.Backend.Generate(ctx, req, func(tok inference.Token) error {
		if err := emit(tok); err != nil {
			return err
		}
		if tok.Index == b.holdAt-1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
}

// TestTimeoutEndsTheRequest: a request still running when its time limit passes ends once
// with timeout, on the Dispatcher's path and the Local's alike: before its first token as a
// 504 JSON error, after it as the stream's one error event (no [DONE]); the message names
// the limit.
func TestTimeoutEndsTheRequest(t *testing.T) {
	const limit = "50ms"
	sb, err := synth.New(testModel)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		local  bool // privacy local-only: the Local serves it
		holdAt int  // 0: before the first token; n: after n tokens
		stream bool
	}{
		{"dispatcher before the first token", false, 0, false},
		{"dispatcher before the first token, streaming", false, 0, true},
		{"dispatcher mid-stream", false, 3, true},
		{"dispatcher mid-completion", false, 3, false},
		{"local before the first token", true, 0, true},
		{"local mid-stream", true, 3, true},
		{"local mid-completion", true, 3, false},
	} {
		// In a synctest bubble the 50ms pass only when every goroutine waits: the tokens
		// before the hold are all written first however slow the machine (CI saw 1 of 3 in
		// 50ms of real time, under -race on two busy cores).
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hb := &holdBackend{Backend: sb, holdAt: tt.holdAt}
				d := &synthDispatcher{b: sb, at: inference.Served{Tier: inference.TierLocal, Attempts: 1}}
				if tt.holdAt == 0 {
					d.before = func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
				} else {
					d.after = func(ctx context.Context, tok inference.Token) error {
						if tok.Index == tt.holdAt-1 {
							<-ctx.Done()
							return ctx.Err()
						}
						return nil
					}
				}
				meshinfer := `{"timeout":"` + limit + `"}`
				if tt.local {
					meshinfer = `{"timeout":"` + limit + `","privacy":"local-only"}`
				}
				r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
					bytes.NewReader(chatBody(t, testRequest(), tt.stream, meshinfer)))
				w := httptest.NewRecorder()
				Handler(d, WithLocal(localonly.New(hb))).ServeHTTP(w, r)

				var e wireError
				if tt.stream && tt.holdAt > 0 {
					if w.Code != http.StatusOK {
						t.Fatalf("status %d, want a 200 stream: %s", w.Code, w.Body)
					}
					got := readStream(t, bufio.NewReader(w.Body))
					if got.err == nil || got.done || got.tokens != tt.holdAt {
						t.Fatalf("stream: %d tokens, error %+v, [DONE] %v; want %d tokens and an error event", got.tokens, got.err, got.done, tt.holdAt)
					}
					e = *got.err
				} else {
					if w.Code != http.StatusGatewayTimeout {
						t.Fatalf("status %d, want 504: %s", w.Code, w.Body)
					}
					e = decodeError(t, w.Code, w.Header(), w.Body.Bytes())
				}
				if e.Code != string(inference.CodeTimeout) || !strings.Contains(e.Message, "the request's "+limit+" time limit passed") {
					t.Fatalf("error %+v, want timeout naming the %s limit", e, limit)
				}
			})
		})
	}
}
