package client_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/transport/gateway/client"
	"github.com/meshinfer/meshinfer/transport/infer"
)

// BenchmarkCoordinator measures what a coordinator adds, interleaved in one run
// (docs/benchmarks.md §7.1): the same small non-streaming request (a) straight to a peer node's
// API, (b) through the coordinator's REST API with a key, (c) through the WebSocket client;
// and a ~200-token stream straight to the peer and through the coordinator. The
// coordinator serves no model: (b) and (c) cross one libp2p hop to one of four peers, so
// b−a and c−a are the coordinator's own cost plus that hop.
//
// The coordinator's own cost beyond the two network legs is measured too: (h) the HTTP leg
// alone, the same request body posted over loopback to a handler that reads it and answers
// a completion-sized JSON, and (d) the libp2p leg with the peer's work, the same request
// sent by a bare libp2p host straight to a peer's inference protocol (asking for a receipt,
// as a coordinator does). Per iteration, own = b − h − d.
func BenchmarkCoordinator(b *testing.B) {
	const (
		npeers       = 4
		warmup       = 50  // iterations discarded before measuring
		streamTokens = 200 // max_tokens of the streaming request
	)
	f := startMesh(b, npeers)
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	direct := "http://" + f.peers[0].APIAddr() + "/v1/chat/completions"
	coord := "http://" + f.coord.APIAddr() + "/v1/chat/completions"
	ws := client.New("http://"+f.coord.APIAddr(), f.key, client.WithHTTPClient(hc), client.WithDevice("bench"))
	defer ws.Close()

	small, _ := json.Marshal(chatBody(7, 4))
	var smallReq inference.Request
	if err := json.Unmarshal(small, &smallReq); err != nil {
		b.Fatal(err)
	}
	// (h): the HTTP leg alone.
	answer := bytes.Repeat([]byte("x"), 420)
	leg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(answer)
	}))
	defer leg.Close()
	// (d): the libp2p leg and the peer's work, from a bare host.
	bare, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		b.Fatal(err)
	}
	defer bare.Close()
	if err := bare.Connect(context.Background(), f.peers[0].AddrInfo()); err != nil {
		b.Fatal(err)
	}
	peerClient := infer.NewClient(bare, infer.WithReceipts())
	stream := chatBody(7, streamTokens)
	stream["stream"] = true
	streamBody, _ := json.Marshal(stream)

	post := func(url, key string, body []byte) (tokens int) {
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			msg, _ := io.ReadAll(resp.Body)
			b.Fatalf("%s: %d %s", url, resp.StatusCode, msg)
		}
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			_, _ = io.Copy(io.Discard, resp.Body)
			return 0
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || line == "[DONE]" {
				continue
			}
			var ev struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(line), &ev) == nil && len(ev.Choices) > 0 && ev.Choices[0].Delta.Content != "" {
				tokens++
			}
		}
		return tokens
	}
	timed := func(fn func()) time.Duration {
		s := time.Now()
		fn()
		return time.Since(s)
	}
	paths := []func() time.Duration{
		func() time.Duration { return timed(func() { post(direct, "", small) }) },
		func() time.Duration { return timed(func() { post(coord, f.key, small) }) },
		func() time.Duration {
			return timed(func() {
				if _, err := ws.Chat(context.Background(), small, nil); err != nil {
					b.Fatal(err)
				}
			})
		},
		func() time.Duration { return timed(func() { post(leg.URL, "", small) }) },
		func() time.Duration {
			return timed(func() {
				if _, err := peerClient.Generate(context.Background(), f.peers[0].ID(), &smallReq, func(inference.Token) error { return nil }); err != nil {
					b.Fatal(err)
				}
			})
		},
	}
	var dA, dB, dC, dH, dD, diffB, diffC, own, tpsD, tpsC, ratio []float64
	var tokD, tokC int
	iter := func(i int, keep bool) {
		var d [5]time.Duration
		for k := range len(d) { // rotate the order every iteration: no path always goes first
			p := (i + k) % len(d)
			d[p] = paths[p]()
		}
		var sd, sc time.Duration
		if i%2 == 0 { // ABBA for the streams
			sd = timed(func() { tokD = post(direct, "", streamBody) })
			sc = timed(func() { tokC = post(coord, f.key, streamBody) })
		} else {
			sc = timed(func() { tokC = post(coord, f.key, streamBody) })
			sd = timed(func() { tokD = post(direct, "", streamBody) })
		}
		if !keep {
			return
		}
		dA, dB, dC = append(dA, us(d[0])), append(dB, us(d[1])), append(dC, us(d[2]))
		diffB, diffC = append(diffB, us(d[1]-d[0])), append(diffC, us(d[2]-d[0]))
		dH, dD, own = append(dH, us(d[3])), append(dD, us(d[4])), append(own, us(d[1]-d[3]-d[4]))
		td, tc := float64(tokD)/sd.Seconds(), float64(tokC)/sc.Seconds()
		tpsD, tpsC, ratio = append(tpsD, td), append(tpsC, tc), append(ratio, tc/td)
	}
	for i := range warmup {
		iter(i, false)
	}
	if tokD != tokC || tokD == 0 {
		b.Fatalf("stream: %d tokens direct, %d through the coordinator", tokD, tokC)
	}
	var ru0, ru1 runtimeCPU
	ru0.read()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		iter(i, true)
	}
	b.StopTimer()
	ru1.read()

	addB, addC, r := quantile(diffB, .5), quantile(diffC, .5), quantile(ratio, .5)
	lo, hi := bootstrapMedianCI(ratio, 1000)
	b.ReportMetric(addB, "rest-added-µs/op")
	b.ReportMetric(addC, "ws-added-µs/op")
	b.ReportMetric(quantile(own, .5), "own-µs/op")
	b.ReportMetric(r, "stream-tps-ratio")
	b.ReportMetric(0, "ns/op") // one op is seven requests: ns/op says nothing by itself
	var sb strings.Builder
	fmt.Fprintf(&sb, "GOMAXPROCS=%d %s, %d iterations after %d warm-up, coordinator + %d peers on loopback, CPU %.0f µs/iteration (7 requests)\n",
		runtime.GOMAXPROCS(0), runtime.Version(), len(dA), warmup, npeers, ru1.sub(ru0)/float64(max(len(dA), 1)))
	fmt.Fprintf(&sb, "%-34s %10s %10s\n", "small request (max_tokens 4)", "p50 µs", "p99 µs")
	for _, row := range []struct {
		name string
		xs   []float64
	}{{"(a) direct to a peer's API", dA}, {"(b) coordinator REST + key", dB}, {"(c) coordinator WebSocket client", dC},
		{"(h) HTTP leg alone", dH}, {"(d) libp2p leg + peer, bare host", dD},
		{"b − a (added by coordinator)", diffB}, {"c − a (added by coordinator)", diffC},
		{"b − h − d (coordinator's own)", own}} {
		fmt.Fprintf(&sb, "%-34s %10.0f %10.0f\n", row.name, quantile(row.xs, .5), quantile(row.xs, .99))
	}
	fmt.Fprintf(&sb, "stream of %d tokens: direct p50 %.0f tok/s, through coordinator p50 %.0f tok/s, ratio p50 %.3f (95%% CI %.3f–%.3f; goal ≥ 0.99)\n",
		tokD, quantile(tpsD, .5), quantile(tpsC, .5), r, lo, hi)
	fmt.Fprintf(os.Stdout, "=== %s\n%s", b.Name(), sb.String())
}

// bootstrapMedianCI is a percentile-bootstrap 95 % confidence interval of xs's median.
func bootstrapMedianCI(xs []float64, rounds int) (lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	meds := make([]float64, rounds)
	s := make([]float64, len(xs))
	seed := uint64(1)
	for r := range meds {
		for i := range s {
			seed = seed*6364136223846793005 + 1442695040888963407 // LCG: deterministic resampling
			s[i] = xs[(seed>>33)%uint64(len(xs))]
		}
		meds[r] = quantile(s, .5)
	}
	return quantile(meds, .025), quantile(meds, .975)
}

// runtimeCPU is the process's user+system CPU time (getrusage).
type runtimeCPU struct{ t time.Duration }

func (c *runtimeCPU) read() {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.t = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
}

// sub is c − o in µs.
func (c runtimeCPU) sub(o runtimeCPU) float64 { return us(c.t - o.t) }
