package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/transport/infer"
)

// Without recorded consent a node contributes nothing and says how to consent; consent
// given while it runs takes effect at the next request, and a withdrawal stops new work at
// once and re-announces the node as not accepting.
func TestConsentGivenAndWithdrawnWhileRunning(t *testing.T) {
	dir := t.TempDir()
	n := startTestNode(t, Config{Models: []string{"synth-tiny"}, DataDir: dir, Consent: nil, Heartbeat: time.Minute})
	peerID := n.ID() // any peer: admission does not depend on who asks

	err := n.part.admit(peerID)
	if inference.CodeOf(err) != inference.CodePolicyPaused || !strings.Contains(err.Error(), "not agreed to contribute") {
		t.Fatalf("admission without consent: %v", err)
	}
	st := n.Status().Participation
	if st.Consent.Given || st.Admission != "paused" || len(st.Reasons) == 0 || st.Reasons[0] != "no_consent" {
		t.Fatalf("status without consent: %+v", st)
	}
	within(t, 5*time.Second, "the first announcement", func() bool { return n.Own() != nil })
	if n.Own().Load.Accepting {
		t.Fatal("announced as accepting without consent")
	}
	if !n.part.runLocal() || n.part.cloudAllowed() {
		t.Fatal("without consent: local runs for the owner allowed, the cloud not")
	}

	published := n.announcer.Published()
	c := participation.Consent{Version: participation.ConsentVersion, GivenAt: time.Now(), RunLocal: true, Contribute: true,
		BatteryFloor: participation.DefaultBatteryFloor}
	if err := participation.SaveConsent(dir, c); err != nil {
		t.Fatal(err)
	}
	// The governor still holds the pause for no_consent until its next observation; admission
	// checks consent afresh, and the node re-announces at once.
	n.part.observe(n.probe.Probe(time.Now()), time.Now())
	n.part.observe(n.probe.Probe(time.Now()), time.Now())
	n.part.observe(n.probe.Probe(time.Now()), time.Now())
	if err := n.part.admit(peerID); err != nil {
		t.Fatalf("admission after consent (and the recovery heartbeats): %v", err)
	}
	within(t, 5*time.Second, "an announcement accepting work", func() bool { return n.announcer.Published() > published && n.Own().Load.Accepting })

	published = n.announcer.Published()
	if err := participation.WithdrawConsent(dir); err != nil {
		t.Fatal(err)
	}
	if err := n.part.admit(peerID); inference.CodeOf(err) != inference.CodePolicyPaused {
		t.Fatalf("admission right after withdrawal: %v", err)
	}
	within(t, 5*time.Second, "an announcement refusing work", func() bool { return n.announcer.Published() > published && !n.Own().Load.Accepting })
	if n.part.cloudAllowed() {
		t.Fatal("cloud allowed after withdrawal")
	}
}

// The owner's "no" to running models locally makes local requests local_unavailable.
func TestNoLocalRunsWithoutThatConsent(t *testing.T) {
	c := participation.Consent{Version: participation.ConsentVersion, GivenAt: time.Now(), Contribute: true}
	n := startTestNode(t, Config{Models: []string{"synth-tiny"}, Consent: &c})
	_, err := n.ownerBackend().Generate(t.Context(), &inference.Request{Model: "synth-tiny",
		Messages: []inference.Message{{Role: inference.RoleUser, Content: "hi"}}}, func(inference.Token) error { return nil })
	if !errors.Is(err, errNoLocalConsent) {
		t.Fatalf("local run without consent to it: %v", err)
	}
	if err := n.part.admit(n.ID()); err != nil {
		t.Fatalf("contribution was consented: %v", err)
	}
}

// testClock is a clock a test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// One peer flooding a node with tasks cannot keep a second peer out of its tasks-per-minute
// budget: once the flood's admissions age out, the second peer, refused meanwhile, is
// admitted before the flooder gets more than its share (issue 19, finding 6). Real hosts;
// the node's clock is the test's.
func TestFloodingPeerLeavesOthersTheirShare(t *testing.T) {
	const budget = 4
	clock := &testClock{now: time.Now()}
	limit := budget
	n := startTestNode(t, Config{Models: []string{"synth-tiny"}, Now: clock.Now,
		ProfileOverrides: participation.Overrides{MaxTasksPerMin: &limit}})
	flooder, other := newTCPHost(t), newTCPHost(t)
	ask := func(h host.Host) error {
		t.Helper()
		if err := h.Connect(context.Background(), n.AddrInfo()); err != nil {
			t.Fatal(err)
		}
		maxTokens := 2
		req := &inference.Request{Model: "synth-tiny", MaxTokens: &maxTokens,
			Messages: []inference.Message{{Role: inference.RoleUser, Content: "hi"}}}
		_, err := infer.NewClient(h).Generate(context.Background(), n.ID(), req, func(inference.Token) error { return nil })
		if err != nil && (inference.CodeOf(err) != inference.CodePolicyPaused || !strings.Contains(err.Error(), string(participation.ReasonRateLimited))) {
			t.Fatalf("refused with %v, want policy_paused (rate_limited)", err)
		}
		return err
	}
	admitted := func(h host.Host, tries int) int {
		t.Helper()
		got := 0
		for range tries {
			if ask(h) == nil {
				got++
			}
		}
		return got
	}

	if got := admitted(flooder, 2*budget); got != budget { // alone: the whole budget
		t.Fatalf("the flooder alone got %d tasks, want the budget of %d", got, budget)
	}
	clock.Add(time.Second)
	if ask(other) == nil {
		t.Fatal("admitted past the budget")
	}
	clock.Add(participation.RateWindow - time.Second)
	// The flood's admissions aged out, the other peer's refusal not yet; the flooder asks
	// first, and gets its share only.
	if got := admitted(flooder, 2*budget); got != budget/2 {
		t.Fatalf("the flooder got %d tasks with another peer waiting, want its share of %d", got, budget/2)
	}
	if got := admitted(other, budget/2); got != budget/2 {
		t.Fatalf("the other peer got %d of the %d tasks kept for it", got, budget/2)
	}
}

// A consent given to another wording than the node's counts as not given: the node
// contributes nothing and uses no cloud, its status says the wording changed, and it
// contributes again once the owner has answered the node's wording. A record without a
// wording hash (written before the wording was configurable) was given to the built-in
// wording.
func TestConsentWordingChanged(t *testing.T) {
	const ours = "Our company's own consent text.\nContribute?\n"
	old := `{"version": 1, "given_at": "2025-01-01T00:00:00Z", "run_local": true, "contribute": true,
		"cloud_fallback": true, "battery_floor": 30, "pause_on_metered": true}`
	writeConsent := func(t *testing.T, dir, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, participation.ConsentFile), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("old record, built-in wording", func(t *testing.T) {
		dir := t.TempDir()
		writeConsent(t, dir, old)
		n := startTestNode(t, Config{Models: []string{"synth-tiny"}, DataDir: dir})
		if err := n.part.admit(n.ID()); err != nil {
			t.Fatalf("an old record on a node with the built-in wording: %v, want admitted", err)
		}
		if st := n.Status().Participation.Consent; !st.Given || st.WordingChanged {
			t.Fatalf("consent status %+v, want given", st)
		}
	})

	t.Run("old record, deployer's wording", func(t *testing.T) {
		dir := t.TempDir()
		writeConsent(t, dir, old)
		n := startTestNode(t, Config{Models: []string{"synth-tiny"}, DataDir: dir, ConsentWording: ours})
		err := n.part.admit(n.ID())
		if inference.CodeOf(err) != inference.CodePolicyPaused || !strings.Contains(err.Error(), string(participation.ReasonNoConsent)) {
			t.Fatalf("admission with consent to another wording: %v, want policy_paused (no_consent)", err)
		}
		st := n.Status().Participation
		if st.Consent.Given || !st.Consent.WordingChanged || st.Admission != "paused" || len(st.Reasons) == 0 || st.Reasons[0] != "no_consent" {
			t.Fatalf("status: %+v, want no consent, wording changed", st)
		}
		if n.part.cloudAllowed() || !n.part.runLocal() {
			t.Fatal("with consent to another wording: the cloud allowed, or local runs for the owner not")
		}
		within(t, 5*time.Second, "the first announcement", func() bool { return n.Own() != nil })
		if n.Own().Load.Accepting {
			t.Fatal("announced as accepting with consent to another wording")
		}

		// The owner answers the deployer's wording: the node contributes again.
		c := participation.Consent{Version: participation.ConsentVersion, GivenAt: time.Now(), RunLocal: true, Contribute: true,
			CloudFallback: true, WordingSHA256: participation.WordingHash(ours)}
		if err := participation.SaveConsent(dir, c); err != nil {
			t.Fatal(err)
		}
		for range participation.DefaultRecoverBeats {
			n.part.observe(n.probe.Probe(time.Now()), time.Now())
		}
		if err := n.part.admit(n.ID()); err != nil {
			t.Fatalf("after consenting to the node's wording: %v", err)
		}
		if st := n.Status().Participation.Consent; !st.Given || st.WordingChanged || !n.part.cloudAllowed() {
			t.Fatalf("consent status %+v after answering again, want given", st)
		}
	})

	t.Run("fixed consent", func(t *testing.T) {
		c := participation.Consent{Version: participation.ConsentVersion, GivenAt: time.Now(), Contribute: true}
		n := startTestNode(t, Config{Models: []string{"synth-tiny"}, Consent: &c, ConsentWording: ours})
		if err := n.part.admit(n.ID()); inference.CodeOf(err) != inference.CodePolicyPaused {
			t.Fatalf("a fixed consent to the built-in wording on a node with its own: %v, want refused", err)
		}
	})
}

// A wording larger than participation.MaxConsentWording is refused at start.
func TestConsentWordingTooLarge(t *testing.T) {
	cfg := Config{ConsentWording: strings.Repeat("x", participation.MaxConsentWording+1), Identity: nil, DataDir: t.TempDir()}
	if _, err := cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), "64 KiB") {
		t.Fatalf("withDefaults with a 64 KiB + 1 wording: %v, want refused", err)
	}
}
