package node

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
)

// Draining: a node asked to stop (meshinfer node on SIGTERM or Ctrl-C) first drains, then
// closes. Close alone cancels the tasks it serves for peers, whose routers then resume
// them elsewhere by replay; draining lets them finish here instead, within a bound:
//
//  1. stop admitting: every new task from a peer is refused with shutting_down (the router
//     tries another peer and counts a rejection, not a failure), and the node announces
//     itself as not accepting at once, so that routers stop choosing it;
//  2. ask the generations in flight for peers to move (live transfer, handOver): those whose
//     requester takes a handover send it their KV cache and stop within a few tokens;
//     the others run on; the pipeline stages it runs tell their heads, which move them;
//  3. wait until the tasks in flight for peers and the stage sessions have ended or moved,
//     or the deadline (ctx) passes;
//  4. Close (the caller's): the API lets its own in-flight requests end within its
//     shutdown grace; tasks still running past the drain deadline are cancelled, and their
//     routers resume them elsewhere.
//
// The node's own API keeps answering until Close: it routes to other peers, which is not
// work this node would have to finish.

// DefaultDrainTimeout bounds a drain: long enough for a chat answer of a few hundred
// tokens in flight to finish, short enough for a service manager's stop timeout (systemd's
// is 90 s; 10 s drain plus at most 10 s of Close).
const DefaultDrainTimeout = 10 * time.Second

// drainPoll is how often Drain checks the tasks in flight: the inference server has no
// notification for its last task ending, and a drain lasts seconds.
const drainPoll = 20 * time.Millisecond

// Drain stops admitting tasks from peers and waits until those in flight have ended or
// ctx ends (then it returns ctx's error; the tasks left are Close's to cancel). Once
// called, the node admits no peer task again: Close is what follows.
func (n *Node) Drain(ctx context.Context) error {
	if !n.draining.Swap(true) && n.announcer != nil {
		n.announcer.Changed() // announce Accepting false now, not at the next heartbeat
	}
	if n.infer == nil {
		return nil
	}
	n.handOver("draining")
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	for n.infer.Stats().InFlight > 0 || n.stageWork() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain: %d tasks and %d stage sessions for peers still running: %w",
				n.infer.Stats().InFlight, n.stageWork(), ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// stageWork is the stage sessions this node runs or keeps for heads: a drain waits for
// them to move (their heads re-link their chains and fetch them) or end.
func (n *Node) stageWork() int {
	if n.stageSrv == nil {
		return 0
	}
	return n.stageSrv.Sessions() + n.stageSrv.Kept()
}

// admit is the peer server's admission: none while draining, else participation's.
func (n *Node) admit(from peer.ID) error {
	if n.draining.Load() {
		return inference.Errorf(inference.CodeShuttingDown, "this node is stopping and takes no new tasks")
	}
	return n.part.admit(from)
}

// handOver asks every generation this node serves for peers to move elsewhere (live
// transfer, inference/handover.go): the node is leaving, why says why. Requesters that take
// handovers get each one's KV cache on its stream and resume it on another peer; the
// others' generations run on (the pause admits nothing new, a drain waits for them).
func (n *Node) handOver(why string) {
	if k := n.infer.HandOver(); k > 0 {
		log.Infow("handing generations over to other peers", "generations", k, "why", why)
	}
	// The pipeline stages it runs tell their heads, which move them (transport/stage,
	// "Moves"): a head that cannot sees the stage leave at its next step.
	if n.stageSrv != nil {
		if k := n.stageSrv.HandOver(); k > 0 {
			log.Infow("handing pipeline stages over", "sessions", k, "why", why)
		}
	}
}

// acceptingChanged re-announces the node when it starts or stops taking work from peers;
// when it stops (paused by its participation policy: battery, heat, the owner's
// withdrawal, a metered network, the traffic cap) it also hands the generations it serves
// over.
func (n *Node) acceptingChanged() {
	n.announcer.Changed()
	if n.infer != nil && !n.part.accepting() {
		n.handOver("paused")
	}
}
