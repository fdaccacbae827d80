package node

import (
	"context"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/node/console"
)

// A probe between two nodes on loopback shows on both sides: the prober's /api/peers gives
// the peer's bandwidth each way with the time it was measured, the probed node's gives the
// prober's upload as its Down, and both announce a downlink measured from it (0 before).
func TestPeersShowMeasuredBandwidth(t *testing.T) {
	a := startTestNode(t, Config{Models: []string{"synth-tiny"}})
	b := startTestNode(t, Config{Models: []string{"synth-tiny"}})
	if err := a.Host().Connect(context.Background(), b.AddrInfo()); err != nil {
		t.Fatal(err)
	}
	entry := func(n *Node, of *Node) *console.Peer {
		for _, p := range n.Peers() {
			if p.PeerID == of.ID().String() {
				return &p
			}
		}
		return nil
	}
	within(t, 10*time.Second, "each node to know the other", func() bool { return entry(a, b) != nil && entry(b, a) != nil })
	if p := entry(a, b); p.BandwidthMbps != nil || p.BandwidthMeasuredAt != "" {
		t.Fatalf("bandwidth %+v at %q before any transfer", p.BandwidthMbps, p.BandwidthMeasuredAt)
	}
	if v := a.Own(); v == nil || v.Net.DownlinkMbps != 0 {
		t.Fatalf("own vector %+v before any transfer, want a downlink of 0", v)
	}

	before := time.Now().Add(-time.Second)
	est, err := a.MeasureBandwidth(context.Background(), b.ID())
	if err != nil {
		t.Fatal(err)
	}
	// The download is timed by the reader as the bytes come; the upload as the time to the
	// peer's acknowledgement less the round trip, which on loopback can leave nothing to
	// time (no sample, as the estimator's rules want): only the download is sure.
	if est.Down.Samples != 1 || est.Up.Samples > 1 {
		t.Fatalf("estimate %+v after a probe, want a sample of the download (and at most one of the upload)", est)
	}
	p := entry(a, b)
	if p.BandwidthMbps == nil || p.BandwidthMbps.Down != est.Down.Mbps() || p.BandwidthMbps.Up != est.Up.Mbps() || p.BandwidthMbps.Down <= 0 {
		t.Fatalf("/api/peers bandwidth %+v, want the estimate %+v in Mbit/s", p.BandwidthMbps, est)
	}
	if at, err := time.Parse(time.RFC3339, p.BandwidthMeasuredAt); err != nil || at.Before(before.Truncate(time.Second)) {
		t.Fatalf("bandwidth_measured_at %q (%v), want the probe's time", p.BandwidthMeasuredAt, err)
	}
	q := entry(b, a)
	if q.BandwidthMbps == nil || q.BandwidthMbps.Down <= 0 || q.BandwidthMbps.Up != 0 {
		t.Fatalf("the probed node's /api/peers bandwidth %+v, want the prober's upload as Down alone", q.BandwidthMbps)
	}
	for _, n := range []*Node{a, b} {
		n.Announce()
		within(t, 10*time.Second, "a downlink in the announced vector", func() bool {
			v := n.Own()
			return v != nil && v.Net.DownlinkMbps > 0
		})
	}
}
