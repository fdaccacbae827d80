package node

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/participation"
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
