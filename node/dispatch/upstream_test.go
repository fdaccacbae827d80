package dispatch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/inference/upstream"
	"github.com/meshinfer/meshinfer/transport/openai"
)

// No decision waits on the backend's model listing: with --backend openai pointed at a
// server whose GET /v1/models hangs, requests are decided and served at once. The server is
// real: another executor over the synthetic model behind the OpenAI API.
func TestDecisionsDoNotWaitForAHangingModelListing(t *testing.T) {
	sb, err := synth.New(model)
	if err != nil {
		t.Fatal(err)
	}
	behind := newExecutor(t, Config{Local: sb, Peers: peers{}, Registry: entries{}, Rep: newRep(t)})
	api := openai.Handler(behind)
	release := make(chan struct{})
	var listings, abandoned atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			listings.Add(1)
			select {
			case <-release:
			case <-r.Context().Done():
				abandoned.Add(1) // the backend gave up on it: it waited for the listing
				return
			}
		}
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs first: the hanging listing returns

	// The listing may hang for an hour: a backend that waited for it could not answer.
	ub, err := upstream.New(srv.URL, []string{model}, upstream.WithModelsTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ub.Close() })
	d := newExecutor(t, Config{Local: ub, Peers: peers{}, Registry: entries{}, Rep: newRep(t)})
	for i := range 5 {
		// A deadline far above any machine's time for 4 tokens, only so that a regression
		// fails instead of hanging.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		got := 0
		_, at, err := d.Generate(ctx, chat(model, 4), func(inference.Served, inference.Token) error { got++; return nil })
		cancel()
		if err != nil || at.Tier != inference.TierLocal || got == 0 {
			t.Fatalf("request %d: %v at %+v after %d tokens", i, err, at, got)
		}
	}
	// A backend that waited for the listing would have given up on it (at the request's
	// deadline) before the first request could be decided.
	if n, gaveUp := listings.Load(), abandoned.Load(); n != 1 || gaveUp != 0 {
		t.Fatalf("the upstream saw %d listing requests, %d abandoned; want one, still hanging", n, gaveUp)
	}
}
