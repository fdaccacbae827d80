package discovery

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p-kbucket/peerdiversity"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
)

func TestGroupOf(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want string // "" for none
	}{
		{"/ip4/203.0.113.7/tcp/4001", "203.0.113.0/24"},
		{"/ip4/127.1.0.2/udp/4001/quic-v1", "127.1.0.0/24"},
		{"/ip6/2001:db8:1:2::7/tcp/4001", "2001:db8:1::/48"},
		{"/ip6/::ffff:198.51.100.9/tcp/4001", "198.51.100.0/24"},
		{"/dns4/example.com/tcp/4001", ""},
	} {
		g, ok := groupOf(ma.StringCast(tc.addr))
		if got := map[bool]string{true: g.String(), false: ""}[ok]; got != tc.want {
			t.Errorf("%s: group %q, want %q", tc.addr, got, tc.want)
		}
	}
}

func TestChooseDiverse(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	conn := func(id string, group string, ageS int) outbound {
		return outbound{peer: peer.ID(id), group: netip.MustParsePrefix(group), opened: t0.Add(-time.Duration(ageS) * time.Second)}
	}
	for _, tc := range []struct {
		name      string
		conns     []outbound
		protected []string
		slots     int
		want      []string
	}{
		{"none", nil, nil, 8, nil},
		{"one per group, the oldest", []outbound{conn("a", "203.0.113.0/24", 10), conn("b", "203.0.113.0/24", 50), conn("c", "198.51.100.0/24", 5)},
			nil, 8, []string{"b", "c"}},
		{"slots bound the set, oldest first", []outbound{conn("a", "10.0.1.0/24", 1), conn("b", "10.0.2.0/24", 2), conn("c", "10.0.3.0/24", 3)},
			nil, 2, []string{"b", "c"}},
		{"protected peers stay, though younger", []outbound{conn("a", "203.0.113.0/24", 10), conn("b", "203.0.113.0/24", 50)},
			[]string{"a"}, 8, []string{"a"}},
		{"a protected peer gone frees its slot", []outbound{conn("b", "203.0.113.0/24", 50), conn("c", "198.51.100.0/24", 5)},
			[]string{"a"}, 1, []string{"b"}},
		{"two protected in one group keep one", []outbound{conn("a", "203.0.113.0/24", 10), conn("b", "203.0.113.0/24", 50)},
			[]string{"a", "b"}, 8, []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prot := map[peer.ID]bool{}
			for _, p := range tc.protected {
				prot[peer.ID(p)] = true
			}
			got := slices.Sorted(maps.Keys(chooseDiverse(tc.conns, prot, tc.slots)))
			var want []peer.ID
			for _, p := range tc.want {
				want = append(want, peer.ID(p))
			}
			if !slices.Equal(got, want) {
				t.Fatalf("chose %v, want %v", got, want)
			}
		})
	}
}

// The DHT's routing table takes at most 3 peers of one public IP group (2 per bucket), and
// any number of loopback or private ones.
func TestDHTDiversityFilterExemptsLocalGroups(t *testing.T) {
	f := DHTDiversityFilter(nil)
	admit := func(key string, cpl int) bool {
		g := peerdiversity.PeerGroupInfo{Id: peer.ID(fmt.Sprint(key, cpl)), Cpl: cpl, IPGroupKey: peerdiversity.PeerIPGroupKey(key)}
		if !f.Allow(g) {
			return false
		}
		f.Increment(g)
		return true
	}
	public := 0
	for cpl := range 10 {
		if admit("203.0.0.0", cpl) {
			public++
		}
	}
	if public != 3 {
		t.Fatalf("took %d peers of one public group, want 3", public)
	}
	if admit("198.51.0.0", 1) && admit("198.51.0.0", 1) && admit("198.51.0.0", 1) {
		t.Fatal("took 3 peers of one public group in one bucket, want 2")
	}
	for _, key := range []string{"127.0.0.0", "192.168.0.0", "10.4.0.0"} {
		for cpl := range 10 {
			if !admit(key, cpl%2) {
				t.Fatalf("group %s refused at peer %d: loopback and private groups are exempt", key, cpl)
			}
		}
	}
}

// plainHost is a libp2p host listening on TCP at ip (a 127.x.y.z address: Linux routes all
// of 127/8 to loopback, so addresses in other /24s stand for hosts in other networks).
func plainHost(t *testing.T, ip string, opts ...libp2p.Option) host.Host {
	t.Helper()
	h, err := libp2p.New(append([]libp2p.Option{libp2p.ListenAddrStrings("/ip4/" + ip + "/tcp/0"), libp2p.DisableRelay(),
		libp2p.Transport(tcp.NewTCPTransport)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestDiverseOutboundSurviveInboundFlood is the F12 eclipse attempt against the connection
// manager: the victim has dialled four honest peers, three network groups among them, then
// twelve attackers connect to it and the connection manager trims to its low water mark
// (1). With protection, the three diverse outbound connections survive the trim and the
// attackers go; without it (the control), the trim takes honest connections with the
// attackers'.
func TestDiverseOutboundSurviveInboundFlood(t *testing.T) {
	for _, tc := range []struct {
		name  string
		slots int
	}{{"protected", DefaultDiverseSlots}, {"unprotected control", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			// No grace period, and no trimming but the test's own.
			cm, err := connmgr.NewConnManager(1, 2, connmgr.WithGracePeriod(0), connmgr.WithSilencePeriod(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			victim := plainHost(t, "127.0.0.1", libp2p.ConnectionManager(cm))
			d, err := New(victim, Params{Mesh: "t", DiverseSlots: tc.slots})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var honest []host.Host
			for _, ip := range []string{"127.1.0.2", "127.1.0.3", "127.2.0.2", "127.3.0.2"} {
				h := plainHost(t, ip)
				if err := victim.Connect(ctx, peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()}); err != nil {
					t.Fatal(err)
				}
				honest = append(honest, h)
			}
			if tc.slots > 0 {
				eventually(t, 10*time.Second, "three diverse outbound connections protected", func() bool { return d.Diverse() == 3 })
				protected := 0
				for _, h := range honest {
					if cm.IsProtected(h.ID(), diverseTag) {
						protected++
					}
				}
				if protected != 3 || cm.IsProtected(honest[0].ID(), diverseTag) == cm.IsProtected(honest[1].ID(), diverseTag) {
					t.Fatalf("%d honest peers protected; want 3, one of the two in 127.1.0.0/24", protected)
				}
			}

			for i := range 12 {
				a := plainHost(t, fmt.Sprintf("127.9.0.%d", i+1))
				if err := a.Connect(ctx, peer.AddrInfo{ID: victim.ID(), Addrs: victim.Addrs()}); err != nil {
					t.Fatal(err)
				}
			}
			cm.TrimOpenConns(ctx)

			var kept []string
			for _, h := range honest {
				if victim.Network().Connectedness(h.ID()) == network.Connected {
					kept = append(kept, h.Addrs()[0].String())
				}
			}
			inbound := 0
			for _, c := range victim.Network().Conns() {
				if c.Stat().Direction == network.DirInbound {
					inbound++
				}
			}
			t.Logf("after the flood and the trim: honest peers connected %v, inbound connections %d", kept, inbound)
			if tc.slots > 0 {
				t.Logf("figure F12: after 12 inbound attackers and a trim to 1: %d protected outbound connections to honest peers kept, %d inbound left", len(kept), inbound)
			}
			if tc.slots > 0 && (len(kept) < 3 || inbound > 1) {
				t.Fatalf("protected: %d honest peers kept, %d inbound connections left; want at least the 3 protected, at most 1 inbound", len(kept), inbound)
			}
			if tc.slots < 0 && len(kept) >= 3 {
				t.Fatalf("control: %d honest peers survived an unprotected trim to 1: the test does not exercise trimming", len(kept))
			}
		})
	}
}
