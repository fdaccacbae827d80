package testnet

import (
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshinfer/meshinfer/reputation"
)

// TestSlowPeerF3 is docs/reliability.md F3 on real nodes, short: node 0 routes (it serves
// nothing) to three peers serving synth-tiny, one of them (node 3) behind a latency toxic
// of 150 ms each way on all its links. The router measures each peer's time to first token
// and mesh/route's latency rule moves the traffic off the slow one:
//
//   - after the first 20 requests, the slow peer serves at most ε + 2 % (7 %) of the next
//     100, give or take the draw: the test allows 9 (measured 0-5 in runs so far; with the
//     2.5 % expected, 10 or more is a chance of 3e-4). Without the latency rule this node's
//     runs gave 9 %, so this bound alone does not tell the rule apart; mesh/route's
//     TestSlowPeerShare and TestSlowPeerF3Virtual do;
//   - its score stays ≥ 40 (it never times out here: the first-token timeout is 30 s);
//   - once the toxic is removed it regains a share: it serves at least 5 of 20 requests in a
//     row within 500 requests. Requests follow each other without pause, so time hardly
//     passes and what brings it back is exploration (ε/3 of the requests), each of which
//     measures it quick again; on production time its old measurements also fade (2 min
//     half-life), which TestSlowPeerF3Virtual (mesh/route) plays on virtual time.
//
// The figures go to a "figure F3:" log line.
func TestSlowPeerF3(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const (
		delay           = 150 * time.Millisecond
		slowIdx         = 3
		warmup, counted = 20, 100
		window, regain  = 20, 5 // regained: 5 of the last 20 served
		maxAfter        = 500
	)
	tn, err := New(Options{Nodes: 4, Links: true, NoConsole: true, Heartbeat: time.Second, ModelsFor: serveNothing,
		LinkFaults: func(i, j int) LinkFaults {
			if i == slowIdx || j == slowIdx {
				return LinkFaults{Delay: delay}
			}
			return LinkFaults{}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer tn.Close()
	within(t, 20*time.Second, "4 nodes converge", tn.Converged)
	router := tn.Node(0)
	slowRoute := "peer:" + tn.Node(slowIdx).ID().String()
	rtt := router.Host().Peerstore().LatencyEWMA
	within(t, 10*time.Second, "RTTs measured", func() bool {
		return rtt(tn.Node(1).ID()) > 0 && rtt(tn.Node(2).ID()) > 0 && rtt(tn.Node(slowIdx).ID()) > 0
	})

	send := func(k int) streamResult {
		r := stream(t, router.APIAddr(), routedBody("synth-tiny", 2, int64(k), nil), nil, nil)
		if r.errCode != "" || !r.done {
			t.Fatalf("request %d: %+v", k, r)
		}
		return r
	}
	slowScore := func() float64 {
		for _, p := range router.Peers() {
			if "peer:"+p.PeerID == slowRoute {
				return p.Score
			}
		}
		t.Fatal("the slow peer is not in the router's registry")
		return 0
	}

	slowServed, minScore := 0, 100.0
	var took, quick []time.Duration
	for k := range warmup + counted {
		r := send(k)
		took = append(took, r.duration)
		if r.final.Route != slowRoute {
			quick = append(quick, r.duration)
		}
		if k >= warmup && r.final.Route == slowRoute {
			slowServed++
		}
		minScore = min(minScore, slowScore())
	}
	share := float64(slowServed) / counted
	if slowServed > 9 {
		t.Errorf("the slow peer served %d of requests %d-%d, want at most about 7 %%", slowServed, warmup+1, warmup+counted)
	}
	if minScore < reputation.ExcludeBelow {
		t.Errorf("the slow peer's score fell to %.1f", minScore)
	}

	if err := tn.LinksOf(slowIdx).Clear(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	var last []bool // served by the once slow peer, the last window requests
	after := 0
	for after < maxAfter {
		r := send(warmup + counted + after)
		after++
		last = append(last, r.final.Route == slowRoute)
		if len(last) > window {
			last = last[1:]
		}
		if len(last) == window && countTrue(last) >= regain {
			break
		}
	}
	regained := countTrue(last) >= regain
	t.Logf("figure F3: slow peer (%v each way) served %.1f %% of requests %d-%d (goal ≤ 7 %%), lowest score %.1f (goal ≥ 40), "+
		"p99 end to end %v (quick peers' p50 %v), after the toxic went: %d of %d requests to the once slow peer after %d requests (%v)",
		delay, 100*share, warmup+1, warmup+counted, minScore, durationQuantile(took, 0.99), durationQuantile(quick, 0.5),
		countTrue(last), window, after, time.Since(healed).Round(time.Millisecond))
	if !regained {
		t.Errorf("the once slow peer served %d of the last %d requests after %d requests without the toxic, want ≥ %d",
			countTrue(last), window, after, regain)
	}
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// durationQuantile returns the q-quantile of ds (nearest rank); 0 for none.
func durationQuantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(max(int(q*float64(len(s))+0.999999)-1, 0), len(s)-1)]
}
