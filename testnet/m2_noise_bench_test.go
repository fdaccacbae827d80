package testnet

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/transport/infer"
)

// BenchmarkPrefillNoise measures the floor under M2's long cases: the same work on M2's
// replacement B and on its cloud C (a synth server behind the WAN link), alternately, six
// times each: a 3,400-token prompt of synth-small to its first token, as a replay and a
// cloud restart of a long session both mostly are. Metrics: "b-spread" and "cloud-spread",
// each one's slowest run ÷ its quickest; "cloud-to-b", the cloud's median ÷ B's. Where a
// replay and a cloud restart differ by the WAN round trip and a few tokens (well under 1 %
// of such a prefill) while each run's spread is tens of per cent, which of the two measures
// fastest is chance however the gate decides (docs/benchmarks.md, M2).
func BenchmarkPrefillNoise(b *testing.B) {
	hh, hb, hc := m2Host(b, 0), m2Host(b, 2), m2Host(b, 3)
	m2Serve(b, "synth-small", hh, hc, hb)
	c := infer.NewClient(hh, infer.WithTimeouts(5*time.Minute, time.Minute))
	ttft := func(h host.Host) time.Duration {
		start := time.Now()
		var first time.Duration
		_, err := c.Generate(context.Background(), h.ID(), m2Request(m2Words(3400), 4), func(inference.Token) error {
			if first == 0 {
				first = time.Since(start)
			}
			return nil
		})
		if err != nil || first == 0 {
			b.Fatalf("prefill on %s: %v", h.ID(), err)
		}
		return first
	}
	var onB, onC []time.Duration
	for b.Loop() {
		onB, onC = nil, nil
		for range 6 {
			onB = append(onB, ttft(hb))
			onC = append(onC, ttft(hc))
		}
	}
	b.Logf("B %v", onB)
	b.Logf("cloud %v", onC)
	spread := func(ts []time.Duration) float64 { return float64(slices.Max(ts)) / float64(slices.Min(ts)) }
	b.ReportMetric(spread(onB), "b-spread")
	b.ReportMetric(spread(onC), "cloud-spread")
	b.ReportMetric(float64(m2Median(onC))/float64(m2Median(onB)), "cloud-to-b")
}
