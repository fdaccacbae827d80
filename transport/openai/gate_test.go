package openai

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/localonly"
)

// forbiddenDispatcher fails the test on any call: local-only requests must never reach it.
type forbiddenDispatcher struct {
	t     testing.TB
	calls atomic.Int64
}

func (f *forbiddenDispatcher) Models(context.Context) []Model {
	f.calls.Add(1)
	f.t.Errorf("Dispatcher.Models called")
	return nil
}

func (f *forbiddenDispatcher) Generate(_ context.Context, req *inference.Request, _ func(inference.Served, inference.Token) error) (inference.Result, inference.Served, error) {
	f.calls.Add(1)
	f.t.Errorf("Dispatcher.Generate called for model %q, prefs %+v", req.Model, req.Prefs)
	return inference.Result{}, inference.Served{}, inference.Errorf(inference.CodeUnavailable, "forbidden")
}

// holdMarker is the user message that makes holdingLocal hold the stream after its first
// token until the request's context ends, so that the client cancels mid-stream.
const holdMarker = "hold after the first token"

// holdingLocal is the real gate, holding the requests marked with holdMarker.
type holdingLocal struct {
	g     *localonly.Gate
	calls atomic.Uint64
}

func (l *holdingLocal) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	l.calls.Add(1)
	hold := req.Messages[len(req.Messages)-1].Content == holdMarker
	return l.g.Generate(ctx, req, func(t inference.Token) error {
		if err := emit(t); err != nil {
			return err
		}
		if hold && t.Index == 0 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
}

// TestLocalOnlyNeverReachesDispatcher sends thousands of local-only requests, their privacy
// set by the body, a header or the node's default, streaming and not, mixing successes,
// unknown models, requests cancelled mid-stream, oversized bodies and invalid JSON. None
// reaches the Dispatcher; the decodable ones reach the Local, the others nothing.
func TestLocalOnlyNeverReachesDispatcher(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of requests")
	}
	const (
		kinds   = 6  // the request shapes below
		sources = 3  // body, header, node default
		rounds  = 60 // of kinds×sources×2 (stream or not): 2,160 requests
		workers = 8
		limit   = 8 << 10 // body limit, bytes
	)
	d := &forbiddenDispatcher{t: t}
	l := &holdingLocal{g: newGate(t)}
	limits := WithLimits(inference.Limits{MaxBodyBytes: limit})
	byRequest := startServer(t, d, WithLocal(l), limits)
	byDefault := startServer(t, d, WithLocal(l), limits, WithDefaultPrefs(inference.Prefs{Privacy: inference.PrivacyLocalOnly}))
	c := newClient(t)

	type outcome int
	const (
		served outcome = iota
		refused
		cancelled
		tooLarge
		badJSON
	)
	var counts [badJSON + 1]atomic.Uint64

	send := func(i int) error {
		kind, source, stream := i%kinds, (i/kinds)%sources, (i/(kinds*sources))%2 == 1
		// Small: under the race detector the backend's arithmetic dominates the test's time.
		req := inference.Request{Model: testModel, Messages: []inference.Message{{Role: inference.RoleUser, Content: "hi"}}, MaxTokens: ptr(2)}
		want := served
		switch kind {
		case 1:
			req.Model, want = "synth-nope", refused
		case 2:
			req.Messages[len(req.Messages)-1].Content, want = holdMarker, cancelled
		case 3:
			want = tooLarge
		case 4:
			want = badJSON
		case 5:
			req.Model = "" // route auto: the gate picks the local model
		}
		meshinfer := ""
		switch {
		case source == 0 && kind == 5:
			meshinfer = `{"privacy":"local-only","route":"auto"}`
		case source == 0:
			meshinfer = `{"privacy":"local-only"}`
		case kind == 5:
			meshinfer = `{"route":"auto"}`
		}
		b := chatBody(t, req, stream, meshinfer)
		switch want {
		case tooLarge:
			b = append(b, bytes.Repeat([]byte{' '}, limit+1-len(b))...)
		case badJSON:
			b = b[:len(b)/2]
		}
		addr := byRequest.Addr()
		if source == 2 {
			addr = byDefault.Addr()
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if want == cancelled && !stream {
			// The client gives up while the request is held; it cannot see the first token.
			ctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
			defer cancel()
		}
		hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", bytes.NewReader(b))
		if err != nil {
			return err
		}
		if source == 1 {
			hr.Header.Set("X-Meshinfer-Privacy", "local-only")
		}
		resp, err := c.Do(hr)
		if want == cancelled && !stream {
			if err == nil {
				resp.Body.Close()
				return fmt.Errorf("request %d: held request answered %d", i, resp.StatusCode)
			}
			counts[want].Add(1)
			return nil
		}
		if err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		defer resp.Body.Close()
		if want == cancelled { // streaming: read the first token, then go away
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("request %d: held stream answered %d", i, resp.StatusCode)
			}
			if _, err := readEvent(bufio.NewReader(resp.Body)); err != nil {
				return fmt.Errorf("request %d: first event: %w", i, err)
			}
			cancel()
			io.Copy(io.Discard, resp.Body)
			counts[want].Add(1)
			return nil
		}
		out, err := io.ReadAll(resp.Body)
		if err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		wantStatus := map[outcome]int{served: 200, refused: 503, tooLarge: 413, badJSON: 400}[want]
		if resp.StatusCode != wantStatus {
			return fmt.Errorf("request %d (kind %d, source %d, stream %v): status %d, want %d: %s",
				i, kind, source, stream, resp.StatusCode, wantStatus, out)
		}
		// inference.Served and refused requests were tried on the local backend, and say so.
		wantRoute := want == served || want == refused
		if got := resp.Header.Get("X-Meshinfer-Route"); (got == "local") != wantRoute || (got == "") == wantRoute {
			return fmt.Errorf("request %d: X-Meshinfer-Route %q", i, got)
		}
		switch {
		case want == refused:
			var e struct{ Error wireError }
			if json.Unmarshal(out, &e) != nil || e.Error.Code != string(inference.CodeLocalUnavailable) {
				return fmt.Errorf("request %d: %s, want local_unavailable", i, out)
			}
		case want == served && stream:
			if at, err := streamServed(out); err != nil || at != (wireServed{"local", "local", 1}) {
				return fmt.Errorf("request %d: stream served at %+v (%v): %s", i, at, err, out)
			}
		case want == served:
			var comp wireCompletion
			if json.Unmarshal(out, &comp) != nil || comp.Meshinfer != (wireServed{"local", "local", 1}) || comp.Choices[0].Message.Content == "" {
				return fmt.Errorf("request %d: completion %s", i, out)
			}
		}
		counts[want].Add(1)
		return nil
	}

	total := rounds * kinds * sources * 2
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() { // ends when every request is sent, or at its first failure
			for i := int(next.Add(1)) - 1; i < total; i = int(next.Add(1)) - 1 {
				if err := send(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Close waits for every handler, held ones included: the counts below are final.
	byRequest.Close()
	byDefault.Close()

	if n := d.calls.Load(); n != 0 {
		t.Fatalf("the Dispatcher was called %d times", n)
	}
	per := uint64(total / kinds)
	if counts[served].Load() != 2*per || counts[refused].Load() != per || counts[cancelled].Load() != per ||
		counts[tooLarge].Load() != per || counts[badJSON].Load() != per {
		t.Errorf("outcomes served %d refused %d cancelled %d too large %d bad JSON %d, want %d, %d each",
			counts[served].Load(), counts[refused].Load(), counts[cancelled].Load(), counts[tooLarge].Load(),
			counts[badJSON].Load(), 2*per, per)
	}
	// Every decodable request reached the Local (a held non-streaming one might have been
	// given up before its body was read); the others reached nothing.
	st := l.g.Stats()
	if st.Served != 2*per || st.Refused != per || st.Failed > per || l.calls.Load() != st.Served+st.Refused+st.Failed {
		t.Errorf("gate stats %+v after %d Local calls; want %d served, %d refused, at most %d failed",
			st, l.calls.Load(), 2*per, per, per)
	}
	t.Logf("%d requests; gate %+v", total, st)
}

// streamServed returns the meshinfer object of a complete event stream's final chunk, for
// goroutines that cannot use readStream (it may stop the test).
func streamServed(b []byte) (wireServed, error) {
	br := bufio.NewReader(bytes.NewReader(b))
	var (
		at    *wireServed
		token bool
	)
	for {
		data, err := readEvent(br)
		if err != nil {
			return wireServed{}, err
		}
		if data == "[DONE]" {
			if at == nil || !token {
				return wireServed{}, fmt.Errorf("[DONE] without a token or a final chunk")
			}
			return *at, nil
		}
		var c wireChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil || c.Error != nil {
			return wireServed{}, fmt.Errorf("event %q (%v)", data, err)
		}
		if len(c.Choices) == 1 && c.Choices[0].Delta.Content != nil && *c.Choices[0].Delta.Content != "" {
			token = true
		}
		if c.Meshinfer != nil {
			at = c.Meshinfer
		}
	}
}
