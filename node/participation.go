package node

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/atomicfile"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/mesh/probe"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/node/dispatch"
)

// partGate applies the participation policy (mesh/participation) to this node: the
// deployer's policy, the owner's consent (re-read whenever its file in the data dir changes,
// so that a withdrawal takes effect at once; given to another wording than the node's, it
// counts as not given), the live conditions the probe reads every heartbeat, the rate limit
// and the traffic cap. It decides whether the node serves peers (admission and the accepting
// flag of its announcement), may run models locally, and may use the cloud.
type partGate struct {
	deployer participation.Policy
	profile  string
	wording  string                 // WordingHash of the node's consent wording
	dir      string                 // where consent.json lives; "" with a fixed consent
	fixed    *participation.Consent // Config.Consent: used instead of the file
	now      func() time.Time
	traffic  *trafficCounter // the mesh traffic of the tasks served for peers

	mu          sync.Mutex
	changed     func() // re-announce (the accepting flag changed); set by onChange
	policy      func() // the effective policy changed; set by onPolicy
	gov         *participation.Governor
	rate        participation.RateLimiter
	consent     participation.Consent
	haveConsent bool
	// otherWording: a consent is recorded, given to another wording than the node's; it
	// counts as not given (haveConsent is false).
	otherWording bool
	consentStat  atomicfile.Stamp         // the consent file as last read
	cond         participation.Conditions // the latest heartbeat's conditions (none yet: sensors silent)
	state        participation.State
}

func newPartGate(cfg Config) (*partGate, error) {
	deployer, err := participation.Deployer(cfg.Profile, cfg.ProfileOverrides)
	if err != nil {
		return nil, err
	}
	profile := cfg.Profile
	if profile == "" {
		profile = cfg.ProfileOverrides.Profile
	}
	if profile == "" {
		profile = participation.DefaultProfile
	}
	wording := cfg.ConsentWording
	if wording == "" {
		wording = participation.ConsentWording
	}
	g := &partGate{
		deployer: deployer, profile: profile, wording: participation.WordingHash(wording),
		dir: cfg.DataDir, fixed: cfg.Consent, now: cfg.Now,
		traffic: &trafficCounter{now: cfg.Now},
		gov:     participation.NewGovernor(participation.DefaultParams(cfg.Heartbeat)),
	}
	if cfg.Consent != nil {
		g.consent, g.haveConsent, g.otherWording = g.checkWording(*cfg.Consent, true)
	}
	g.refreshConsent()
	return g, nil
}

// checkWording applies the node's wording to a recorded consent c: one given to another
// wording counts as not given (have false, other true), with a log line that says what to do.
func (g *partGate) checkWording(c participation.Consent, have bool) (_ participation.Consent, _, other bool) {
	if !have || c.GivenFor(g.wording) {
		return c, have, false
	}
	log.Warnw("consent wording changed: the owner's consent was given to another wording, so this node contributes nothing "+
		"and uses no cloud until the owner runs 'meshinfer consent' again", "consent_wording_sha256", c.WordingHash(), "node_wording_sha256", g.wording)
	return participation.Consent{}, false, true
}

// onChange sets what to call when the node starts or stops accepting work (the announcer's
// Changed, which exists only after the gate is in use).
func (g *partGate) onChange(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.changed = f
}

// onPolicy sets what to call when the effective policy changes with the owner's consent
// (the node's memory budget follows its max_memory_share).
func (g *partGate) onPolicy(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.policy = f
}

// memoryShare is the effective policy's max_memory_share (percent; 0: no cap), as of the
// consent last read.
func (g *partGate) memoryShare() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.effectiveLocked().MaxMemoryShare
}

// refreshConsent re-reads the consent when its file changed since the last read. The stat
// (one per call) and the read happen outside the lock; only the swap is under it. A fixed
// consent (Config.Consent) was set by newPartGate and never changes.
func (g *partGate) refreshConsent() {
	if g.fixed != nil || g.dir == "" {
		return
	}
	st, _ := atomicfile.Stat(filepath.Join(g.dir, participation.ConsentFile)) // unreadable: as absent
	g.mu.Lock()
	same := st.Same(g.consentStat) && (st.Exists() || !g.haveConsent)
	g.mu.Unlock()
	if same {
		return
	}
	c, have, err := participation.LoadConsent(g.dir)
	if err != nil {
		log.Warnw("consent file unreadable: contributing nothing until it is fixed", "err", err)
		have = false
	}
	c, have, other := g.checkWording(c, have)
	g.mu.Lock()
	was, wasPolicy := g.contributingLocked(), g.effectiveLocked()
	g.consentStat, g.consent, g.haveConsent, g.otherWording = st, c, have, other
	now, changed := g.contributingLocked(), g.changed
	policy := g.policy
	if g.effectiveLocked() == wasPolicy {
		policy = nil
	}
	g.mu.Unlock()
	if now != was && changed != nil {
		changed() // a withdrawal (or a new yes) reaches peers now, not at the next heartbeat
	}
	if policy != nil {
		policy()
	}
}

// contributing is the consent to serve peers, as of now.
func (g *partGate) contributingLocked() bool { return g.haveConsent && g.consent.Contribute }

// observe applies the conditions of one heartbeat, read from the vector the hardware gives
// (as a phone's or browser's would be); it re-announces when the node starts or stops
// accepting.
func (g *partGate) observe(hw probe.Hardware, now time.Time) participation.State {
	v := hw.Vector()
	c := participation.ConditionsOf(&v, hw.SensorsOK)
	g.refreshConsent()
	g.mu.Lock()
	was := g.state.Accepting
	g.cond = c
	g.state = g.gov.ObserveTraffic(g.effectiveLocked(), c, g.contributingLocked(), g.traffic.lastHour(now), now)
	st, changed := g.state, g.changed
	g.mu.Unlock()
	g.announce(was, st, changed)
	return st
}

// announce logs a change of the accepting state from was to st, and re-announces the node.
func (g *partGate) announce(was bool, st participation.State, changed func()) {
	if st.Accepting != was {
		log.Infow("participation changed", "accepting", st.Accepting, "reasons", st.Reasons)
		if changed != nil {
			changed()
		}
	}
}

func (g *partGate) effectiveLocked() participation.Policy {
	return participation.Effective(g.deployer, g.consent, g.haveConsent)
}

// batteryFloor is the effective battery floor as a fraction, announced in battery.floor.
func (g *partGate) batteryFloor() float64 {
	g.refreshConsent()
	g.mu.Lock()
	defer g.mu.Unlock()
	return float64(g.effectiveLocked().BatteryMinLevel) / 100
}

// accepting reports whether the node takes work from peers (its announcement's flag): not
// while the traffic cap is reached, even before an admission or a heartbeat has paused it.
func (g *partGate) accepting() bool {
	g.refreshConsent()
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state.Accepting && g.contributingLocked() && !g.overCapLocked(now)
}

// available is accepting as the typed error that work a peer asks for outside the task
// admission (a stage session, a bandwidth probe) gets when this node is paused
// (policy_paused), or nil.
func (g *partGate) available() error {
	if !g.accepting() {
		return inference.Errorf(inference.CodePolicyPaused, "this node is not contributing now")
	}
	return nil
}

// overCapLocked reports whether the mesh traffic of the hour up to now reached the
// effective traffic cap.
func (g *partGate) overCapLocked(now time.Time) bool {
	p := g.effectiveLocked()
	return p.MaxBytesPerHour > 0 && participation.OverCap(p, g.traffic.lastHour(now))
}

// admit is the peer inference server's admission: consent (checked afresh: a withdrawal
// stops new work at once), the governor's state, the traffic cap, then the rate limit,
// shared fairly between the requesting peers (participation.RateLimiter). A refusal is
// policy_paused, which the requester's reputation store does not count against this node.
// The admission that finds the traffic cap reached pauses the node at once (an observation
// with the latest heartbeat's conditions), so that it re-announces itself as not accepting.
func (g *partGate) admit(from peer.ID) error {
	g.refreshConsent()
	now := g.now()
	g.mu.Lock()
	switch {
	case !g.contributingLocked():
		g.mu.Unlock()
		return inference.Errorf(inference.CodePolicyPaused, "this node's owner has not agreed to contribute (%s)", participation.ReasonNoConsent)
	case !g.state.Accepting:
		reasons := joinReasons(g.state.Reasons)
		g.mu.Unlock()
		return inference.Errorf(inference.CodePolicyPaused, "this node is paused: %s", reasons)
	case g.overCapLocked(now):
		p, used := g.effectiveLocked(), g.traffic.lastHour(now)
		g.state = g.gov.ObserveTraffic(p, g.cond, g.contributingLocked(), used, now)
		st, changed := g.state, g.changed
		g.mu.Unlock()
		g.announce(true, st, changed)
		return inference.Errorf(inference.CodePolicyPaused, "this node is paused: %s (%d bytes of mesh traffic in the last hour, at most %d)",
			participation.ReasonBandwidthCap, used, p.MaxBytesPerHour)
	}
	defer g.mu.Unlock()
	if limit := g.effectiveLocked().MaxTasksPerMin; !g.rate.Allow(string(from), limit, now) {
		return inference.Errorf(inference.CodePolicyPaused, "this node is paused: %s (at most %d tasks a minute)",
			participation.ReasonRateLimited, limit)
	}
	return nil
}

// runLocal reports whether the owner lets this node run models for its own API requests:
// yes without recorded consent (the owner started the node to use it; only contributing and
// the cloud need a yes), else as consented.
func (g *partGate) runLocal() bool {
	g.refreshConsent()
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.haveConsent || g.consent.RunLocal
}

// cloudAllowed reports whether the owner agreed to cloud fallback.
func (g *partGate) cloudAllowed() bool {
	g.refreshConsent()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.haveConsent && g.consent.CloudFallback
}

// status is the "participation" object of /api/status.
func (g *partGate) status() console.Participation {
	g.refreshConsent()
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.effectiveLocked()
	now := g.now()
	out := console.Participation{
		Consent:           console.Consent{Given: g.haveConsent, WordingChanged: g.otherWording},
		Profile:           g.profile,
		Thresholds:        p,
		Admission:         "paused",
		Reasons:           []string{},
		MeshBytesLastHour: g.traffic.lastHour(now),
	}
	if g.haveConsent {
		c := g.consent
		out.Consent = console.Consent{Given: true, Version: c.Version, GivenAt: c.GivenAt.UTC().Format(time.RFC3339),
			RunLocal: c.RunLocal, Contribute: c.Contribute, CloudFallback: c.CloudFallback}
	}
	reasons := append([]participation.Reason(nil), g.state.Reasons...)
	switch {
	case g.state.Accepting && g.contributingLocked() && g.overCapLocked(now):
		// Reached since the last observation: the next admission refuses, and pauses.
		reasons = append(reasons, participation.ReasonBandwidthCap)
	case g.state.Accepting && g.contributingLocked():
		out.Admission = "accepting"
		if g.rate.Full(p.MaxTasksPerMin, now) {
			reasons = append(reasons, participation.ReasonRateLimited)
		}
	}
	if !g.contributingLocked() && !hasReason(reasons, participation.ReasonNoConsent) {
		reasons = append([]participation.Reason{participation.ReasonNoConsent}, reasons...)
	}
	for _, r := range reasons {
		out.Reasons = append(out.Reasons, string(r))
	}
	return out
}

func hasReason(rs []participation.Reason, r participation.Reason) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

func joinReasons(rs []participation.Reason) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}

// loop observes the conditions every heartbeat, from one heartbeat after it starts, until
// ctx ends. Its owner is the node
// (started in start, stopped by Close).
func (g *partGate) loop(ctx context.Context, pr *probe.Prober, heartbeat time.Duration) {
	t := time.NewTicker(heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.observe(pr.Probe(g.now()), g.now())
	}
}

// consentBackend is the local backend as the owner's consent allows it: when the owner said
// no to running models locally, every request is local_unavailable and no model is listed.
type consentBackend struct {
	inference.Backend
	g *partGate
}

var errNoLocalConsent = inference.Errorf(inference.CodeLocalUnavailable,
	"this node's owner has not agreed to run models locally; change it with 'meshinfer consent'")

func (b consentBackend) Models(ctx context.Context) ([]inference.ModelInfo, error) {
	if !b.g.runLocal() {
		return nil, nil
	}
	return b.Backend.Models(ctx)
}

func (b consentBackend) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	if !b.g.runLocal() {
		return inference.Result{}, errNoLocalConsent
	}
	return b.Backend.Generate(ctx, req, emit)
}

// Resume resumes a generation another node began (a live handover to this node) when the
// owner allows local runs and the backend can (inference.Resumer).
func (b consentBackend) Resume(ctx context.Context, req *inference.Request) (inference.Resumption, error) {
	if !b.g.runLocal() {
		return nil, errNoLocalConsent
	}
	r, ok := b.Backend.(inference.Resumer)
	if !ok {
		return nil, inference.Errorf(inference.CodeUnavailable, "this node's backend cannot resume a generation from its KV cache")
	}
	return r.Resume(ctx, req)
}

// consentLoader is a consentBackend whose backend can load a model ahead of a request
// (dispatch.Loader): the executor speculates only with such a backend.
type consentLoader struct {
	consentBackend
	ld dispatch.Loader
}

// Load loads a model when the owner allows local runs.
func (b consentLoader) Load(ctx context.Context, model string) error {
	if !b.g.runLocal() {
		return errNoLocalConsent
	}
	return b.ld.Load(ctx, model)
}
