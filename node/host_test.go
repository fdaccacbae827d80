package node

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
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

// Two nodes, and a node and another libp2p program, multiplex TCP connections with yamux,
// and streams between them carry more than one initial 256 KiB window.
func TestHostMultiplexesWithYamux(t *testing.T) {
	newNodeHost := func() host.Host {
		key, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		h, err := newHost(Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, ConnsLow: 8, ConnsHigh: 16, Loopback: true}, key)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	plain, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay(),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plain.Close() })

	const echo = protocol.ID("/meshinfer/test-echo/1.0.0")
	for _, tc := range []struct {
		name string
		peer host.Host
		want protocol.ID
	}{{"node to node", newNodeHost(), yamux.ID}, {"node to plain libp2p host", plain, yamux.ID}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.peer.SetStreamHandler(echo, func(s network.Stream) {
				io.Copy(s, s)
				s.Close()
			})
			h := newNodeHost()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := h.Connect(ctx, peer.AddrInfo{ID: tc.peer.ID(), Addrs: tc.peer.Addrs()}); err != nil {
				t.Fatal(err)
			}
			conns := h.Network().ConnsToPeer(tc.peer.ID())
			if len(conns) != 1 || conns[0].ConnState().StreamMultiplexer != tc.want {
				t.Fatalf("connections %v, want one multiplexed by %s", conns, tc.want)
			}
			s, err := h.NewStream(ctx, tc.peer.ID(), echo)
			if err != nil {
				t.Fatal(err)
			}
			msg := bytes.Repeat([]byte("token "), 50_000) // past one 256 KiB window
			go func() {
				s.Write(msg)
				s.CloseWrite()
			}()
			got, err := io.ReadAll(s)
			if err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("echo: %d of %d bytes, err %v", len(got), len(msg), err)
			}
		})
	}
}
