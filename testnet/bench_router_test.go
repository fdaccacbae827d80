package testnet

import (
	"bufio"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkColdStartTTFT measures the time to first token of a request for a cold local
// model, with speculative dispatch (privacy any, priority latency: a cloud stream starts
// while the model loads) and without it (privacy mesh: the request waits for the load), in
// one run, for two cold starts: a long one (synth-small with 2 s added, standing for a real
// model read from disk) where the cloud's first token comes first, and the bare preset
// (synth-tiny, milliseconds) where local is ready first and speculation only costs the
// cancelled cloud request. The stand-in cloud adds 300 ms. Each sample is a fresh node, so
// the model is cold every time; the two variants alternate.
//
//	go test -run='^$' -bench=ColdStartTTFT -benchtime=1x ./testnet/
func BenchmarkColdStartTTFT(b *testing.B) {
	const reps = 3
	cases := []struct {
		name      string
		model     string
		coldStart time.Duration
	}{
		{"long-cold-start", "synth-small", 2 * time.Second},
		{"short-cold-start", "synth-tiny", 0},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var with, without []time.Duration
			for i := range reps {
				for _, spec := range []bool{i%2 == 0, i%2 != 0} {
					ttft := coldTTFT(b, c.model, c.coldStart, spec)
					if spec {
						with = append(with, ttft)
					} else {
						without = append(without, ttft)
					}
				}
			}
			w, wo := median(with), median(without)
			report(b, fmt.Sprintf("%s (%s, +%v cold start, cloud +%v): TTFT median with speculation %v, without %v, ratio %.3f",
				c.name, c.model, c.coldStart, DefaultCloudLatency, w.Round(time.Millisecond), wo.Round(time.Millisecond), w.Seconds()/wo.Seconds()))
			b.ReportMetric(float64(w.Milliseconds()), "ttft-spec-ms")
			b.ReportMetric(float64(wo.Milliseconds()), "ttft-nospec-ms")
			b.ReportMetric(w.Seconds()/wo.Seconds(), "ratio")
		})
	}
}

// coldTTFT starts a one-node testnet with a cloud and returns the time to the first token of
// one streaming request for model, speculative or not.
func coldTTFT(b *testing.B, model string, coldStart time.Duration, speculative bool) time.Duration {
	tn, err := New(Options{Nodes: 1, NoConsole: true, Cloud: true, ColdStart: coldStart,
		ModelsFor: func(int) []string { return []string{model} }})
	if err != nil {
		b.Fatal(err)
	}
	defer tn.Close()
	prefs := map[string]string{"privacy": "mesh", "priority": "latency"}
	if speculative {
		prefs["privacy"] = "any"
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+tn.Node(0).APIAddr()+"/v1/chat/completions",
		strings.NewReader(routedBody(model, 8, 1, prefs)))
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"content":"`) && !strings.Contains(sc.Text(), `"content":""`) {
			ttft := time.Since(start)
			for sc.Scan() { // drain: the request completes before the node closes
			}
			sp := tn.Node(0).Status().Routing.Speculative
			if speculative != (sp.Started == 1) {
				b.Fatalf("speculative %v but counters %+v", speculative, sp)
			}
			return ttft
		}
	}
	b.Fatalf("no token (status %d)", resp.StatusCode)
	return 0
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
