//go:build soak

package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/gateway/client"
)

// Under 256 WebSocket clients at once, each with a few small requests, against one
// coordinator and four peers: every admitted request completes once (and is metered
// once), the excess is refused with a typed error (overloaded), and every goroutine the
// clients caused is gone after they close. The coordinator refuses at once, without asking a
// peer, a request that only peers already running 8 of its requests could serve (their
// per-requester limit), so refusals come back faster than completions: the test asserts it
// at the median. What remains of a refusal's time is the burst itself queueing for 2 cores.
func TestSoakLoad256Clients(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	const (
		clients   = 256
		perClient = 4 // requests each client has in flight at once
		npeers    = 4
	)
	start := time.Now()
	f := startMesh(t, npeers)
	setup := time.Since(start)
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	base := "http://" + f.coord.APIAddr()

	// Warm the route (the peers' model load) so the load measures the steady state.
	warm := client.New(base, f.key, client.WithHTTPClient(hc), client.WithDevice("warm"))
	if _, err := warm.Chat(context.Background(), chatBody(1, 4), nil); err != nil {
		t.Fatal(err)
	}
	warm.Close()
	runtime.GC()
	baseG := runtime.NumGoroutine()
	heap := sampleHeap(5 * time.Millisecond)

	type outcome struct {
		err    error
		dur    time.Duration
		tokens int
	}
	out := make([]outcome, clients*perClient)
	cs := make([]*client.Client, clients)
	for i := range cs {
		cs[i] = client.New(base, f.key, client.WithHTTPClient(hc), client.WithDevice(fmt.Sprintf("load-%03d", i)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	loadStart := time.Now()
	var wg sync.WaitGroup
	for i, c := range cs {
		for j := range perClient {
			k := i*perClient + j
			wg.Go(func() {
				s := time.Now()
				res, err := c.Chat(ctx, chatBody(int64(k), 4), nil)
				out[k] = outcome{err: err, dur: time.Since(s), tokens: res.Tokens}
			})
		}
	}
	wg.Wait()
	loadDur := time.Since(loadStart)
	for _, c := range cs {
		c.Close()
	}
	peak := heap.end()

	var ok, overloaded int
	var okDur, olDur []float64
	refused := map[string]int{} // typed refusals other than overloaded, by code
	other := map[string]int{}
	for _, o := range out {
		var e *client.Error
		switch {
		case o.err == nil:
			ok++
			okDur = append(okDur, us(o.dur))
			if o.tokens == 0 || o.tokens > 4 {
				t.Errorf("completed with %d tokens", o.tokens)
			}
		case errors.As(o.err, &e) && e.Code == string(inference.CodeOverloaded):
			overloaded++
			olDur = append(olDur, us(o.dur))
		case errors.As(o.err, &e) && (e.Code == string(inference.CodeUnavailable) || e.Code == string(inference.CodePeerLost)):
			// Every peer refused or dropped it and the client's one retry did too: a typed
			// refusal before any token, never a partial completion.
			refused[e.Code]++
		default:
			other[o.err.Error()]++
		}
	}
	if len(other) > 0 {
		t.Errorf("requests failed other than by a typed refusal: %v", other)
	}
	if ok == 0 {
		t.Fatal("no request completed")
	}

	// Goroutines back to the baseline: the clients' and the coordinator's per-connection ones.
	// The baseline grows by one goroutine per inference stream the coordinator keeps idle
	// for reuse: its peer's handler waiting for the next request (at most 4 per peer).
	eventually(10*time.Second, func() bool { return runtime.NumGoroutine() <= baseG+f.idleSessions() })
	if g, idle := runtime.NumGoroutine(), f.idleSessions(); g > baseG+idle || idle > 4*npeers {
		t.Errorf("%d goroutines after every client closed, %d before and %d idle inference streams (at most %d)", g, baseG, idle, 4*npeers)
	}

	// Exactly once: the coordinator metered as many completions as callers got results (the
	// warm-up adds one).
	// Metering runs just after each response: wait until it has caught up.
	total := waitUsage(t, f.dir, func(u gateway.Usage) bool { return u.Completed >= ok+1 })
	if total.Completed != ok+1 {
		t.Errorf("metered %d completions, callers got %d (+1 warm-up)", total.Completed, ok)
	}

	t.Logf("setup %v (coordinator + %d peers joined), load %v, %d clients × %d requests", setup.Round(time.Millisecond), npeers, loadDur.Round(time.Millisecond), clients, perClient)
	t.Logf("completed %d, overloaded %d, other refusals %v, metered requests %d completed %d", ok, overloaded, refused, total.Requests, total.Completed)
	t.Logf("completed latency p50 %.0f µs p99 %.0f µs; overloaded answered p50 %.0f µs p99 %.0f µs", quantile(okDur, .5), quantile(okDur, .99), quantile(olDur, .5), quantile(olDur, .99))
	t.Logf("figure L1: %d × %d requests: %d completed, each metered once; %d overloaded (p99 %.0f ms), other typed refusals %v; completed p99 %.0f ms; peak heap %.0f MiB",
		clients, perClient, ok, overloaded, quantile(olDur, .99)/1e3, refused, quantile(okDur, .99)/1e3, float64(peak)/(1<<20))
	if olP50, okP50 := quantile(olDur, .5), quantile(okDur, .5); overloaded > 0 && olP50 >= okP50 {
		t.Errorf("refusals took %.0f µs at the median, completions %.0f µs: refusals should be faster", olP50, okP50)
	}
	t.Logf("peak HeapInuse %.1f MiB; goroutines %d before, %d after", float64(peak)/(1<<20), baseG, runtime.NumGoroutine())
}
