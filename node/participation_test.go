package node

import (
	"context"
	"errors"
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
