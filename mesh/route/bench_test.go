package route

import (
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/reputation"
)

// decisionBudget is the goal for one decision over 1,000 peers (50 µs on 2 cores): routing
// must stay far below a request's network cost.
const decisionBudget = 50 * time.Microsecond

// BenchmarkDecide measures one explicit decision for a model that 1,000 peers serve, with
// local and cloud tiers eligible too, against a reputation store holding the history the
// reputation package's own benchmark uses (so the two compare): five successes and
// performance samples per peer, random missed heartbeats, one peer in ten penalized by a
// failure whose cooldown is over (Rank moves it back), one in twenty cooling, one in a
// hundred excluded. Decisions are 1 ms apart, so scores age once per DecayInterval as under
// load.
//
// "rank+select" is the reference measured first in the same run: the reputation part of
// the decision alone (Rank and Select over the same 1,000 keys, buffers reused), a floor
// that drifts with the machine as Decide does; x-rank is Decide's ratio to it.
// "cached-keys" is the intended use (Peer.Key filled in by the caller); "encoded-keys"
// leaves Key empty to show what encoding 1,000 peer IDs per decision costs.
func BenchmarkDecide(b *testing.B) {
	var ref float64 // ns per rank+select
	b.Run("rank+select", func(b *testing.B) {
		s := benchSnapshot(b, true)
		keys := make([]string, len(s.Peers))
		for i := range s.Peers {
			keys[i] = s.Peers[i].Key
		}
		p := s.Rep.Params()
		rng := seeded(1)
		order := make([]string, 0, len(keys))
		cands := make([]reputation.Candidate, 0, len(keys))
		at := now.Add(time.Minute)
		b.ReportAllocs()
		for b.Loop() {
			at = at.Add(time.Millisecond)
			order, cands = s.Rep.Rank("m", keys, reputation.Explicit, at, order[:0], cands[:0])
			if _, ok := reputation.Select(cands, p, rng); !ok {
				b.Fatal("no candidate selected")
			}
		}
		ref = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	for _, bc := range []struct {
		name   string
		cached bool
	}{{"cached-keys", true}, {"encoded-keys", false}} {
		b.Run(bc.name, func(b *testing.B) {
			s := benchSnapshot(b, bc.cached)
			s.Scratch = new(Scratch)
			req := request("m", prefs(inference.PrivacyAny, inference.PriorityBalanced, inference.RouteExplicit))
			rng := seeded(1)
			at := now.Add(time.Minute)
			b.ReportAllocs()
			for b.Loop() {
				at = at.Add(time.Millisecond)
				if d := Decide(req, s, at, rng); len(d.Attempts) != 5 {
					b.Fatalf("%d attempts, want local, 3 peers and cloud", len(d.Attempts))
				}
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(ns/float64(decisionBudget.Nanoseconds()), "x-budget")
			if ref > 0 {
				b.ReportMetric(ns/ref, "x-rank")
			}
		})
	}
}

func benchSnapshot(b *testing.B, cachedKeys bool) *Snapshot {
	b.Helper()
	rep := newStore(b)
	rng := seeded(99)
	s := &Snapshot{
		Local: Local{Accepting: true, Models: []LocalModel{lw("m")}},
		Cloud: Cloud{Enabled: true, USDPerMTok: 1},
		Rep:   rep,
	}
	for i := range 1000 {
		id := newPeer(b)
		key := id.String()
		models := warm("m")
		if i%4 == 0 {
			models = cold("m")
		}
		p := Peer{Entry: entry(id, warm("other"), models), RTT: time.Duration(5+rng.IntN(100)) * time.Millisecond}
		p.Entry.Vector.Load.Capacity = 8
		p.Entry.Vector.Load.InFlight = rng.IntN(8)
		if cachedKeys {
			p.Key = key
		}
		s.Peers = append(s.Peers, p)

		// The reputation package's benchmark history: five successes and performance
		// samples each, plus random missed heartbeats so scores spread out.
		target := reputation.Target{Model: "m", Peer: key}
		lat := time.Duration(20+rng.IntN(400)) * time.Millisecond
		for range 5 {
			rep.RecordPerformance(key, lat, 10+90*rng.Float64(), now)
			rep.Record(target, reputation.Success, now)
		}
		for range rng.IntN(4) {
			rep.Observe(key, reputation.HeartbeatMissed, now)
		}
		switch {
		case i%100 == 0:
			rep.Observe(key, reputation.VerificationFailed, now) // excluded
		case i%20 == 0:
			rep.Record(target, reputation.Timeout, now.Add(59*time.Second)) // cooling at now+1m
		case i%10 == 0:
			rep.Record(target, reputation.Timeout, now) // penalized, cooldown over
		}
	}
	// The caller's snapshot comes from registry.Entries, which copies every vector in one
	// sweep: lay them out the same way rather than scattered among the store's records.
	for i := range s.Peers {
		s.Peers[i].Entry.Vector = s.Peers[i].Entry.Vector.Clone()
	}
	return s
}
