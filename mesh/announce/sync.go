package announce

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/internal/window"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/reputation"
)

// SyncProtocol returns the protocol ID of the capability sync of the named mesh; the mesh
// name is part of it so meshes never exchange vectors.
//
// The protocol lets a node that just met a peer on the capability topic pull the vectors that
// peer knows, instead of waiting up to a heartbeat for each of them to be re-announced.
//
// Wire: the client opens a stream and closes its write side without sending anything. The
// server writes up to syncMaxVectors frames, syncMaxBytes of vectors in all, each an
// unsigned varint length (minimal encoding) followed by one signed vector in its wire form
// (≤ caps.MaxEncodedSize bytes), its own first, then closes. It serves only the vectors of
// peers it has been connected to (contacted, see registry), as it received them, and
// answers one peer at most syncServeBurst times per syncServeWindow, syncMaxServing peers at
// once; past that it resets the stream.
//
// Every vector is checked by the client exactly as a GossipSub announcement is (signature,
// bounds, expiry, seq high-water mark) and admitted to the registry like one (a new identity
// is charged to the server's budget): a server can withhold vectors but cannot forge or roll
// one back, nor bring back a vector of a peer the client forgot, nor hand over more made-up
// identities than its budget. A server that sends a forged or malformed vector, an oversized
// frame or more than syncMaxBytes has its stream reset and the rest of its answer discarded;
// once its budget is spent, the client stops reading.
func SyncProtocol(mesh string) protocol.ID {
	return protocol.ID("/meshinfer/" + mesh + "/caps-sync/2.0.0")
}

const (
	// syncTimeout bounds one whole sync exchange, both sides (deadline set first).
	syncTimeout = 10 * time.Second
	// syncMaxVectors bounds one answer: the registry's cap, so a full registry can be served.
	syncMaxVectors = 4096
	// syncMaxBytes bounds one answer in bytes: 2 MiB, a thousand typical vectors (1-2 KiB).
	syncMaxBytes = 2 << 20
	// syncServeBurst answers per syncServeWindow per peer: a young node pulls twice from
	// each neighbour, and once more after a failure.
	syncServeBurst  = 3
	syncServeWindow = 30 * time.Second
	// syncMaxServing bounds the answers written at once.
	syncMaxServing = 8
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

var (
	errSyncMisbehaved = errors.New("sync peer sent an invalid vector")
	errSyncTooLarge   = errors.New("sync answer larger than its bound")
)

// syncLimiter bounds the sync answers a node gives: per peer, syncServeBurst per
// syncServeWindow (fixed windows), and syncMaxServing at once.
type syncLimiter struct {
	mu      sync.Mutex
	serving int
	last    window.Keyed[peer.ID] // answers per peer, in windows of syncServeWindow
}

// maxSyncClients bounds the windows remembered; clients are connected peers.
const maxSyncClients = 1024

// acquire reports whether p may be answered now; if so, release must follow.
func (l *syncLimiter) acquire(p peer.ID, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.serving >= syncMaxServing || !l.last.Take(p, now) {
		return false
	}
	l.serving++
	return true
}

func (l *syncLimiter) release() {
	l.mu.Lock()
	l.serving--
	l.mu.Unlock()
}

// handleSync serves this node's vector and the fresh vectors of contacted peers.
func (a *Announcer) handleSync(s network.Stream) {
	from := s.Conn().RemotePeer()
	if !a.serve.acquire(from, a.params.Now()) {
		log.Debugw("sync refused: over the rate", "peer", from)
		s.Reset()
		return
	}
	defer a.serve.release()
	if err := s.SetDeadline(time.Now().Add(syncTimeout)); err != nil {
		s.Reset()
		return
	}
	if err := a.writeSync(s); err != nil {
		log.Debugw("sync answer failed", "peer", from, "err", err)
		s.Reset()
		return
	}
	s.Close()
}

func (a *Announcer) writeSync(s network.Stream) error {
	var own []byte
	if p := a.ownWire.Load(); p != nil {
		own = *p
	}
	vecs := a.reg.Wire(a.params.Now(), s.Conn().RemotePeer(), syncMaxVectors-1, syncMaxBytes-len(own))
	w := bufio.NewWriter(s)
	var buf []byte
	for i := -1; i < len(vecs); i++ {
		data := own
		if i >= 0 {
			data = vecs[i]
		}
		if len(data) == 0 {
			continue
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
	m := bandwidth.NewMeter(s)
	added, done, err := a.readSync(frame.NewReader(m, caps.MaxEncodedSize), p)
	if errors.Is(err, errSyncMisbehaved) && a.params.Observer != nil {
		e := reputation.ProtocolViolation
		if errors.Is(err, frame.ErrTooLarge) {
			e = reputation.MalformedFrame
		}
		a.params.Observer.Observe(p.String(), e, a.params.Now())
	}
	if err != nil || !done {
		s.Reset() // also when the rest is not wanted: the server stops writing
		return added, err
	}
	s.Close()
	if a.params.Transfers != nil {
		a.params.Transfers(p, m.Take())
	}
	return added, nil
}

// readSync reads frames of at most caps.MaxEncodedSize bytes from r (the size is checked
// before the body is read), syncMaxBytes in all. done is false when it stopped before the
// end of the answer: past syncMaxVectors, or once the server's budget of new identities is
// spent.
func (a *Announcer) readSync(r *frame.Reader, from peer.ID) (added int, done bool, err error) {
	size := 0
	for range syncMaxVectors {
		buf, err := r.Next()
		if errors.Is(err, io.EOF) {
			return added, true, nil
		}
		if errors.Is(err, frame.ErrTooLarge) {
			return added, false, fmt.Errorf("%w: %w", errSyncMisbehaved, err)
		}
		if err != nil {
			return added, false, fmt.Errorf("read frame: %w", err)
		}
		if size += len(buf); size > syncMaxBytes {
			return added, false, fmt.Errorf("%w from %s: %w", errSyncMisbehaved, from, errSyncTooLarge)
		}
		res, err := a.acceptSynced(buf, from)
		if err != nil {
			return added, false, fmt.Errorf("%w from %s: %w", errSyncMisbehaved, from, err)
		}
		switch res {
		case registry.Stored:
			added++
		case registry.OverBudget, registry.Full:
			return added, false, nil
		}
	}
	return added, false, nil // more than syncMaxVectors: the rest is ignored
}

// acceptSynced applies one synced vector handed over by from. A vector that is merely old
// (expired, clock skew, seq at or below the high-water mark, our own) is skipped without
// error, as Old; a forged or malformed one is an error.
func (a *Announcer) acceptSynced(data []byte, from peer.ID) (registry.Result, error) {
	now := a.params.Now()
	// Most of a sync answer is already known: skip the signature check (the dominant cost)
	// for a vector whose seq the registry already holds. Decode still bounds-checks.
	if v, err := caps.Decode(data); err == nil {
		if author, err := peer.Decode(v.PeerID); err == nil && (author == a.h.ID() || a.known(author, v.Seq)) {
			return registry.Old, nil
		}
	}
	v, err := caps.Verify(data, now)
	if errors.Is(err, caps.ErrExpired) || errors.Is(err, caps.ErrClockSkew) {
		return registry.Old, nil
	}
	if err != nil {
		return registry.Old, err
	}
	author, err := peer.Decode(v.PeerID)
	if err != nil {
		return registry.Old, err
	}
	// The high-water mark refuses a replay or a rollback, and the last vector of a peer the
	// registry forgot (raised at the sweep). It is not raised here: if it were, the
	// GossipSub copy of this same announcement, arriving after the pull, would be Ignored
	// and so not forwarded, and a newcomer's vector would stop at the peers that pulled it
	// until its next heartbeat.
	if author == a.h.ID() || a.val.seen(author, v.Seq) {
		return registry.Old, nil
	}
	heard := registry.Heard{Vector: v, Wire: data, Via: from, Connected: a.connected(author)}
	if res := a.reg.Admit(author, heard, now); res != registry.Stored {
		return res, nil
	}
	res := a.reg.Put(author, heard, now)
	if res == registry.Stored {
		a.contactLater(author)
	}
	return res, nil
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
