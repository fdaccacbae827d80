package node

import (
	"context"
	"math"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/transport/bwprobe"
)

// Bandwidth, measured (issue 17). One estimator (internal/bandwidth) per node, fed by the
// transfers the node makes anyway, each timed where its bytes arrive:
//   - as a stage, each step's frame from its previous hop (stage.WithServerTransfers);
//   - as a pipeline's head, each step's output from the last stage (WithPipelineTransfers);
//   - as a server of peer inference, each request frame (infer.WithServerTransfers);
//   - each capability sync answer it pulls (announce.Params.Transfers);
//   - the bandwidth probes it sends (Up and Down) and answers (Down).
//
// Only those of at least 64 KiB that the network paced count (prefill steps, long prompts,
// sync answers of a large mesh; decode steps and token streams never do). What it yields:
// the vector's net.downlink_mbps (the median of the peers' recent Down estimates, 0 while
// none is recent), each peer's estimate on /api/peers, and MeasureBandwidth, which probes a
// peer when no recent sample exists: for the viability gate of a migration to ask before a
// live transfer (gateBandwidth).

// startBandwidth answers bandwidth probes, within the participation policy (a paused node
// answers none) and counted as mesh traffic against the bandwidth cap, and sets up this
// node's own probes. The estimator is n.bw, made before the parts that feed it.
func (n *Node) startBandwidth() {
	admit := func(peer.ID) error { return n.part.available() }
	srv := bwprobe.NewServer(n.part.traffic.servingHost(n.host), n.bw, bwprobe.WithClock(n.cfg.Now), bwprobe.WithAdmission(admit))
	n.closers = append(n.closers, srv.Close)
	n.bwProbe = bwprobe.NewClient(n.dialer, n.bw, bwprobe.WithClientClock(n.cfg.Now))
}

// noteTransfer adds a transfer with p, timed by one of the node's protocols, to the
// estimator, dated by the node's clock.
func (n *Node) noteTransfer(p peer.ID, t bandwidth.Transfer) {
	n.bw.Observe(p.String(), t, n.cfg.Now())
}

// MeasureBandwidth returns what is known of the bandwidth with p, probing it first when no
// sample of either direction is recent (bwprobe.Client.Measure: within its rate limits;
// on a refusal or failure, the error comes with what was known before).
func (n *Node) MeasureBandwidth(ctx context.Context, p peer.ID) (bandwidth.Estimate, error) {
	return n.bwProbe.Measure(ctx, p)
}

// gateBandwidth is the executor's Config.Bandwidth, for a live transfer's gate: what is
// known of the bandwidth with p each way, in bytes/s, after a probe when no sample was
// recent (MeasureBandwidth). A refused probe (a paused peer answers none) leaves what was
// known: a leaving peer's rows, timed as they arrive, are its sample.
func (n *Node) gateBandwidth(ctx context.Context, p peer.ID) (down, up float64) {
	est, _ := n.MeasureBandwidth(ctx, p)
	return est.Down.BytesPerSec, est.Up.BytesPerSec
}

// downlinkMbps is the vector's net.downlink_mbps: the estimator's downlink, in Mbit/s to
// 0.1, within the vector's bound.
func (n *Node) downlinkMbps(now time.Time) float64 {
	mbps := bandwidth.Rate{BytesPerSec: n.bw.Downlink(now)}.Mbps()
	return min(math.Round(mbps*10)/10, caps.MaxDownlinkMbps)
}

// peerBandwidth is p's entry of /api/peers: its estimate each way in Mbit/s and when the
// latest sample was taken; nil and "" while nothing was measured.
func (n *Node) peerBandwidth(p peer.ID) (*console.BandwidthMbps, string) {
	est, ok := n.bw.Get(p.String())
	if !ok {
		return nil, ""
	}
	return &console.BandwidthMbps{Down: est.Down.Mbps(), Up: est.Up.Mbps()}, rfc3339(est.At())
}
