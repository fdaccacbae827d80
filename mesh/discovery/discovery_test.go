package discovery

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	drouting "github.com/libp2p/go-libp2p/p2p/discovery/routing"
	"go.uber.org/goleak"
)

type member struct {
	h    host.Host
	dht  *dht.IpfsDHT
	disc *Discovery
}

func newMember(t *testing.T, boot []peer.AddrInfo) *member {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	d, err := dht.New(h, dht.ProtocolPrefix("/meshinfer-test"), dht.Mode(dht.ModeServer), dht.BootstrapPeers(boot...))
	if err != nil {
		t.Fatal(err)
	}
	disc, err := New(h, Params{Mesh: "t", Bootstrap: boot, Rendezvous: drouting.NewRoutingDiscovery(d), LowWater: 8})
	if err != nil {
		t.Fatal(err)
	}
	m := &member{h: h, dht: d, disc: disc}
	t.Cleanup(func() {
		m.disc.Close()
		m.dht.Close()
		m.h.Close()
	})
	return m
}

func info(h host.Host) peer.AddrInfo { return peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()} }

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Two nodes that only know a common bootstrap peer find each other through the DHT: its
// routing-table refresh or the rendezvous lookup, whichever is first.
func TestPeersOfABootstrapFindEachOther(t *testing.T) {
	boot := newMember(t, nil)
	if !boot.disc.Bootstrapped() {
		t.Fatal("a node without bootstrap peers is bootstrapped by definition")
	}
	b := newMember(t, []peer.AddrInfo{info(boot.h)})
	c := newMember(t, []peer.AddrInfo{info(boot.h)})
	eventually(t, 5*time.Second, "b and c reach the bootstrap", func() bool {
		return b.disc.Bootstrapped() && c.disc.Bootstrapped()
	})
	eventually(t, 30*time.Second, "b and c connect", func() bool {
		return b.h.Network().Connectedness(c.h.ID()) == network.Connected
	})
}

// A bootstrap peer that drops us is dialled again, and is protected from connection trimming.
func TestBootstrapRedialled(t *testing.T) {
	boot := newMember(t, nil)
	b := newMember(t, []peer.AddrInfo{info(boot.h)})
	eventually(t, 5*time.Second, "first connection", func() bool {
		return b.h.Network().Connectedness(boot.h.ID()) == network.Connected
	})
	if !b.h.ConnManager().IsProtected(boot.h.ID(), protectTag) {
		t.Fatal("bootstrap peer not protected in the connection manager")
	}
	boot.h.Network().ClosePeer(b.h.ID())
	eventually(t, 10*time.Second, "redial", func() bool {
		return b.h.Network().Connectedness(boot.h.ID()) == network.Connected
	})
}

func TestBootstrapSelfRefused(t *testing.T) {
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := New(h, Params{Mesh: "t", Bootstrap: []peer.AddrInfo{info(h)}}); err == nil {
		t.Fatal("want an error for a node bootstrapping to itself")
	}
}

func TestCloseStopsLoops(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	d, err := dht.New(h, dht.ProtocolPrefix("/meshinfer-test"), dht.Mode(dht.ModeServer))
	if err != nil {
		t.Fatal(err)
	}
	unreachable := peer.AddrInfo{ID: "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"}
	disc, err := New(h, Params{Mesh: "t", Bootstrap: []peer.AddrInfo{unreachable}, Rendezvous: drouting.NewRoutingDiscovery(d), MDNS: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := disc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := disc.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	d.Close()
	h.Close()
}
