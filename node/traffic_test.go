package node

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/transport/infer"
)

// A node with a small traffic cap serves peers' requests, over real libp2p hosts on
// loopback, until the traffic it moved for them reaches the cap; then it refuses with
// policy_paused (bandwidth_cap), says so in its status and announcement, and serves again
// once the hour has passed. The count is of the bytes that really crossed its streams, and
// every admission is checked against it exactly: a request is served while the count, with
// its request frame read, is below the cap, and refused from the first one that reaches it.
func TestBandwidthCapPausesAndResumes(t *testing.T) {
	const capBytes = 3000
	clock := &testClock{now: time.Now()}
	limit, noRateLimit := int64(capBytes), 0
	n := startTestNode(t, Config{Models: []string{"synth-tiny"}, Now: clock.Now, Heartbeat: time.Minute,
		ProfileOverrides: participation.Overrides{MaxBytesPerHour: &limit, MaxTasksPerMin: &noRateLimit}})
	within(t, 5*time.Second, "an announcement accepting work", func() bool { return n.Own() != nil && n.Own().Load.Accepting })
	client := newTCPHost(t)
	if err := client.Connect(context.Background(), n.AddrInfo()); err != nil {
		t.Fatal(err)
	}
	maxTokens := 4
	req := &inference.Request{Model: "synth-tiny", MaxTokens: &maxTokens,
		Messages: []inference.Message{{Role: inference.RoleUser, Content: "how much does this cost?"}}}
	body, err := infer.EncodeRequest(req, false)
	if err != nil {
		t.Fatal(err)
	}
	reqFrame := int64(len(frame.Append(nil, body))) // what the node reads before it admits
	peers := infer.NewClient(client)
	ended := uint64(0) // requests the node answered, served or refused
	ask := func() error {
		t.Helper()
		_, err := peers.Generate(context.Background(), n.ID(), req, func(inference.Token) error { return nil })
		ended++
		// The node counts a frame as it writes it; the client may read it first.
		within(t, 5*time.Second, "the node's end of the exchange", func() bool {
			st := n.infer.Stats()
			return st.Served+st.Failed == ended
		})
		return err
	}
	used := func() int64 { return n.part.traffic.lastHour(clock.Now()) }

	served := 0
	var refusal error
	for range 100 {
		before := used()
		err := ask()
		if err == nil {
			if before+reqFrame >= capBytes {
				t.Fatalf("served with %d bytes counted and a %d-byte request: the cap is %d", before, reqFrame, capBytes)
			}
			if used() <= before+reqFrame {
				t.Fatalf("a served request moved %d bytes: its answer was not counted", used()-before)
			}
			served++
			continue
		}
		if before+reqFrame < capBytes {
			t.Fatalf("refused with %d bytes counted and a %d-byte request, under the cap of %d: %v", before, reqFrame, capBytes, err)
		}
		refusal = err
		break
	}
	if refusal == nil {
		t.Fatalf("still served after %d requests and %d bytes, cap %d", served, used(), capBytes)
	}
	if served < 2 {
		t.Fatalf("served %d requests before the cap, want several: the cap is %d bytes", served, capBytes)
	}
	if inference.CodeOf(refusal) != inference.CodePolicyPaused || !strings.Contains(refusal.Error(), string(participation.ReasonBandwidthCap)) {
		t.Fatalf("refused with %v, want policy_paused (bandwidth_cap)", refusal)
	}
	st := n.Status().Participation
	if st.Admission != "paused" || !slices.Contains(st.Reasons, string(participation.ReasonBandwidthCap)) ||
		st.MeshBytesLastHour < capBytes || st.Thresholds.MaxBytesPerHour != capBytes {
		t.Fatalf("status at the cap: %+v, want paused by bandwidth_cap with the hour's bytes", st)
	}
	within(t, 5*time.Second, "an announcement refusing work", func() bool { return !n.Own().Load.Accepting })
	if err := ask(); inference.CodeOf(err) != inference.CodePolicyPaused || !strings.Contains(err.Error(), string(participation.ReasonBandwidthCap)) {
		t.Fatalf("asked again at the cap: %v, want policy_paused (bandwidth_cap)", err)
	}

	// Heartbeats within the hour keep it paused; once the bytes have left the window, the
	// recovery heartbeats resume it.
	beat := func() participation.State {
		clock.Add(participation.DefaultHeartbeat)
		return n.part.observe(n.probe.Probe(clock.Now()), clock.Now())
	}
	clock.Add(participation.TrafficWindow - time.Minute)
	if st := beat(); st.Accepting || !slices.Equal(st.Reasons, []participation.Reason{participation.ReasonBandwidthCap}) {
		t.Fatalf("a heartbeat within the hour: %+v, want paused by bandwidth_cap", st)
	}
	clock.Add(2 * time.Minute)
	for i := range participation.DefaultRecoverBeats {
		if st := beat(); st.Accepting != (i == participation.DefaultRecoverBeats-1) {
			t.Fatalf("healthy heartbeat %d after the hour: %+v", i+1, st)
		}
	}
	if used() != 0 {
		t.Fatalf("%d bytes still counted an hour and more later", used())
	}
	if err := ask(); err != nil {
		t.Fatalf("after the hour: %v, want served", err)
	}
}

// The owner's own requests to peers are not the node's contribution: a node whose own
// request goes to a peer counts nothing, and the peer that serves it counts the exchange.
func TestOwnRequestsAreNotCounted(t *testing.T) {
	server := startTestNode(t, Config{Models: []string{"synth-tiny"}})
	asker := startTestNode(t, Config{Models: []string{"synth-tiny"}})
	if err := asker.host.Connect(context.Background(), server.AddrInfo()); err != nil {
		t.Fatal(err)
	}
	maxTokens := 2
	req := &inference.Request{Model: "synth-tiny", MaxTokens: &maxTokens,
		Messages: []inference.Message{{Role: inference.RoleUser, Content: "hi"}}}
	if _, err := infer.NewClient(asker.host).Generate(context.Background(), server.ID(), req, func(inference.Token) error { return nil }); err != nil {
		t.Fatal(err)
	}
	within(t, 5*time.Second, "the server's end of the exchange", func() bool { return server.infer.Stats().Served == 1 })
	if got := asker.part.traffic.lastHour(time.Now()); got != 0 {
		t.Fatalf("the asking node counted %d bytes of its own request", got)
	}
	if got := server.part.traffic.lastHour(time.Now()); got == 0 {
		t.Fatal("the serving node counted nothing")
	}
}
