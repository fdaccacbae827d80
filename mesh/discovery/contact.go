package discovery

import (
	"context"
	"errors"
	"fmt"
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
// peerstore holds them. So Contact asks the peers this node is connected to already, its
// bootstrap peers first, one request each on the connection that exists, one peer at a time
// until one knows, and dials the peer itself and nobody else.
// The walk stays the caller's last resort (mesh/announce uses it only for a model no
// contacted peer offers).

// Asker asks connected peer p for the peers it knows closest to id, id itself first when its
// peerstore holds id's addresses: the DHT's FIND_NODE request (kad-dht's
// pb.ProtocolMessenger.GetClosestPeers).
type Asker interface {
	GetClosestPeers(ctx context.Context, p, id peer.ID) ([]*peer.AddrInfo, error)
}

// askTimeout bounds one request: a round trip on an open connection, and far less than
// mesh/announce's 15 s per contact, so a peer that never answers leaves the next one and the
// dial their time.
const askTimeout = 2 * time.Second

// ErrNoAddrs says that neither this node nor the connected peers it asked know an address
// of the peer, or none this node dials.
var ErrNoAddrs = errors.New("no known address")

// Contact connects h to p: at the addresses h's peerstore holds for p or, when it holds
// none, at those that the first of h's connected peers to know them answers with, filtered
// like found peers' addresses (filter.go: a peer may steer this node's dials no more than a
// rendezvous record can). It dials p only. ErrNoAddrs when no address was found.
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

// askAddrs asks h's connected peers for p's addresses, one at a time, bootstrap peers first
// (every node dials them, so they know the most), and returns those of the first answer that
// holds any. Asked in turn, not at once: the first usually knows, and a request cut short
// costs its peer the stream the DHT keeps for the next.
func askAddrs(ctx context.Context, h host.Host, ask Asker, p peer.ID) []ma.Multiaddr {
	var boot, rest []peer.ID
	for _, via := range h.Network().Peers() {
		switch {
		case via == p:
		case h.ConnManager().IsProtected(via, protectTag):
			boot = append(boot, via)
		default:
			rest = append(rest, via)
		}
	}
	// A connection that closed meanwhile fails the request instead of being dialled again.
	ctx = network.WithNoDial(ctx, "ask a connected peer")
	for _, via := range append(boot, rest...) {
		if ctx.Err() != nil {
			return nil
		}
		rctx, cancel := context.WithTimeout(ctx, askTimeout)
		infos, err := ask.GetClosestPeers(rctx, via, p)
		cancel()
		if err != nil {
			continue
		}
		for _, ai := range infos {
			if ai != nil && ai.ID == p && len(ai.Addrs) > 0 {
				return ai.Addrs
			}
		}
	}
	return nil
}
