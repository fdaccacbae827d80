package discovery

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// Contact without a walk.
//
// A peer this node heard of only through others (mesh/announce's pending peers) comes
// without addresses: GossipSub and caps-sync relay signed vectors, not addresses. A Kademlia
// lookup (the routed host's FindPeer) finds them by walking towards the peer, dialling each
// DHT server on its way: in a 100-node mesh 20-30 new connections for one contact, which made
// every node of docs/benchmarks.md B6 hold 35 connections and four times the heap. But a peer
// that relayed or served a vector has usually been connected to its author, and a bootstrap
// peer to everyone: the DHT's FIND_PEER handler answers with the target's addresses when its
// peerstore holds them. So Contact asks a few of the peers this node is connected to already,
// one request each on the connection that exists, and dials the peer itself and nobody else.
// The walk stays the caller's last resort (mesh/announce uses it only for a model no
// contacted peer offers).

// Asker asks connected peer p for the peers it knows closest to id, id itself first when its
// peerstore holds id's addresses: the DHT's FIND_NODE request (kad-dht's
// pb.ProtocolMessenger.GetClosestPeers).
type Asker interface {
	GetClosestPeers(ctx context.Context, p, id peer.ID) ([]*peer.AddrInfo, error)
}

const (
	// askPeers bounds the connected peers asked at once for one peer's addresses: a node
	// below announce's contact low water (8) asks every peer it has, and one past it a
	// sample as large.
	askPeers = 8
	// askTimeout bounds the requests for one peer's addresses: a few round trips on open
	// connections, and far less than mesh/announce's 15 s per contact, so a peer that never
	// answers leaves the dial its time.
	askTimeout = 5 * time.Second
)

// ErrNoAddrs says that neither this node nor the connected peers it asked know an address
// of the peer, or none this node dials.
var ErrNoAddrs = errors.New("no known address")

// Contact connects h to p: at the addresses h's peerstore holds for p or, when it holds
// none, at those that up to askPeers of h's connected peers answer with, filtered like found
// peers' addresses (filter.go: a peer may steer this node's dials no more than a rendezvous
// record can). It dials p only. ErrNoAddrs when no address was found.
func Contact(ctx context.Context, h host.Host, ask Asker, p peer.ID) error {
	if h.Network().Connectedness(p) == network.Connected {
		return nil
	}
	ai := peer.AddrInfo{ID: p}
	if len(h.Peerstore().Addrs(p)) == 0 {
		ai.Addrs = dialable(h, peer.AddrInfo{ID: p, Addrs: askAddrs(ctx, h, ask, p)})
		if len(ai.Addrs) == 0 {
			return fmt.Errorf("contact %s: %w", p, ErrNoAddrs)
		}
	}
	if err := h.Connect(ctx, ai); err != nil {
		return fmt.Errorf("contact %s: %w", p, err)
	}
	return nil
}

// askAddrs asks up to askPeers connected peers (in the network's order) for p's addresses, at
// once, and returns those of the first answer that holds any.
func askAddrs(ctx context.Context, h host.Host, ask Asker, p peer.ID) []ma.Multiaddr {
	// A connection that closed meanwhile fails the request instead of being dialled again.
	ctx, cancel := context.WithTimeout(network.WithNoDial(ctx, "ask a connected peer"), askTimeout)
	defer cancel()
	var (
		mu    sync.Mutex
		found []ma.Multiaddr
		wg    sync.WaitGroup
	)
	asked := 0
	for _, via := range h.Network().Peers() {
		if asked == askPeers {
			break
		}
		if via == p {
			continue
		}
		asked++
		// Each request ends when it is answered or ctx ends; waited for below.
		wg.Go(func() {
			infos, err := ask.GetClosestPeers(ctx, via, p)
			if err != nil {
				return
			}
			for _, ai := range infos {
				if ai == nil || ai.ID != p || len(ai.Addrs) == 0 {
					continue
				}
				mu.Lock()
				if found == nil {
					found = ai.Addrs
					cancel() // one answer is enough: end the others
				}
				mu.Unlock()
				return
			}
		})
	}
	wg.Wait()
	return found
}
