package announce

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/mesh/caps"
)

// SyncProtocol returns the protocol ID of the capability sync of the named mesh; the mesh
// name is part of it so meshes never exchange vectors.
//
// The protocol lets a node that just met a peer on the capability topic pull the vectors that
// peer knows, instead of waiting up to a heartbeat for each of them to be re-announced.
//
// Wire: the client opens a stream and closes its write side without sending anything. The
// server writes up to syncMaxVectors frames, each an unsigned varint length (minimal
// encoding) followed by one signed vector in its wire form (≤ caps.MaxEncodedSize bytes),
// its own first, then closes. Every vector is checked by the client exactly as a GossipSub
// announcement is (signature, bounds, expiry, seq high-water mark): a server can withhold
// vectors but cannot forge or roll one back. A server that sends a forged or malformed vector
// or an oversized frame has its stream reset and the rest of its answer discarded.
func SyncProtocol(mesh string) protocol.ID {
	return protocol.ID("/meshinfer/" + mesh + "/caps-sync/1.0.0")
}

const (
	// syncTimeout bounds one whole sync exchange, both sides (deadline set first).
	syncTimeout = 10 * time.Second
	// syncMaxVectors bounds one answer: the registry's cap, so a full registry can be served.
	syncMaxVectors = 4096
	// resyncDelay is how long after a pull the second one comes (see syncLoop): a few
	// GossipSub heartbeats (1 s), time for the neighbour to hear of its own neighbours.
	resyncDelay = 2 * time.Second
	// youngFor is how long a node counts as new to the mesh, pulling twice from each peer
	// that joins: the time a testnet or a fresh node takes to meet its first neighbours.
	youngFor = time.Minute
	// syncQueue bounds peers waiting to be synced from; past it, joins are not synced (the
	// heartbeat still converges them).
	syncQueue = 64
)

var errSyncMisbehaved = errors.New("sync peer sent an invalid vector")

// handleSync serves this node's vector and every fresh vector in its registry.
func (a *Announcer) handleSync(s network.Stream) {
	if err := s.SetDeadline(time.Now().Add(syncTimeout)); err != nil {
		s.Reset()
		return
	}
	if err := a.writeSync(s); err != nil {
		log.Debugw("sync answer failed", "peer", s.Conn().RemotePeer(), "err", err)
		s.Reset()
		return
	}
	s.Close()
}

func (a *Announcer) writeSync(s network.Stream) error {
	vecs := make([]*caps.Vector, 0, a.reg.Len()+1)
	if own := a.own.Load(); own != nil {
		vecs = append(vecs, own)
	}
	for _, e := range a.reg.Entries(a.params.Now()) {
		if !e.Stale && e.Peer != s.Conn().RemotePeer() {
			vecs = append(vecs, e.Vector)
		}
	}
	w := bufio.NewWriter(s)
	var buf []byte
	for _, v := range vecs[:min(len(vecs), syncMaxVectors)] {
		data, err := caps.Encode(v)
		if err != nil {
			return err
		}
		buf = frame.Append(buf[:0], data)
		if _, err := w.Write(buf); err != nil {
			return err
		}
	}
	return w.Flush()
}

// syncFrom pulls p's vectors and stores the ones that pass validation. It returns how many
// were new.
func (a *Announcer) syncFrom(ctx context.Context, p peer.ID) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	s, err := a.h.NewStream(network.WithNoDial(ctx, "sync only with connected peers"), p, SyncProtocol(a.params.Mesh))
	if err != nil {
		return 0, fmt.Errorf("open sync stream: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	if err := s.SetDeadline(time.Now().Add(syncTimeout)); err != nil {
		s.Reset()
		return 0, err
	}
	if err := s.CloseWrite(); err != nil {
		s.Reset()
		return 0, err
	}
	added, err := a.readSync(frame.NewReader(s, caps.MaxEncodedSize), p)
	if err != nil {
		s.Reset()
		return added, err
	}
	s.Close()
	return added, nil
}

// readSync reads frames of at most caps.MaxEncodedSize bytes from r (the size is checked
// before the body is read).
func (a *Announcer) readSync(r *frame.Reader, from peer.ID) (int, error) {
	added := 0
	for range syncMaxVectors {
		buf, err := r.Next()
		if errors.Is(err, io.EOF) {
			return added, nil
		}
		if errors.Is(err, frame.ErrTooLarge) {
			return added, fmt.Errorf("%w: %w", errSyncMisbehaved, err)
		}
		if err != nil {
			return added, fmt.Errorf("read frame: %w", err)
		}
		ok, err := a.acceptSynced(buf)
		if err != nil {
			return added, fmt.Errorf("%w from %s: %w", errSyncMisbehaved, from, err)
		}
		if ok {
			added++
		}
	}
	return added, nil // more than syncMaxVectors: the rest is ignored
}

// acceptSynced applies one synced vector. A vector that is merely old (expired, clock skew,
// seq not above the high-water mark, our own) is skipped without error; a forged or
// malformed one is an error.
func (a *Announcer) acceptSynced(data []byte) (bool, error) {
	now := a.params.Now()
	// Most of a sync answer is already known: skip the signature check (the dominant cost)
	// for a vector whose seq the registry already holds. Decode still bounds-checks.
	if v, err := caps.Decode(data); err == nil {
		if author, err := peer.Decode(v.PeerID); err == nil && (author == a.h.ID() || a.known(author, v.Seq)) {
			return false, nil
		}
	}
	v, err := caps.Verify(data, now)
	if errors.Is(err, caps.ErrExpired) || errors.Is(err, caps.ErrClockSkew) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	author, err := peer.Decode(v.PeerID)
	if err != nil {
		return false, err
	}
	// Only a rollback is refused here; the high-water mark is not raised. If it were, the
	// GossipSub copy of this same announcement, arriving after the pull, would be Ignored and
	// so not forwarded, and a newcomer's vector would stop at the peers that pulled it until
	// its next heartbeat.
	if author == a.h.ID() || a.val.below(author, v.Seq) {
		return false, nil
	}
	if !a.reg.Put(author, v, now) {
		return false, nil
	}
	a.reg.SetConnected(author, a.h.Network().Connectedness(author) == network.Connected)
	return true, nil
}

// known reports whether the registry already holds p's vector at seq or later.
func (a *Announcer) known(p peer.ID, seq uint64) bool {
	have, ok := a.reg.Seq(p)
	return ok && have >= seq
}

// syncLoop pulls vectors from the peers joinLoop queues. A pull that fails is tried again
// resyncDelay later, once; and during this node's first youngFor, every peer is pulled from
// a second time resyncDelay after the first. A newcomer's first pulls happen while its
// neighbours are themselves still learning the mesh: a vector a neighbour learned just after
// the pull, and whose GossipSub forwarding missed this node, would otherwise arrive only with
// its author's next heartbeat. Exits when ctx is done.
func (a *Announcer) syncLoop(ctx context.Context) {
	defer a.wg.Done()
	type later struct {
		p  peer.ID
		at time.Time
	}
	var again []later // in time order; at most syncQueue
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	pull := func(p peer.ID) error {
		n, err := a.syncFrom(ctx, p)
		if err != nil && ctx.Err() == nil {
			log.Debugw("sync failed", "peer", p, "err", err)
		}
		a.synced.Add(uint64(n))
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-a.syncQ:
			err := pull(p)
			if (err != nil || time.Since(a.born) < youngFor) && len(again) < syncQueue && ctx.Err() == nil {
				again = append(again, later{p, time.Now().Add(resyncDelay)})
				if len(again) == 1 {
					timer.Reset(resyncDelay)
				}
			}
		case <-timer.C:
			l := again[0]
			again = again[1:]
			pull(l.p)
			if len(again) > 0 {
				timer.Reset(max(time.Until(again[0].at), 0))
			}
		}
	}
}
