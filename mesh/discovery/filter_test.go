package discovery

import (
	"fmt"
	"slices"
	"testing"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/peer"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
)

func addrs(t *testing.T, ss ...string) []ma.Multiaddr {
	t.Helper()
	out := make([]ma.Multiaddr, len(ss))
	for i, s := range ss {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		out[i] = a
	}
	return out
}

// What a found peer's record can make this node dial, by how this node listens.
func TestDialableAddrs(t *testing.T) {
	const (
		loop4   = "/ip4/127.0.0.1/tcp/4001"
		loop6   = "/ip6/::1/udp/4001/quic-v1"
		lan     = "/ip4/192.168.1.20/tcp/4001"
		ula     = "/ip6/fd00::20/udp/4001/quic-v1"
		cgnat   = "/ip4/100.64.3.4/tcp/4001"
		public  = "/ip4/203.0.113.7/tcp/4001"
		public6 = "/ip6/2001:db8::7/udp/4001/quic-v1"
		relay   = "/ip4/203.0.113.8/tcp/4001/p2p/12D3KooWEHi1S2Jb2ooFE6KyuHCj6LfBcfKQvKDPd4JeNUTgH3zi/p2p-circuit"
	)
	all := []string{loop4, loop6, lan, ula, cgnat, public, public6, relay}
	undialable := []string{
		"/dns4/example.com/tcp/4001",      // a name resolves to anything
		"/dns/localhost/tcp/4001",         // ... this machine included
		"/ip4/0.0.0.0/tcp/4001",           // unspecified
		"/ip6/::/udp/4001/quic-v1",        // unspecified
		"/ip4/224.0.0.251/udp/5353",       // multicast
		"/ip6/ff02::1/udp/4001/quic-v1",   // multicast
		"/ip4/255.255.255.255/tcp/4001",   // broadcast
		"/ip4/169.254.10.1/tcp/4001",      // link-local
		"/ip6/fe80::1/tcp/4001",           // link-local
		"/ip4/203.0.113.7/tcp/0",          // port 0
		"/ip4/203.0.113.7/udp/0/quic-v1",  // port 0
		"/ip4/203.0.113.7",                // no port
		"/unix/tmp/meshinfer.sock",        // not an IP address
		"/ip4/203.0.113.7/sctp/4001",      // neither TCP nor UDP
		"/ip6zone/eth0/ip6/fe80::1/tcp/1", // zoned
	}
	for _, tt := range []struct {
		name   string
		listen []string
		want   []string
	}{
		{"loopback testnet", []string{"/ip4/127.0.0.1/tcp/4001", "/ip4/127.0.0.1/udp/4001/quic-v1"}, []string{loop4, loop6}},
		{"loopback IPv6", []string{"/ip6/::1/tcp/4001"}, []string{loop4, loop6}},
		{"every interface", []string{"/ip4/0.0.0.0/tcp/4001", "/ip6/::/udp/4001/quic-v1"}, []string{lan, ula, cgnat, public, public6, relay}},
		{"a LAN address", []string{"/ip4/192.168.1.5/tcp/4001"}, []string{lan, ula, cgnat, public, public6, relay}},
		{"a public address", []string{"/ip4/198.51.100.9/tcp/4001"}, []string{public, public6, relay}},
		{"loopback and public", []string{"/ip4/127.0.0.1/tcp/4001", "/ip4/198.51.100.9/tcp/4001"}, []string{loop4, loop6, public, public6, relay}},
		{"listening nowhere", nil, []string{lan, ula, cgnat, public, public6, relay}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := reachOf(addrs(t, tt.listen...))
			got := r.dialable("", addrs(t, append(slices.Clone(undialable), all...)...), nil)
			if want := addrs(t, tt.want...); !slices.EqualFunc(got, want, ma.Multiaddr.Equal) {
				t.Errorf("dialable: %v, want %v", got, want)
			}
		})
	}
}

// At most maxAddrsPerPeer addresses of a peer, the first ones that pass.
func TestDialableAddrsBounded(t *testing.T) {
	var many []string
	for i := range 3 * maxAddrsPerPeer {
		many = append(many, fmt.Sprintf("/ip4/203.0.113.%d/tcp/%d", i+1, 4000+i))
	}
	many = append([]string{"/dns4/example.com/tcp/1"}, many...)
	got := reachOf(nil).dialable("", addrs(t, many...), nil)
	if want := addrs(t, many[1:1+maxAddrsPerPeer]...); !slices.EqualFunc(got, want, ma.Multiaddr.Equal) {
		t.Fatalf("dialable: %v, want the first %d dialable: %v", got, maxAddrsPerPeer, want)
	}
}

// The transports decide too: a host running TCP and QUIC (as a node does) drops the
// addresses of transports it does not run, and its own addresses.
func TestDialableAddrsByTransport(t *testing.T) {
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.NoTransports,
		libp2p.Transport(tcp.NewTCPTransport), libp2p.Transport(quic.NewTransport), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	sw, ok := h.Network().(interface {
		CanDial(peer.ID, ma.Multiaddr) bool
	})
	if !ok {
		t.Fatalf("%T has no CanDial", h.Network())
	}
	other, err := peer.Decode("12D3KooWEHi1S2Jb2ooFE6KyuHCj6LfBcfKQvKDPd4JeNUTgH3zi")
	if err != nil {
		t.Fatal(err)
	}
	found := addrs(t,
		"/ip4/127.0.0.1/tcp/4001",
		"/ip4/127.0.0.1/udp/4001/quic-v1",
		"/ip4/127.0.0.1/tcp/4002/ws",
		"/ip4/127.0.0.1/udp/4003/webrtc-direct/certhash/uEiAkH5a4DPGKUuOBjYw0CgwjvcJCJMD2K_1jk_W3wNuQZg",
		"/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWEHi1S2Jb2ooFE6KyuHCj6LfBcfKQvKDPd4JeNUTgH3zi/p2p-circuit",
	)
	found = append(found, h.Network().ListenAddresses()...) // this host's own
	got := reachOf(h.Network().ListenAddresses()).dialable(other, found, sw.CanDial)
	if want := found[:2]; !slices.EqualFunc(got, want, ma.Multiaddr.Equal) {
		t.Fatalf("dialable: %v, want %v", got, want)
	}
}
