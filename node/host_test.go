package node

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	ma "github.com/multiformats/go-multiaddr"
)

func delays(t *testing.T, ranked []network.AddrDelay) map[string]time.Duration {
	t.Helper()
	out := map[string]time.Duration{}
	for _, a := range ranked {
		out[a.Addr.String()] = a.Delay
	}
	return out
}

func addrs(t *testing.T, ss ...string) []ma.Multiaddr {
	t.Helper()
	var out []ma.Multiaddr
	for _, s := range ss {
		out = append(out, ma.StringCast(s))
	}
	return out
}

// On private addresses TCP goes first and QUIC waits; public ones keep go-libp2p's order.
func TestRankDialsPrefersTCPOnPrivateAddresses(t *testing.T) {
	lan := addrs(t, "/ip4/127.0.0.1/udp/4001/quic-v1", "/ip4/127.0.0.1/tcp/4001", "/ip4/192.168.1.5/tcp/4001", "/ip4/192.168.1.5/udp/4001/quic-v1")
	got := delays(t, rankDials(lan))
	if len(got) != 4 {
		t.Fatalf("ranked %d of 4 addresses: %v", len(got), got)
	}
	for a, d := range got {
		isTCP := ma.StringCast(a).Protocols()[1].Code == ma.P_TCP
		if isTCP && d != 0 {
			t.Errorf("%s: delay %v, want 0", a, d)
		}
		if !isTCP && d < lanQUICDelay {
			t.Errorf("%s: delay %v, want at least %v", a, d, lanQUICDelay)
		}
	}

	public := addrs(t, "/ip4/1.2.3.4/udp/4001/quic-v1", "/ip4/1.2.3.4/tcp/4001")
	want := delays(t, swarm.DefaultDialRanker(addrs(t, "/ip4/1.2.3.4/udp/4001/quic-v1", "/ip4/1.2.3.4/tcp/4001")))
	if got := delays(t, rankDials(public)); len(got) != 2 || got["/ip4/1.2.3.4/tcp/4001"] != want["/ip4/1.2.3.4/tcp/4001"] || got["/ip4/1.2.3.4/udp/4001/quic-v1"] != 0 {
		t.Errorf("public addresses: got %v, want go-libp2p's %v", got, want)
	}
}
