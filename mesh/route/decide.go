package route

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/reputation"
)

// maxEstimate bounds every estimated duration (24 h): no request waits that long, and the
// bound keeps sums of estimates from overflowing when a measured speed is absurdly low.
const maxEstimate = 24 * time.Hour

// tiers lists the tiers in the order that wins ties; it indexes Decision.Estimates and a
// plan's estimates.
func tiers() [3]Tier { return [3]Tier{TierLocal, TierMesh, TierCloud} }

// Decide returns the model to run and the targets to try for req, as of now, following
// the rules in the package documentation. req and s must not be nil. Decide reads s and
// writes only s.Scratch; it reads the reputation store through RankIndices, Performance and
// Params (RankIndices also counts the orderings it makes, for the store's Stats). rng is its
// only randomness and must not be nil: reputation.Select would fall back to the
// process-wide source and the decision would not be reproducible.
func Decide(req *inference.Request, s *Snapshot, now time.Time, rng *rand.Rand) Decision {
	d := decider{
		s:      s,
		now:    now,
		rng:    rng,
		prefs:  req.Prefs.Or(inference.DefaultPrefs()),
		tune:   s.Tune.withDefaults(),
		n:      max(req.EffectiveMaxTokens(), 0),
		params: reputation.DefaultParams(),
		mode:   reputation.Explicit,
		sc:     s.Scratch,
	}
	if d.sc == nil {
		d.sc = new(Scratch)
	}
	d.prompt = PromptTokens(req)
	d.positions = req.PromptTokensBound() + max(d.n, 1)
	if s.Rep != nil {
		d.params = s.Rep.Params()
	}
	// An unknown privacy (Prefs not validated) allows the local tier only.
	d.allowMesh = d.prefs.Privacy == inference.PrivacyMesh || d.prefs.Privacy == inference.PrivacyAny
	d.allowCloud = d.prefs.Privacy == inference.PrivacyAny
	auto := d.prefs.Route == inference.RouteAuto
	if auto {
		d.mode = reputation.Auto
	}

	named := !auto || req.Model != "" && req.Model != inference.AutoModel
	var asked plan
	if named {
		asked = d.plan(req.Model)
		if !auto || asked.ok() {
			return asked.decision(&d)
		}
	}
	var best plan
	for _, m := range d.knownModels() {
		if named && m == req.Model {
			continue // decided above: nobody can serve it
		}
		// Names come sorted, and only a strictly better score replaces the best: ties go
		// by name.
		if p := d.plan(m); p.ok() && (!best.ok() || p.score < best.score) {
			best = p
		}
	}
	switch {
	case best.ok():
		return best.decision(&d)
	case named:
		return asked.decision(&d)
	}
	dec := Decision{Model: req.Model, Estimates: make([]Estimate, 3)}
	for i, t := range tiers() {
		dec.Estimates[i] = Estimate{Tier: t, Why: d.denied(t)}
		if dec.Estimates[i].Why == "" {
			dec.Estimates[i].Why = "no model available"
		}
	}
	return dec
}

// PromptTokens estimates req's prompt tokens as Decide does, from its messages' content:
// about four bytes a token in English text.
func PromptTokens(req *inference.Request) int {
	n := 0
	for _, m := range req.Messages {
		n += len(m.Content)
	}
	return n / 4
}

// PeerTokensPerSec is the decode rate Decide estimates for the peer whose reputation key is
// key, as of now: the default rate (Tuning.DefaultTokensPerSec) scaled by the peer's
// performance in s.Rep (1 without a store; ColdFactor not applied), the factor held within
// [0.25, 4].
func (s *Snapshot) PeerTokensPerSec(key string, now time.Time) float64 {
	perf := 1.0
	if s.Rep != nil {
		perf = s.Rep.Performance(key, now)
	}
	return s.Tune.withDefaults().DefaultTokensPerSec * min(max(perf, 0.25), 4)
}

// decider carries one decision's inputs.
type decider struct {
	s      *Snapshot
	now    time.Time
	rng    *rand.Rand
	prefs  inference.Prefs
	tune   Tuning
	n      int // completion tokens
	prompt int // prompt tokens, estimated
	// positions bounds the request's prompt and completion, as a pipeline's stages are
	// sized for it (the executor opens them with the same bound).
	positions int
	params    reputation.Params
	mode      reputation.RouteMode
	sc        *Scratch // never nil

	allowMesh, allowCloud bool
}

// denied is the privacy reason why tier t may not serve, or "".
func (d *decider) denied(t Tier) string {
	if t == TierMesh && !d.allowMesh || t == TierCloud && !d.allowCloud {
		return "privacy " + string(d.prefs.Privacy)
	}
	return ""
}

// plan is the decision for one model.
type plan struct {
	model     string
	est       [3]Estimate // indexed like tiers()
	local     bool        // the local target survived
	localCold bool
	mesh      []Target // clean peers, then penalized ones; in each, Select's pick, then by weight
	penalized bool     // mesh put a penalized peer behind a clean one
	cloud     bool
	order     []int   // indices into tiers() of the tiers that can serve, best first
	score     float64 // the best tier's score under the priority
}

func (p *plan) ok() bool { return len(p.order) > 0 }

// plan decides model: eligibility, cooling, mesh order, estimates, tier order.
func (d *decider) plan(model string) plan {
	s := d.s
	p := plan{model: model}
	for i, t := range tiers() {
		p.est[i] = Estimate{Tier: t, Why: d.denied(t)}
	}

	// Eligible targets. keys holds the peers first (keys[k] is peers[k]'s), then local,
	// then the cloud: Rank applies cooling across all of them at once.
	var lm LocalModel
	localOK := false
	if !s.Local.Accepting {
		p.est[0].Why = "local not accepting"
	} else if i := slices.IndexFunc(s.Local.Models, func(m LocalModel) bool { return m.Name == model }); i < 0 {
		p.est[0].Why = "local does not serve " + model
	} else {
		lm, localOK = s.Local.Models[i], true
	}
	var peers []meshPeer
	var keys []string
	if d.allowMesh {
		peers, keys = d.eligiblePeers(model)
		if len(peers) == 0 {
			p.est[1].Why = "no peer serves " + model
		}
	}
	cloudOK := false
	if d.allowCloud {
		switch {
		case !s.Cloud.Enabled:
			p.est[2].Why = "cloud not configured"
		case len(s.Cloud.Models) > 0 && !slices.Contains(s.Cloud.Models, model):
			p.est[2].Why = "cloud does not serve " + model
		default:
			cloudOK = true
		}
	}
	localAt, cloudAt := -1, -1
	if localOK {
		localAt = len(keys)
		keys = append(keys, reputation.LocalTarget)
	}
	if cloudOK {
		cloudAt = len(keys)
		keys = append(keys, CloudTarget)
	}

	// Cooling and scores, then what survived in each tier.
	pos, cands := d.survivors(model, keys, len(peers))
	mc, mi := cands[:0], pos[:0] // the surviving peers' candidates and keys, filtered in place
	excluded := 0
	for j, k := range pos {
		c := cands[j]
		switch {
		case k == localAt:
			p.local = true
		case k == cloudAt:
			p.cloud = true
		case !(c.Score >= reputation.ExcludeBelow):
			excluded++
		default:
			c.Spare = peers[k].spare
			if peers[k].cold {
				c.Performance *= d.tune.ColdFactor
			}
			mc = append(mc, c)
			mi = append(mi, k)
		}
	}
	d.weighLatency(mc, mi, peers)
	if localOK && !p.local {
		p.est[0].Why = "local " + model + " cooling"
	}
	if cloudOK && !p.cloud {
		p.est[2].Why = "cloud " + model + " cooling"
	}
	if len(peers) > 0 && len(mc) == 0 {
		p.est[1].Why = "peers serving " + model + " cooling"
		if excluded == len(peers) {
			p.est[1].Why = "peers serving " + model + " excluded"
		}
	}

	// Estimates.
	if p.local {
		p.localCold = !lm.Warm
		tps := lm.TokensPerSec
		if !(tps > 0) {
			tps = d.tune.DefaultTokensPerSec
		}
		ttft := seconds(1 / tps)
		if p.localCold {
			cs := lm.ColdStart
			if cs <= 0 {
				cs = d.tune.DefaultColdStart
			}
			ttft += min(cs, maxEstimate)
		}
		d.estimate(&p.est[0], ttft, tps, 0)
	}
	if len(mc) > 0 {
		order, penalized := d.orderMesh(mc, mi, keys, func(k int) bool {
			p := &s.Peers[peers[k].i]
			return p.Unconnected || p.Silent
		})
		p.penalized = penalized
		first := peers[order[0]]
		tps := s.PeerTokensPerSec(keys[order[0]], d.now)
		ttft := min(max(s.Peers[first.i].RTT, 0), maxEstimate) + seconds(1/tps)
		if first.cold {
			ttft += d.tune.DefaultColdStart
		}
		d.estimate(&p.est[1], ttft, tps, s.MeshUSDPerMTok)
		p.mesh = make([]Target, len(order))
		for j, k := range order {
			p.mesh[j] = Target{Tier: TierMesh, Peer: s.Peers[peers[k].i].Entry.Peer, Model: model}
		}
	}
	if d.allowMesh && len(peers) == 0 {
		d.pipeline(&p, model)
	}
	if p.cloud {
		ttft := s.Cloud.TTFT
		if ttft <= 0 {
			ttft = d.tune.DefaultCloudTTFT
		}
		tps := s.Cloud.TokensPerSec
		if !(tps > 0) {
			tps = d.tune.DefaultTokensPerSec
		}
		d.estimate(&p.est[2], min(ttft, maxEstimate), tps, s.Cloud.USDPerMTok)
	}

	// Tier order: by score, ties in tier order (insertion sort of at most three is stable).
	var scores [3]float64
	for i := range p.est {
		if !p.est[i].OK {
			continue
		}
		scores[i] = d.score(p.est[i])
		p.order = append(p.order, i)
		for x := len(p.order) - 1; x > 0 && scores[p.order[x]] < scores[p.order[x-1]]; x-- {
			p.order[x], p.order[x-1] = p.order[x-1], p.order[x]
		}
	}
	if p.ok() {
		p.score = scores[p.order[0]]
	}
	return p
}

// pipeline plans model as a pipeline of layer ranges over the peers that announce it with
// its size but cannot hold it whole (PlanStages, told the ranges each holds warm), and
// makes it the mesh tier's one target.
// A mesh that cannot hold it even together leaves the tier's reason naming the shortfall.
func (d *decider) pipeline(p *plan, model string) {
	shape, cands := stageCandidates(d.s, model, d.now)
	if len(cands) == 0 {
		return
	}
	sp, err := PlanStages(shape, d.positions, cands, nil)
	if err != nil {
		p.est[1].Why = err.Error()
		return
	}
	t := Target{Tier: TierMesh, Model: model, Stages: appendHops(make([]inference.StageHop, 0, len(sp.Stages)), sp)}
	p.mesh = []Target{t}
	perToken := min(max(sp.PerToken, time.Millisecond), maxEstimate)
	d.estimate(&p.est[1], perToken, 1/perToken.Seconds(), d.s.MeshUSDPerMTok)
}

// stageCandidates are the peers of s that may hold a stage of model as of now, with the
// model's shape as the first of them announces it: not stale, with spare capacity,
// announcing the model's layers and a memory budget, and its shape (a peer announcing
// another shape under the name is left out). A peer not accepting work, or cooling for
// the model (a stage that failed lately cools down like any target), is a paused
// candidate: PlanStages leaves it out.
func stageCandidates(s *Snapshot, model string, now time.Time) (inference.ModelShape, []StageCandidate) {
	var shape inference.ModelShape
	var cands []StageCandidate
	for i := range s.Peers {
		sp := &s.Peers[i]
		v := sp.Entry.Vector
		if sp.Entry.Stale || v == nil || !(spareCapacity(v.Load) > 0) {
			continue
		}
		j := slices.IndexFunc(v.Models, func(m caps.Model) bool { return m.Name == model })
		if j < 0 || v.Models[j].Layers == 0 || v.RAM.BudgetMB == 0 {
			continue
		}
		m := &v.Models[j]
		if shape.Layers == 0 {
			shape = inference.ModelShape{Layers: m.Layers, WeightBytes: m.WeightBytes,
				LayerBytes: m.WeightBytes / int64(m.Layers), KVBytesPerToken: m.KVBytesPerToken}
		} else if shape.Layers != m.Layers || shape.WeightBytes != m.WeightBytes {
			continue // another model under the same name
		}
		key := sp.Key
		if key == "" {
			key = sp.Entry.Peer.String()
		}
		score, cooling := reputation.NeutralScore, false
		if s.Rep != nil {
			score = s.Rep.Score(key, now)
			h, ok := s.Rep.TargetHealth(reputation.Target{Model: model, Peer: key}, now)
			cooling = ok && h.Cooling
		}
		cands = append(cands, StageCandidate{Peer: sp.Entry.Peer, Budget: v.RAM.BudgetMB << 20,
			Delay: max(sp.RTT, 0) / 2, Score: score, Paused: !v.Load.Accepting || cooling, Warm: warmRanges(v, model)})
	}
	return shape, cands
}

// warmRanges is the ranges of model v announces warm in its stages; nil when none.
func warmRanges(v *caps.Vector, model string) []LayerRange {
	var out []LayerRange
	for _, st := range v.Stages {
		if st.Model == model && st.State == caps.StageWarm {
			out = append(out, LayerRange{st.Lo, st.Hi})
		}
	}
	return out
}

// meshPeer is an eligible peer as a plan needs it after Rank, so that nothing reads the
// peer's vector twice.
type meshPeer struct {
	i     int // index in Snapshot.Peers
	spare float64
	cold  bool          // the peer's copy of the model is not warm
	rtt   time.Duration // Peer.RTT, 0 = unknown
}

// eligiblePeers returns the peers that may serve model before reputation has its say (not
// stale, accepting, announcing the model, with spare capacity) and their reputation keys,
// with room for two more keys (local and cloud).
func (d *decider) eligiblePeers(model string) ([]meshPeer, []string) {
	var out []meshPeer
	var keys []string
	for i := range d.s.Peers {
		sp := &d.s.Peers[i]
		v := sp.Entry.Vector
		if sp.Entry.Stale || v == nil || !v.Load.Accepting {
			continue
		}
		ok, cold := serves(v, model)
		spare := spareCapacity(v.Load)
		if !ok || !(spare > 0) || !holdsWhole(v, model) {
			continue
		}
		key := sp.Key
		if key == "" {
			key = sp.Entry.Peer.String()
		}
		if out == nil {
			n := len(d.s.Peers) - i
			out, keys = reuse(d.sc.peers, n), reuse(d.sc.keys, n+2)
		}
		out = append(out, meshPeer{i: i, spare: spare, cold: cold, rtt: max(sp.RTT, 0)})
		keys = append(keys, key)
	}
	d.sc.peers, d.sc.keys = out, keys
	return out, keys
}

// serves reports whether v announces model, and whether its copy is cold (not warm).
func serves(v *caps.Vector, model string) (ok, cold bool) {
	for i := range v.Models {
		if v.Models[i].Name == model {
			return true, v.Models[i].State != caps.ModelWarm
		}
	}
	return false, false
}

// holdsWhole reports whether v's memory budget holds model whole: true unless both the
// model's size and the budget are announced and the size is larger. A model no peer holds
// whole is served by a pipeline of layer ranges (PlanStages), not by one peer.
func holdsWhole(v *caps.Vector, model string) bool {
	for i := range v.Models {
		if m := &v.Models[i]; m.Name == model {
			return m.WeightBytes == 0 || v.RAM.BudgetMB == 0 || m.WeightBytes <= v.RAM.BudgetMB<<20
		}
	}
	return false
}

// spareCapacity is 1 − InFlight/Capacity, or 1 when the capacity is not said.
func spareCapacity(l caps.Load) float64 {
	if l.Capacity <= 0 {
		return 1
	}
	return 1 - float64(l.InFlight)/float64(l.Capacity)
}

// survivors ranks keys for model and returns, for each target kept, its index in keys
// and its Candidate (Spare 1). The first nPeers keys are peers; the others (local, cloud)
// have no node score that counts.
//
// Exclusion comes before cooling: if the only targets Rank kept are excluded peers while
// it dropped cooling ones, the excluded peers did not count as targets that remain, so the
// rest are ranked again without them (explicit routing then gets the cooling ones back).
func (d *decider) survivors(model string, keys []string, nPeers int) ([]int, []reputation.Candidate) {
	if d.s.Rep == nil {
		pos, cands := reuse(d.sc.pos, len(keys)), reuse(d.sc.cands, len(keys))
		for i := range keys {
			pos = append(pos, i)
			cands = append(cands, reputation.Candidate{Score: reputation.NeutralScore, Performance: 1, Spare: 1})
		}
		d.sc.pos, d.sc.cands = pos, cands
		return pos, cands
	}
	if len(keys) == 0 {
		return nil, nil
	}
	pos, cands := d.s.Rep.RankIndices(model, keys, d.mode, d.now, reuse(d.sc.pos, len(keys)), reuse(d.sc.cands, len(keys)))
	d.sc.pos, d.sc.cands = pos, cands
	if len(pos) == len(keys) {
		return pos, cands
	}
	var out []int // indices into keys of excluded survivors
	for j, k := range pos {
		if k >= nPeers || cands[j].Score >= reputation.ExcludeBelow {
			return pos, cands // something usable survived
		}
		out = append(out, k)
	}
	if len(out) == 0 {
		return pos, cands
	}
	var rest []string
	var back []int // index in keys of rest[i]
	for k, key := range keys {
		if !slices.Contains(out, k) {
			rest = append(rest, key)
			back = append(back, k)
		}
	}
	pos, cands = d.s.Rep.RankIndices(model, rest, d.mode, d.now, pos[:0], cands[:0])
	for j, k := range pos {
		pos[j] = back[k]
	}
	return pos, cands
}

// orderMesh returns the mesh targets in order, as indices into keys, and whether a
// penalized peer was put behind a clean one. mc are the eligible peers' candidates in
// Rank's order (clean ones first, then penalized ones by penalty) and mi their indices into
// keys; behind(k) says whether peer k is one this node holds no connection to or one that
// is silent (Peer.Unconnected, Peer.Silent). The peers form three classes: clean ones not
// behind, other clean ones, then penalized ones; each class is ordered on its own:
// Select's pick, then by descending weight, ties by peer ID; the whole is cut at
// MaxMeshAttempts. So a peer out of cooldown but still penalized is tried only after every
// clean one, a peer that may have just left (its connection gone, its vector not yet
// stale) or may be frozen only after the other clean peers, and exploration and weights
// act within each class. When every candidate was cooling
// (Rank then returns them all), they keep their given order.
func (d *decider) orderMesh(mc []reputation.Candidate, mi []int, keys []string, behind func(k int) bool) (order []int, penalized bool) {
	limit := min(d.tune.MaxMeshAttempts, len(mc))
	order = make([]int, 0, limit)
	if mc[0].Cooling {
		return append(order, mi[:limit]...), false
	}
	split := slices.IndexFunc(mc, func(c reputation.Candidate) bool { return c.Penalty > 0 })
	if split < 0 {
		split = len(mc)
	}
	// The clean class, connected peers that are not silent first: partitioned in place
	// (mc and mi are this decision's scratch, and the order within a class is set by
	// orderClass).
	conn := 0
	for j := range split {
		if !behind(mi[j]) {
			mc[conn], mc[j] = mc[j], mc[conn]
			mi[conn], mi[j] = mi[j], mi[conn]
			conn++
		}
	}
	// The stale-peer boost may lead with a penalized peer (boost); the rest of the
	// penalized class, from pen on, follows the clean peers as ever.
	pen := split
	if k, ok := d.boost(mc, split); ok {
		mc[pen], mc[k] = mc[k], mc[pen]
		mi[pen], mi[k] = mi[k], mi[pen]
		order = append(order, mi[pen])
		pen++
	}
	order = d.orderClass(order, mc[:conn], mi[:conn], keys, limit)
	order = d.orderClass(order, mc[conn:split], mi[conn:split], keys, limit)
	order = d.orderClass(order, mc[pen:], mi[pen:], keys, limit)
	return order, split > 0 && pen < len(mc)
}

// StaleAfter is how long after its latest failure for a model a penalized peer is explored
// like a clean one (the stale-peer boost, boost): a minute, so a peer that just failed
// stays behind the clean ones for that long, and one that recovered is found within
// minutes, not after its penalty's half-life.
const StaleAfter = time.Minute

// boost is the stale-peer boost: while some penalized peers' latest failure is StaleAfter
// old or more, a share of the decisions as large as exploration's (Params.Exploration,
// 5 %) leads with one of them, drawn uniformly. Otherwise nothing brings a peer that
// recovered back before its penalty decays (about 17 min at the 5 min half-life), since it
// is tried only after every clean peer failed (docs/reliability.md F3); with it, a
// recovered peer earns the successes that clear its penalty within a few minutes at one
// request a second. A peer still failing costs one attempt a StaleAfter at most: its
// failure makes it fresh again. mc[split:] are the penalized candidates; it returns the
// index of the one to lead with. It draws from the random source only when there is such
// a peer.
func (d *decider) boost(mc []reputation.Candidate, split int) (int, bool) {
	if split == 0 {
		return 0, false // no clean peer: the penalized ones lead anyway
	}
	isStale := func(c reputation.Candidate) bool { return d.now.Sub(c.LastFailure) >= StaleAfter }
	stale := 0
	for _, c := range mc[split:] {
		if isStale(c) {
			stale++
		}
	}
	if stale == 0 || d.rng.Float64() >= d.params.Exploration {
		return 0, false
	}
	k := d.rng.IntN(stale)
	for j := split; j < len(mc); j++ {
		if isStale(mc[j]) {
			if k == 0 {
				return j, true
			}
			k--
		}
	}
	return 0, false
}

// orderClass appends to order, up to limit in all, one class of peers: Select's pick, then
// by descending weight, ties by peer ID. One pass keeps the few heaviest in a small sorted
// buffer, so the cost is linear in the number of peers.
func (d *decider) orderClass(order []int, mc []reputation.Candidate, mi []int, keys []string, limit int) []int {
	room := limit - len(order)
	if room <= 0 || len(mc) == 0 {
		return order
	}
	first, _ := reputation.Select(mc, d.params, d.rng) // every candidate is eligible: ok
	order = append(order, mi[first])
	type heavy struct {
		j int
		w float64
	}
	heavier := func(a, b heavy) bool {
		return a.w > b.w || a.w == b.w && keys[mi[a.j]] < keys[mi[b.j]]
	}
	top := make([]heavy, 0, min(room, len(mc))-1)
	for j := range mc {
		if j == first || cap(top) == 0 {
			continue
		}
		h := heavy{j, weight(mc[j])}
		switch {
		case len(top) == cap(top) && h.w < top[len(top)-1].w:
			continue // the common case, decided without the tie rule
		case len(top) < cap(top):
			top = append(top, h)
		case heavier(h, top[len(top)-1]):
			top[len(top)-1] = h
		default:
			continue
		}
		for x := len(top) - 1; x > 0 && heavier(top[x], top[x-1]); x-- {
			top[x], top[x-1] = top[x-1], top[x]
		}
	}
	for _, h := range top {
		order = append(order, mi[h.j])
	}
	return order
}

// weighLatency applies the latency rule (package doc, "Latency") to the eligible peers'
// candidates mc, whose indices into peers are mi: each one's Performance is multiplied by
// ((best + slack) ÷ (estimate + slack))², so the quickest peer keeps its weight and a peer k
// times slower to its first token weighs about 1/k² as much. Three passes, no allocation:
// the quickest measured latency, then each estimate (kept in Latency) and the best of them,
// then the factors.
func (d *decider) weighLatency(mc []reputation.Candidate, mi []int, peers []meshPeer) {
	var quickest time.Duration // the quickest measured latency, 0 = none
	for j := range mc {
		if c := &mc[j]; c.Latency > 0 && c.Confidence > 0 && (quickest == 0 || c.Latency < quickest) {
			quickest = c.Latency
		}
	}
	var best time.Duration // the least estimate, 0 = none
	for j := range mc {
		c := &mc[j]
		c.Latency = latencyEstimate(c.Latency, c.Confidence, peers[mi[j]].rtt, quickest)
		if c.Latency > 0 && (best == 0 || c.Latency < best) {
			best = c.Latency
		}
	}
	if best == 0 {
		return
	}
	slack := float64(d.tune.LatencySlack)
	for j := range mc {
		if c := &mc[j]; c.Latency > best {
			r := (float64(best) + slack) / (float64(c.Latency) + slack)
			c.Performance *= r * r
		}
	}
}

// latencyEstimate is what the latency rule expects of a peer's time to first token, given
// its measured latency lat and the confidence conf in it, its round trip rtt, and the
// quickest latency measured of any eligible peer: a peer measured before is estimated by
// lat blended by confidence into the quickest (so that, as its measurements fade, it comes
// back to par and is tried again); one never measured by its round trip, no less than the
// quickest (a first token takes a round trip at least). 0 means nothing is known.
func latencyEstimate(lat time.Duration, conf float64, rtt, quickest time.Duration) time.Duration {
	quickest = min(quickest, maxEstimate)
	if lat <= 0 {
		if rtt <= 0 {
			return 0
		}
		return min(max(rtt, quickest), maxEstimate)
	}
	if !(conf > 0) { // NaN too
		conf = 0
	}
	conf = min(conf, 1)
	return time.Duration(conf*float64(min(lat, maxEstimate)) + (1-conf)*float64(quickest))
}

// weight is c's share in Select's weighted draw: Weight(score) × performance × spare.
func weight(c reputation.Candidate) float64 {
	if !(c.Performance > 0) {
		return 0
	}
	return reputation.Weight(c.Score) * c.Performance * min(c.Spare, 1)
}

// estimate fills e for a tier that can serve: TTFT as given, Total adding the completion
// at tps, USD at usdPerMTok over prompt and completion.
func (d *decider) estimate(e *Estimate, ttft time.Duration, tps, usdPerMTok float64) {
	if !(usdPerMTok > 0) {
		usdPerMTok = 0
	}
	e.OK, e.Why = true, ""
	e.TTFT = ttft
	e.Total = ttft + seconds(float64(d.n)/tps)
	e.USD = usdPerMTok * float64(d.prompt+d.n) / 1e6
}

// score is an estimate's rank under the request's priority: lower is better. An unknown
// priority (Prefs not validated) counts as balanced.
func (d *decider) score(e Estimate) float64 {
	switch d.prefs.Priority {
	case inference.PriorityCost:
		return e.USD
	case inference.PriorityLatency:
		return e.Total.Seconds()
	}
	return e.Total.Seconds() + e.USD*d.tune.BalancedSecondsPerUSD
}

// seconds converts x seconds to a Duration, at most maxEstimate.
func seconds(x float64) time.Duration {
	if !(x < maxEstimate.Seconds()) {
		return maxEstimate
	}
	return time.Duration(x * float64(time.Second))
}

// knownModels lists, sorted and once each, every model name the allowed tiers know: the
// local backend's, those announced by peers that could serve (before reputation), and the
// cloud's list.
func (d *decider) knownModels() []string {
	var names []string
	if d.s.Local.Accepting {
		for _, m := range d.s.Local.Models {
			names = append(names, m.Name)
		}
	}
	if d.allowMesh {
		for i := range d.s.Peers {
			e := &d.s.Peers[i].Entry
			if e.Stale || e.Vector == nil || !e.Vector.Load.Accepting || !(spareCapacity(e.Vector.Load) > 0) {
				continue
			}
			for _, m := range e.Vector.Models {
				names = append(names, m.Name)
			}
		}
	}
	if d.allowCloud && d.s.Cloud.Enabled {
		names = append(names, d.s.Cloud.Models...)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) > 0 && names[0] == "" {
		names = names[1:]
	}
	return names
}

// decision turns the plan into the router's answer.
func (p *plan) decision(d *decider) Decision {
	dec := Decision{Model: p.model, Estimates: slices.Clone(p.est[:])}
	local := Target{Tier: TierLocal, Model: p.model}
	cloud := Target{Tier: TierCloud, Model: p.model}
	for _, t := range p.order {
		switch tiers()[t] {
		case TierLocal:
			dec.Attempts = append(dec.Attempts, local)
		case TierMesh:
			dec.Attempts = append(dec.Attempts, p.mesh...)
			dec.Penalized = p.penalized
		case TierCloud:
			dec.Attempts = append(dec.Attempts, cloud)
		}
	}
	if d.prefs.Privacy == inference.PrivacyAny && d.prefs.Priority != inference.PriorityCost &&
		p.local && p.localCold && p.cloud {
		dec.Speculative = true
		rest := slices.DeleteFunc(dec.Attempts, func(t Target) bool { return t.Tier != TierMesh })
		dec.Attempts = append([]Target{local, cloud}, rest...)
	}
	return dec
}

// reuse returns buf emptied, or a new slice with capacity n if buf is smaller.
func reuse[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, 0, n)
	}
	return buf[:0]
}
