package node

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
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
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
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
	newNodeHost := func() host.Host { return newTCPHost(t) }
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

// newTCPHost is a node's libp2p host (newHost: its muxers, resource manager and limits)
// listening on loopback TCP only.
func newTCPHost(t *testing.T) host.Host {
	t.Helper()
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

// yamuxWindow is go-yamux's initial receive window: what it reserves in the resource manager
// for each stream before the stream is accepted.
const yamuxWindow = 256 << 10

// A peer that opens stream after stream to a node and never reads from them is refused
// before it holds limitPeerStreamsIn streams there, and until then every stream's receive
// window is accounted in the node's scope for that peer, which stays under the per-peer
// memory and stream limits. (transport/mux reserved nothing: its streams were bounded by
// no memory limit at all.) Both limits allow 256 such streams (64 MiB is 256 windows); the
// memory limit refuses the 257th, since yamux reserves the window before the stream reaches
// the swarm, and yamux answers a refused reservation by closing the connection.
func TestResourceManagerBoundsPeerStreams(t *testing.T) {
	n := newTCPHost(t)
	// The flooding peer limits nothing itself, so every refusal is the node's.
	flood, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay(),
		libp2p.Transport(tcp.NewTCPTransport), libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.ResourceManager(&network.NullResourceManager{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { flood.Close() })

	// The node's handlers answer one byte, then hold their stream without reading until the
	// test ends (registered after the hosts' cleanups, so it runs before them). Four
	// protocols, so that go-libp2p's default per-protocol, per-peer stream limit (64 and
	// up) is not what refuses.
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	var protos []protocol.ID
	for i := range 4 {
		id := protocol.ID(fmt.Sprintf("/meshinfer/test-hold/%d", i))
		protos = append(protos, id)
		n.SetStreamHandler(id, func(s network.Stream) {
			if _, err := s.Write([]byte{1}); err != nil {
				s.Reset()
				return
			}
			<-done
			s.Reset()
		})
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := flood.Connect(ctx, peer.AddrInfo{ID: n.ID(), Addrs: n.Addrs()}); err != nil {
		t.Fatal(err)
	}
	peerStat := func() network.ScopeStat {
		var st network.ScopeStat
		if err := n.Network().ResourceManager().ViewPeer(flood.ID(), func(s network.PeerScope) error {
			st = s.Stat()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return st
	}

	var refusal error
	held := 0
	for i := range 2 * limitPeerStreamsIn {
		s, err := flood.NewStream(ctx, n.ID(), protos[i%len(protos)])
		if err == nil {
			// The answer, or the reset (or closed connection) of a refused stream.
			_, err = io.ReadFull(s, make([]byte, 1))
		}
		if err != nil {
			refusal = err
			break
		}
		held++
		st := peerStat()
		if st.Memory < int64(held)*yamuxWindow {
			t.Fatalf("%d streams held, the node accounts %d bytes for the peer: want at least %d (a window each)", held, st.Memory, held*yamuxWindow)
		}
		if st.Memory > limitPeerMemory || st.NumStreamsInbound > limitPeerStreamsIn {
			t.Fatalf("%d streams held: the peer's scope %+v is over its limits (memory %d, inbound streams %d)", held, st, limitPeerMemory, limitPeerStreamsIn)
		}
	}
	if refusal == nil {
		t.Fatalf("the node accepted %d streams from one peer, never refusing; limit %d inbound", held, limitPeerStreamsIn)
	}
	if held > limitPeerStreamsIn || held < 32 {
		t.Fatalf("refused after %d streams (%v): want some, and at most %d", held, refusal, limitPeerStreamsIn)
	}
	t.Logf("refused after %d streams (%d KiB accounted): %v", held, held*yamuxWindow>>10, refusal)
	t.Logf("figure L2: one peer's never-read streams refused after %d (limit %d), %d KiB accounted in its scope", held, limitPeerStreamsIn, held*yamuxWindow>>10)
}

// With AnnounceAddrs the host tells exactly those addresses, not its listen address, and a
// malformed one fails newHost.
func TestAnnounceAddrs(t *testing.T) {
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	const announced = "/ip4/127.0.0.9/tcp/4999"
	h, err := newHost(Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, AnnounceAddrs: []string{announced}, ConnsLow: 8, ConnsHigh: 16, Loopback: true}, key)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if got := h.Addrs(); len(got) != 1 || got[0].String() != announced {
		t.Fatalf("addrs %v, want only %s", got, announced)
	}
	if len(h.Network().ListenAddresses()) != 1 {
		t.Fatalf("listen addrs %v", h.Network().ListenAddresses())
	}
	if _, err := newHost(Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, AnnounceAddrs: []string{"127.0.0.9:4999"}, ConnsLow: 8, ConnsHigh: 16, Loopback: true}, key); err == nil {
		t.Fatal("a malformed announce address was accepted")
	}
}
