package route

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/reputation"
)

// Input layout of FuzzRouterSelect: a header, then fuzzPeerBytes per peer, at most
// fuzzMaxPeers peers.
const (
	fuzzHeader    = 10 // ε, seed (8 bytes little endian), route mode
	fuzzPeerBytes = 4  // score events, health and load, RTT, performance
	fuzzMaxPeers  = 8
	// selectDraws is the number of draws of the exploration check: the catalogue's 10k.
	selectDraws = 10_000
	// selectSlack bounds how far, in draws, a candidate's count over the evenly spaced draws
	// may be from its exact expectation: one draw of rounding at each end of its slot in
	// either branch, and one for floating-point ties. 5 draws is 0.05 % of selectDraws.
	selectSlack = 5
)

// FuzzRouterSelect is Z9 of docs/reliability.md: a peer set decoded from the input (scores
// reached through real integrity and availability events, cooldowns and residual penalties
// through real timeouts, load, cold copies, round trips, measured speeds, staleness), an
// exploration share ε in [0, 0.5], a seed and a route mode, through Decide with the real
// reputation store. The store itself is the oracle: a peer is excluded when Score < 40,
// cooling when TargetHealth says so, eligible when it is fresh, accepting, has spare
// capacity and is neither. Asserted:
//
//   - every mesh attempt is a peer of the input that may serve (fresh, accepting, spare
//     capacity), none twice, at most MaxMeshAttempts of them;
//   - no attempt is ever an excluded peer;
//   - when an eligible peer exists there is an attempt, and no attempt is cooling;
//   - when none exists, route auto has no attempt and route explicit only cooling peers.
//
// The exploration share is checked on reputation.Select over the same peers' candidates
// (the store's scores and performance, spare capacity from the load): over 10,000 draws
// evenly spaced in [0, 1), each eligible candidate is picked N·(ε/n + (1−ε)·w/W) times
// within 5 draws, and the ⌈εN⌉ draws below ε (the exploration share, ε within 1/N) spread
// over the n eligible candidates within one draw of N·ε/n each. Evenly spaced draws make
// that exact and the same for every input: with a seeded generator a candidate's share
// over 10,000 draws has a standard deviation of up to 0.5 %, and a fuzzer trying seeds
// finds the 4σ tail that breaks ε ± 2 %.
func FuzzRouterSelect(f *testing.F) {
	ids := make([]peer.ID, fuzzMaxPeers)
	keys := make([]string, fuzzMaxPeers)
	for i := range ids {
		ids[i] = newPeer(f)
		keys[i] = ids[i].String()
	}
	peerBytes := func(ps ...[fuzzPeerBytes]byte) []byte {
		var b []byte
		for _, p := range ps {
			b = append(b, p[:]...)
		}
		return b
	}
	header := func(eps byte, seed uint64, auto bool) []byte {
		h := []byte{eps}
		h = binary.LittleEndian.AppendUint64(h, seed)
		if auto {
			return append(h, 1)
		}
		return append(h, 0)
	}
	// Clean peers, one excluded (a failed verification), one cooling, one penalized.
	f.Add(append(header(13, 1, false), peerBytes([4]byte{0x20, 0, 10, 0}, [4]byte{0x08, 0, 10, 0},
		[4]byte{0x40, 1, 20, 30}, [4]byte{0, 2, 5, 200}, [4]byte{0x11, 0x04, 40, 255})...))
	// The only clean peer is excluded, the others cooling: explicit gets the cooling ones.
	f.Add(append(header(26, 7, false), peerBytes([4]byte{0x08, 0, 0, 0}, [4]byte{0, 1, 0, 0},
		[4]byte{0x30, 3, 0, 0})...))
	// The same under route auto: nothing.
	f.Add(append(header(26, 7, true), peerBytes([4]byte{0x08, 0, 0, 0}, [4]byte{0, 1, 0, 0},
		[4]byte{0x30, 3, 0, 0})...))
	// Probation scores, full and nearly full peers, stale and paused ones, ε = 0.5.
	f.Add(append(header(255, 42, true), peerBytes([4]byte{0x01, 0x0c, 1, 9}, [4]byte{0x02, 0x08, 90, 0},
		[4]byte{0x03, 0x20, 3, 0}, [4]byte{0x04, 0x40, 3, 0}, [4]byte{0xf0, 0x10, 0, 255},
		[4]byte{0, 0, 0, 255})...))
	// ε = 0 and every weight zero (performance 0): Select falls back to uniform.
	f.Add(append(header(0, 3, false), peerBytes([4]byte{0, 0, 0, 255}, [4]byte{0x50, 0, 0, 255})...))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < fuzzHeader {
			return
		}
		eps := float64(data[0]) / 510
		seed := binary.LittleEndian.Uint64(data[1:9])
		auto := data[9]&1 != 0
		data = data[fuzzHeader:]
		n := min(len(data)/fuzzPeerBytes, fuzzMaxPeers)
		rep := newStore(t, func(p *reputation.Params) { p.Exploration = eps })
		peers := make([]Peer, n)
		serving := make([]bool, n) // fresh, accepting, spare capacity: Decide may consider it
		for i := range n {
			b := data[i*fuzzPeerBytes : (i+1)*fuzzPeerBytes]
			peers[i], serving[i] = fuzzPeer(rep, ids[i], keys[i], b)
		}

		req := request("m", prefs(inference.PrivacyMesh, inference.PriorityBalanced, inference.RouteExplicit))
		if auto {
			req.Prefs.Route = inference.RouteAuto
		}
		dec := Decide(req, &Snapshot{Peers: peers, Rep: rep}, now, rand.New(rand.NewPCG(seed, 1)))

		excluded := make([]bool, n)
		cooling := make([]bool, n)
		anyEligible := false
		for i := range n {
			excluded[i] = rep.Score(keys[i], now) < reputation.ExcludeBelow
			h, ok := rep.TargetHealth(reputation.Target{Model: "m", Peer: keys[i]}, now)
			cooling[i] = ok && h.Cooling
			anyEligible = anyEligible || serving[i] && !excluded[i] && !cooling[i]
		}
		var picked []int
		for _, a := range dec.Attempts {
			i := slices.Index(ids[:n], a.Peer)
			switch {
			case a.Tier != TierMesh || len(a.Stages) > 0 || i < 0:
				t.Fatalf("attempt %v is not one of the %d peers", a, n)
			case !serving[i]:
				t.Fatalf("attempt %d: peer %d is stale, paused or full", len(picked), i)
			case slices.Contains(picked, i):
				t.Fatalf("peer %d attempted twice: %v", i, dec.Attempts)
			case excluded[i]:
				t.Fatalf("attempt %d: peer %d is excluded (score %.1f)", len(picked), i, rep.Score(keys[i], now))
			case cooling[i] && anyEligible:
				t.Fatalf("attempt %d: peer %d is cooling while an eligible peer exists", len(picked), i)
			case cooling[i] && auto:
				t.Fatalf("attempt %d: peer %d is cooling under route auto", len(picked), i)
			}
			picked = append(picked, i)
		}
		if len(picked) > DefaultMaxMeshAttempts {
			t.Fatalf("%d attempts, more than %d", len(picked), DefaultMaxMeshAttempts)
		}
		if anyEligible && len(picked) == 0 {
			t.Fatalf("an eligible peer exists and Decide tried none (%+v)", dec.Estimates)
		}

		cands := rep.Candidates(keys[:n], now, nil)
		for i := range cands {
			cands[i].Spare = 0 // not eligible
			if serving[i] {
				cands[i].Spare = spareCapacity(peers[i].Entry.Vector.Load)
			}
			if data[i*fuzzPeerBytes+3] == 255 {
				cands[i].Performance = 0 // no weighted share: exploration only
			}
		}
		checkSelectShares(t, cands, rep.Params())
	})
}

// fuzzPeer decodes one peer of FuzzRouterSelect's input from b (fuzzPeerBytes), records its
// history in rep as of now, and reports whether Decide may consider it at all (fresh,
// accepting, with spare capacity).
//
//	b[0]  score: bits 0-2 malformed frames (−10 each), bit 3 a failed verification (−70),
//	      bits 4-7 twice that many passed verifications (+1.5 each)
//	b[1]  bits 0-1 health: clean, cooling (a timeout 0.5 s ago), penalized (a timeout a
//	      minute ago), cooling twice (two timeouts); bits 2-3 load: spare unknown, 2/4, 3/4,
//	      4/4 busy; bit 4 cold copy; bit 5 stale; bit 6 not accepting
//	b[2]  round trip, 2 ms a unit (0: unknown)
//	b[3]  measured speed: time to first token 4 ms a unit and 256 − b[3] tokens/s (0: none;
//	      255 also zeroes the performance of its candidate in the Select check)
func fuzzPeer(rep *reputation.Store, id peer.ID, key string, b []byte) (Peer, bool) {
	past := now.Add(-time.Hour)
	for range b[0] & 7 {
		rep.Observe(key, reputation.MalformedFrame, past)
	}
	if b[0]&8 != 0 {
		rep.Observe(key, reputation.VerificationFailed, past)
	}
	for range 2 * (b[0] >> 4) {
		rep.Observe(key, reputation.VerificationPassed, now.Add(-time.Minute))
	}
	target := reputation.Target{Model: "m", Peer: key}
	switch b[1] & 3 {
	case 1:
		rep.Record(target, reputation.Timeout, now.Add(-500*time.Millisecond))
	case 2:
		rep.Record(target, reputation.Timeout, now.Add(-time.Minute))
	case 3:
		rep.Record(target, reputation.Timeout, now.Add(-3*time.Second))
		rep.Record(target, reputation.Unavailable, now.Add(-time.Second))
	}
	if b[3] != 0 {
		rep.RecordPerformance(key, time.Duration(b[3])*4*time.Millisecond, float64(256-int(b[3])), now.Add(-time.Second))
	}
	m := warm("m")
	if b[1]&0x10 != 0 {
		m = cold("m")
	}
	p := Peer{Entry: entry(id, m), RTT: time.Duration(b[2]) * 2 * time.Millisecond}
	if busy := int(b[1]>>2) & 3; busy > 0 {
		p = load(p, busy+1, 4)
	}
	p.Entry.Stale = b[1]&0x20 != 0
	p.Entry.Vector.Load.Accepting = b[1]&0x40 == 0
	return p, !p.Entry.Stale && p.Entry.Vector.Load.Accepting && spareCapacity(p.Entry.Vector.Load) > 0
}

// gridSource is a rand.Source whose Float64s are (k + ½)/n for k = 0, 1, ..., n−1: n draws
// evenly spaced in [0, 1), so that counts over them are exact expectations, not samples.
type gridSource struct{ k, n uint64 }

func (g *gridSource) Uint64() uint64 {
	u := g.at(g.k)
	g.k++
	return u
}

// at is the k-th draw as rand.Rand.Float64 reads it: the low 53 bits over 2^53.
func (g *gridSource) at(k uint64) uint64 {
	return uint64((float64(k) + 0.5) / float64(g.n) * (1 << 53))
}

// checkSelectShares draws Select selectDraws times over cands on evenly spaced draws and
// checks each eligible candidate's count against ε/n + (1−ε)·w/W (1/n each when W is 0),
// and that the draws below ε, the exploration share, spread evenly over the eligible ones.
func checkSelectShares(t *testing.T, cands []reputation.Candidate, p reputation.Params) {
	t.Helper()
	eps := p.Exploration
	var eligible []int
	var total float64
	for i, c := range cands {
		if c.Score >= reputation.ExcludeBelow && c.Spare > 0 {
			eligible = append(eligible, i)
			total += weight(c)
		}
	}
	g := &gridSource{n: selectDraws}
	rng := rand.New(g)
	counts := make([]int, len(cands))
	explored := make([]int, len(cands))
	exploring := 0
	for k := range selectDraws {
		u := float64(g.at(uint64(k))) / (1 << 53)
		i, ok := reputation.Select(cands, p, rng)
		if ok != (len(eligible) > 0) {
			t.Fatalf("Select ok = %v with %d eligible candidates", ok, len(eligible))
		}
		if !ok {
			return
		}
		if !slices.Contains(eligible, i) {
			t.Fatalf("Select picked candidate %d (%+v), not eligible", i, cands[i])
		}
		counts[i]++
		if u < eps {
			explored[i]++
			exploring++
		}
	}
	n := float64(len(eligible))
	if want := math.Ceil(eps*selectDraws - 0.5); math.Abs(float64(exploring)-want) > 1 {
		t.Fatalf("%d exploring draws of %d, want %.0f (ε = %.4f)", exploring, selectDraws, want, eps)
	}
	for _, i := range eligible {
		share := 1 / n
		if total > 0 {
			share = eps/n + (1-eps)*weight(cands[i])/total
		}
		if want := share * selectDraws; math.Abs(float64(counts[i])-want) > selectSlack {
			t.Errorf("candidate %d (%+v) picked %d times of %d, want %.1f ± %d (ε = %.4f, %d eligible)",
				i, cands[i], counts[i], selectDraws, want, selectSlack, eps, len(eligible))
		}
		if want := float64(exploring) / n; math.Abs(float64(explored[i])-want) > 1 {
			t.Errorf("candidate %d explored %d times of %d exploring draws, want %.1f ± 1", i, explored[i], exploring, want)
		}
	}
}
