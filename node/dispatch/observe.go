package dispatch

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/route"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/reputation"
)

// routingStats are the counters under /api/status "routing".
type routingStats struct {
	local, mesh, cloud, none             atomic.Uint64
	specStarted, specCancelled, specKept atomic.Uint64
	failovers, resumptions, probeReruns  atomic.Uint64
	resumeMismatches, receiptsRefused    atomic.Uint64
	fullRefusals, direct                 atomic.Uint64
	rtcDispatched, rtcFallbacks          atomic.Uint64
}

// count counts a request that ended on tier.
func (s *routingStats) count(tier inference.Tier) {
	switch tier {
	case inference.TierLocal:
		s.local.Add(1)
	case inference.TierMesh:
		s.mesh.Add(1)
	case inference.TierCloud:
		s.cloud.Add(1)
	}
}

// outcomeOf is what one attempt's error says about its target, and whether it says
// anything: invalid_request and the like do not. clientGone means the attempt ended on the
// client's side: it stopped reading, hung up, or the request's own time limit passed (its
// context's deadline, Prefs.Timeout), none of which is the target's doing.
func outcomeOf(err error, clientGone bool) (reputation.Outcome, bool) {
	switch code := inference.CodeOf(err); {
	case err == nil:
		return reputation.Success, true
	case isMoved(err):
		return 0, false // the peer left with notice and offered its cache: nothing to hold against it
	case clientGone || errors.Is(err, context.Canceled):
		return reputation.ClientDisconnected, true
	case code == inference.CodeTimeout:
		return reputation.Timeout, true
	case code == inference.CodeUnavailable, code == inference.CodePeerLost, code == inference.CodeModelNotFound:
		return reputation.Unavailable, true
	case code == inference.CodeContextOverflow:
		return reputation.ContextOverflow, true
	case code == inference.CodeOverloaded, code == inference.CodePolicyPaused, code == inference.CodeShuttingDown:
		return reputation.Rejected, true
	}
	return 0, false
}

// observe turns one attempt's outcome into reputation events and measurements, and reports
// a degraded route (Config.Degraded).
func (d *Executor) observe(t route.Target, model string, cold bool, err error, clientGone bool, m *timing) {
	now := d.now()
	o, record := outcomeOf(err, clientGone)
	if record {
		d.cfg.Rep.Record(reputation.Target{Model: model, Peer: t.RepKey()}, o, now)
	}
	if err != nil && record && (o == reputation.Timeout || (t.Tier == inference.TierCloud && o == reputation.Unavailable)) {
		d.stats.probeReruns.Add(1)
		d.cfg.Degraded()
	}
	if err != nil || m.tokens == 0 {
		return
	}
	s := m.sample()
	ttft := s.first
	var tps float64 // for routing and reputation: one rate
	if s.step > 0 {
		tps = 1 / s.step.Seconds()
	}
	if m.served > 0 && !m.tookOver {
		d.noteTokens(model, m.estimate, m.served)
	}
	switch t.Tier {
	case inference.TierMesh:
		d.cfg.Rep.RecordPerformance(t.RepKey(), ttft, tps, now)
		switch {
		case len(t.Stages) == 0:
			s.first -= d.cfg.Latency(t.Peer)
			d.notePeerRates(t.RepKey(), model, s)
		case !m.restaged.Load(): // else the attempt ended on another chain
			if id, err := peer.Decode(t.Stages[0].Peer); err == nil {
				s.first -= d.cfg.Latency(id)
			}
			d.notePipelineRates(t.String(), model, s)
		}
	case inference.TierLocal:
		d.mu.Lock()
		if tps > 0 {
			d.localTPS[model] = ewma(d.localTPS[model], tps)
		}
		if cold {
			s.prefilled = 0 // its first token came after the load too
		}
		d.noteLocalRates(model, s)
		d.mu.Unlock()
		if cold {
			d.noteColdStart(model, ttft)
		}
	case inference.TierCloud:
		d.mu.Lock()
		d.cloudTTFT = time.Duration(ewma(float64(d.cloudTTFT), float64(ttft)))
		d.cloud.add(s, 1) // its round trip is the prefill fit's constant
		if tps > 0 {
			d.cloudTPS = ewma(d.cloudTPS, tps)
		}
		d.mu.Unlock()
	}
}

func (d *Executor) noteColdStart(model string, took time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.localCold[model] = time.Duration(ewma(float64(d.localCold[model]), float64(took)))
}

// ewma folds x into avg (0 = no sample yet) with weight 1/4.
func ewma(avg, x float64) float64 {
	if avg == 0 {
		return x
	}
	return avg + (x-avg)/4
}

// Routing is the "routing" object of /api/status, verification included.
func (d *Executor) Routing() console.Routing {
	s := &d.stats
	return console.Routing{
		Requests: console.TierCounts{
			Local: s.local.Load(), Mesh: s.mesh.Load(), Cloud: s.cloud.Load(), NoTarget: s.none.Load(),
		},
		Speculative: console.Speculative{
			Started: s.specStarted.Load(), Cancelled: s.specCancelled.Load(), Kept: s.specKept.Load(),
		},
		Failovers:        s.failovers.Load(),
		Resumptions:      s.resumptions.Load(),
		ResumeMismatches: s.resumeMismatches.Load(),
		ProbeReruns:      s.probeReruns.Load(),
		ReceiptsRefused:  s.receiptsRefused.Load(),
		BusyRefusals:     s.fullRefusals.Load(),
		Direct:           s.direct.Load(),
		Verification:     d.verificationStatus(),
	}
}

// WebRTCCounts are the requests sent over a data channel, and those that fell back to a
// libp2p stream ("webrtc" of /api/status).
func (d *Executor) WebRTCCounts() (dispatched, fallbacks uint64) {
	return d.stats.rtcDispatched.Load(), d.stats.rtcFallbacks.Load()
}
