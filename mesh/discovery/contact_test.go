package discovery

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// dhtNode is a host with a DHT server and the DHT's one-request messenger (what node passes
// to Contact).
type dhtNode struct {
	h   host.Host
	dht *dht.IpfsDHT
	ask *dhtpb.ProtocolMessenger
}

func newDHTNode(t *testing.T) *dhtNode {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	d, err := dht.New(h, dht.ProtocolPrefix("/meshinfer-test"), dht.Mode(dht.ModeServer), dht.DisableAutoRefresh())
	if err != nil {
		t.Fatal(err)
	}
	ask, err := dhtpb.NewProtocolMessenger(d.MessageSender())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		h.Close()
	})
	return &dhtNode{h: h, dht: d, ask: ask}
}

func connect(t *testing.T, a, b *dhtNode) {
	t.Helper()
	if err := a.h.Connect(context.Background(), info(b.h)); err != nil {
		t.Fatal(err)
	}
	// The DHT takes a peer into its routing table once identify says it speaks the DHT.
	eventually(t, 5*time.Second, "routing tables filled", func() bool {
		return a.dht.RoutingTable().Find(b.h.ID()) != "" && b.dht.RoutingTable().Find(a.h.ID()) != ""
	})
}

// connectedTo lists the peers h is connected to, sorted.
func connectedTo(h host.Host) []peer.ID {
	ps := h.Network().Peers()
	slices.Sort(ps)
	return ps
}

func sorted(ps ...peer.ID) []peer.ID {
	slices.Sort(ps)
	return ps
}

// a knows b; b knows c and d, which a has never heard of. Contact(c) asks b for c's
// addresses and connects a to c, and to nobody else. The control: a Kademlia walk for c
// from the same position also connects a to d, which is on its way.
func TestContactDialsOnlyThePeer(t *testing.T) {
	ctx := context.Background()
	a, b, c, d := newDHTNode(t), newDHTNode(t), newDHTNode(t), newDHTNode(t)
	connect(t, a, b)
	connect(t, b, c)
	connect(t, b, d)
	if len(a.h.Peerstore().Addrs(c.h.ID())) != 0 {
		t.Fatal("a knows c's addresses before the contact: the test proves nothing")
	}

	if err := Contact(ctx, a.h, a.ask, c.h.ID()); err != nil {
		t.Fatal(err)
	}
	if got, want := connectedTo(a.h), sorted(b.h.ID(), c.h.ID()); !slices.Equal(got, want) {
		t.Fatalf("after Contact(c), a is connected to %v, want b and c %v", got, want)
	}
	if err := Contact(ctx, a.h, a.ask, c.h.ID()); err != nil {
		t.Fatal("second contact, already connected:", err)
	}

	// The control: a fresh node in a's place, walking the DHT towards c, dials d on the way.
	// GetClosestPeers, not FindPeer: a FindPeer walk stops once c answers, so whether it has
	// dialled d by then is a race; this walk ends only when it has queried every one of the
	// closest peers it heard of, d among them.
	w := newDHTNode(t)
	connect(t, w, b)
	if _, err := w.dht.GetClosestPeers(ctx, string(c.h.ID())); err != nil {
		t.Fatal("the walk:", err)
	}
	if w.h.Network().Connectedness(d.h.ID()) != network.Connected {
		t.Fatalf("control: the walk for c left w connected to %v only, not to d: this test cannot tell a walk from Contact",
			connectedTo(w.h))
	}
}

// A peer that neither this node nor any peer it is connected to knows is ErrNoAddrs, and
// nothing is dialled.
func TestContactUnknownPeer(t *testing.T) {
	a, b := newDHTNode(t), newDHTNode(t)
	connect(t, a, b)
	unknown := peer.ID("12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq")
	err := Contact(context.Background(), a.h, a.ask, unknown)
	if !errors.Is(err, ErrNoAddrs) {
		t.Fatalf("Contact(unknown) = %v, want ErrNoAddrs", err)
	}
	if got, want := connectedTo(a.h), sorted(b.h.ID()); !slices.Equal(got, want) {
		t.Fatalf("after a failed contact, a is connected to %v, want only b", got)
	}
}

// lastKnows is an Asker whose peers know target's addresses only once every other peer has
// been asked, and that records the order in which peers were asked.
type lastKnows struct {
	target peer.AddrInfo
	total  int // connected peers, all to be asked

	mu    sync.Mutex
	asked []peer.ID
}

func (l *lastKnows) GetClosestPeers(_ context.Context, via, id peer.ID) ([]*peer.AddrInfo, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked = append(l.asked, via)
	if id != l.target.ID || len(l.asked) < l.total {
		return nil, nil
	}
	return []*peer.AddrInfo{&l.target}, nil
}

// Contact asks its connected peers, its bootstrap peer first, until one knows the peer.
func TestContactAsksEveryConnectedPeer(t *testing.T) {
	ctx := context.Background()
	a, c := newDHTNode(t), newDHTNode(t)
	var boot peer.ID
	const others = 6
	for i := range others {
		o := newDHTNode(t)
		if err := a.h.Connect(ctx, info(o.h)); err != nil {
			t.Fatal(err)
		}
		if i == others-1 { // the last connected: not first by chance of order alone
			boot = o.h.ID()
			a.h.ConnManager().Protect(boot, protectTag)
		}
	}
	ask := &lastKnows{target: info(c.h), total: others}
	if err := Contact(ctx, a.h, ask, c.h.ID()); err != nil {
		t.Fatal(err)
	}
	if a.h.Network().Connectedness(c.h.ID()) != network.Connected {
		t.Fatal("a is not connected to c")
	}
	ask.mu.Lock()
	defer ask.mu.Unlock()
	if len(ask.asked) != others {
		t.Fatalf("asked %d peers, want all %d", len(ask.asked), others)
	}
	if ask.asked[0] != boot {
		t.Fatalf("asked %v in this order, want the bootstrap peer %s first", ask.asked, boot)
	}
}
