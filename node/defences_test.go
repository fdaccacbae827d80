package node

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/meshinfer/meshinfer/mesh/announce"
	"github.com/meshinfer/meshinfer/mesh/caps"
)

// tcpPeer is a plain libp2p host on TCP at ip (any 127.x.y.z: Linux routes all of 127/8 to
// loopback, and the host dials from the address it listens on, so the node sees ip).
func tcpPeer(t *testing.T, ip string) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/"+ip+"/tcp/0"), libp2p.DisableRelay(), libp2p.Transport(tcp.NewTCPTransport))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// remoteIPs are the remote IP addresses of the connections h holds to p.
func remoteIPs(h host.Host, p peer.ID) []string {
	var out []string
	for _, c := range h.Network().ConnsToPeer(p) {
		if ip, err := manet.ToIP(c.RemoteMultiaddr()); err == nil {
			out = append(out, ip.String())
		}
	}
	return out
}

// TestConnectionCapPerIP is L3's per-IP bound on real hosts: with the loopback exemption
// overridden, limitConnsPerIPv4 (8) peers on 127.0.0.2 connect to a node's host and the
// next one from that address is refused, while a peer on 127.0.0.3 still connects. The
// control shows that by default loopback is exempt: the same 9th peer connects.
func TestConnectionCapPerIP(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit bool
	}{{"loopback limited", true}, {"loopback exempt (default)", false}} {
		t.Run(tc.name, func(t *testing.T) {
			key, _, err := crypto.GenerateEd25519Key(rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			n, err := newHost(Config{ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, ConnsLow: 64, ConnsHigh: 128, Loopback: true, LimitLoopback: tc.limit}, key)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { n.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			target := peer.AddrInfo{ID: n.ID(), Addrs: n.Addrs()}

			for i := range limitConnsPerIPv4 {
				p := tcpPeer(t, "127.0.0.2")
				if err := p.Connect(ctx, target); err != nil {
					t.Fatalf("peer %d of 127.0.0.2: %v", i+1, err)
				}
				if ips := remoteIPs(n, p.ID()); len(ips) != 1 || ips[0] != "127.0.0.2" {
					t.Fatalf("the node sees peer %d from %v, want 127.0.0.2 once", i+1, ips)
				}
			}
			extra := tcpPeer(t, "127.0.0.2")
			err = extra.Connect(ctx, target)
			switch {
			case tc.limit && err == nil:
				t.Fatalf("peer %d of 127.0.0.2 connected: want it refused past %d connections of one IP", limitConnsPerIPv4+1, limitConnsPerIPv4)
			case !tc.limit && err != nil:
				t.Fatalf("loopback exempt: peer %d of 127.0.0.2 refused: %v", limitConnsPerIPv4+1, err)
			}
			t.Logf("peer %d of 127.0.0.2: %v", limitConnsPerIPv4+1, err)
			other := tcpPeer(t, "127.0.0.3")
			if err := other.Connect(ctx, target); err != nil {
				t.Fatalf("a peer on 127.0.0.3: %v", err)
			}
			t.Logf("figure L3: %d peers of 127.0.0.2 connected, the next %s; a peer of 127.0.0.3 connected",
				limitConnsPerIPv4, map[bool]string{true: "refused", false: "connected (exempt)"}[tc.limit])
		})
	}
}

// scoreWatch keeps the latest GossipSub score snapshots of a node (WithPeerScoreInspect),
// and, as a raw tracer, which peers are in its mesh for the capability topic.
type scoreWatch struct {
	topic string

	mu     sync.Mutex
	scores map[peer.ID]*pubsub.PeerScoreSnapshot
	mesh   map[peer.ID]bool
	grafts map[peer.ID]int
	// validated counts, per peer that delivered them, the messages that entered validation.
	validated map[peer.ID]int
	// recv counts, per author, the messages that arrived in RPCs (before any graylisting).
	recv map[peer.ID]int
}

func newScoreWatch() *scoreWatch {
	return &scoreWatch{topic: announce.Topic(DefaultMesh), mesh: map[peer.ID]bool{}, grafts: map[peer.ID]int{}, validated: map[peer.ID]int{}, recv: map[peer.ID]int{}}
}

// options are the node's PubsubOptions: the inspector every 20 ms and the tracer.
func (w *scoreWatch) options() []pubsub.Option {
	return []pubsub.Option{
		pubsub.WithPeerScoreInspect(pubsub.ExtendedPeerScoreInspectFn(func(s map[peer.ID]*pubsub.PeerScoreSnapshot) {
			w.mu.Lock()
			w.scores = s
			w.mu.Unlock()
		}), 20*time.Millisecond),
		pubsub.WithRawTracer(w),
	}
}

func (w *scoreWatch) score(p peer.ID) (pubsub.PeerScoreSnapshot, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.scores[p]
	if !ok {
		return pubsub.PeerScoreSnapshot{}, false
	}
	return *s, true
}

func (w *scoreWatch) inMesh(p peer.ID) (in bool, grafts int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mesh[p], w.grafts[p]
}

func (w *scoreWatch) validations(p peer.ID) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.validated[p]
}

// received is how many messages authored by p arrived in RPCs, graylisted or not.
func (w *scoreWatch) received(p peer.ID) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.recv[p]
}

func (w *scoreWatch) Graft(p peer.ID, topic string) {
	if topic != w.topic {
		return
	}
	w.mu.Lock()
	w.mesh[p] = true
	w.grafts[p]++
	w.mu.Unlock()
}

func (w *scoreWatch) Prune(p peer.ID, topic string) {
	if topic == w.topic {
		w.mu.Lock()
		delete(w.mesh, p)
		w.mu.Unlock()
	}
}

// The rest of pubsub.RawTracer.
var _ pubsub.RawTracer = (*scoreWatch)(nil)

func (w *scoreWatch) ValidateMessage(msg *pubsub.Message) {
	w.mu.Lock()
	w.validated[msg.ReceivedFrom]++
	w.mu.Unlock()
}

func (w *scoreWatch) OnNewOutboundStream(peer.ID, protocol.ID) {}
func (w *scoreWatch) OnClosedOutboundStream(peer.ID)           {}
func (w *scoreWatch) Join(string)                              {}
func (w *scoreWatch) Leave(string)                             {}
func (w *scoreWatch) DeliverMessage(*pubsub.Message)           {}
func (w *scoreWatch) RejectMessage(*pubsub.Message, string)    {}
func (w *scoreWatch) DuplicateMessage(*pubsub.Message)         {}
func (w *scoreWatch) ThrottlePeer(peer.ID)                     {}
func (w *scoreWatch) RecvRPC(r *pubsub.RPC) {
	w.mu.Lock()
	for _, m := range r.GetPublish() {
		w.recv[peer.ID(m.GetFrom())]++
	}
	w.mu.Unlock()
}
func (w *scoreWatch) SendRPC(*pubsub.RPC, peer.ID)                         {}
func (w *scoreWatch) SendRPCCompleted(*pubsub.RPC, peer.ID, time.Duration) {}
func (w *scoreWatch) DropRPC(*pubsub.RPC, peer.ID)                         {}
func (w *scoreWatch) UndeliverableMessage(*pubsub.Message)                 {}

// gossipPeer is a plain libp2p host on ip with GossipSub (no scoring of its own),
// subscribed to the capability topic. It flood-publishes, as an attacker would: its own
// messages go to every peer on the topic, also to a node that pruned it from its mesh.
func gossipPeer(t *testing.T, ip string) (host.Host, *pubsub.Topic) {
	t.Helper()
	h := tcpPeer(t, ip)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ps, err := pubsub.NewGossipSub(ctx, h, pubsub.WithFloodPublish(true))
	if err != nil {
		t.Fatal(err)
	}
	topic, err := ps.Join(announce.Topic(DefaultMesh))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := topic.Subscribe() // announces the subscription: the node then counts it a topic peer
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Cancel)
	return h, topic
}

// connect connects from to to.
func connect(from, to host.Host) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return from.Connect(ctx, peer.AddrInfo{ID: to.ID(), Addrs: to.Addrs()})
}

// forgedVector is a vector claiming to be author's with a signature that does not verify.
func forgedVector(t *testing.T, author peer.ID, seq uint64) []byte {
	t.Helper()
	other, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	v := caps.Vector{Runtime: caps.RuntimeDesktop, CPU: caps.CPU{Cores: 8, Arch: "amd64"}, RAM: caps.RAM{TotalMB: 16384, FreeMB: 8192},
		Thermal: caps.ThermalNominal, AppState: caps.AppStateForeground, Net: caps.Net{Type: caps.NetEthernet}, Models: []caps.Model{},
		Load: caps.Load{Accepting: true}, PeerID: author.String(), Seq: seq, IssuedAt: now.UnixMilli(), Expires: now.Add(time.Minute).UnixMilli()}
	if err := caps.Sign(other, &v); err != nil {
		t.Fatal(err)
	}
	v.PeerID = author.String() // signed as another peer: the signature does not verify for author
	data, err := caps.Encode(&v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestGossipSubGraylistsAForger is F10's first attacker on real hosts: a neighbour
// publishing forged capability vectors. Each one the node's validator rejects counts
// against it in GossipSub's own score (P4); at its 7th it is below the graylist threshold
// (-490 < -400), is pruned from the node's mesh, and its RPCs are then dropped unread. An
// honest node connected all the while keeps a positive score and its mesh place.
func TestGossipSubGraylistsAForger(t *testing.T) {
	w := newScoreWatch()
	victim := startTestNode(t, Config{Heartbeat: time.Second, PubsubOptions: w.options()})
	honest := startTestNode(t, Config{Heartbeat: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := honest.Host().Connect(ctx, peer.AddrInfo{ID: victim.ID(), Addrs: victim.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	att, topic := gossipPeer(t, "127.0.0.1")
	if err := connect(att, victim.Host()); err != nil {
		t.Fatal(err)
	}
	within(t, 15*time.Second, "the honest node and the attacker in the victim's mesh, the honest node scoring above 0", func() bool {
		hs, _ := w.score(honest.ID())
		inH, _ := w.inMesh(honest.ID())
		inA, _ := w.inMesh(att.ID())
		return inH && inA && hs.Score > 0
	})

	graylisted := func() bool { s, ok := w.score(att.ID()); return ok && s.Score < announce.ScoreGraylist }
	sent := 0
	for !graylisted() {
		if sent == 20 {
			s, _ := w.score(att.ID())
			t.Fatalf("the attacker sent %d forged vectors and scores %.1f, above the graylist threshold %v", sent, s.Score, announce.ScoreGraylist)
		}
		before := victim.Status().Announcements.Rejected
		if err := topic.Publish(ctx, forgedVector(t, att.ID(), uint64(sent+1))); err != nil {
			t.Fatal(err)
		}
		sent++
		within(t, 10*time.Second, "the forged vector rejected, or the attacker graylisted", func() bool {
			return victim.Status().Announcements.Rejected > before || graylisted()
		})
	}
	rejected := victim.Status().Announcements.Rejected
	s, _ := w.score(att.ID())
	t.Logf("graylisted after %d forged vectors (%d rejected): score %.1f, invalid deliveries %.2f", sent, rejected, s.Score, s.Topics[w.topic].InvalidMessageDeliveries)
	if rejected != 7 {
		t.Fatalf("graylisted after %d rejected forgeries, want 7 (-10·7² = -490 < %v; -10·6² = -360 is not)", rejected, announce.ScoreGraylist)
	}
	within(t, 10*time.Second, "the attacker pruned from the victim's mesh", func() bool {
		in, _ := w.inMesh(att.ID())
		return !in
	})

	// Graylisted: its RPCs are dropped before validation. Ten more forgeries arrive; then,
	// once two more of the honest node's messages have been validated, none of the ten has
	// been (RPCs are handled in arrival order, and a graylisted one is dropped in the step
	// that would queue its messages for validation).
	validated, arrived := w.validations(att.ID()), w.received(att.ID())
	for i := range 10 {
		if err := topic.Publish(ctx, forgedVector(t, att.ID(), uint64(sent+i+1))); err != nil {
			t.Fatal(err)
		}
	}
	within(t, 10*time.Second, "the ten forgeries arrived at the victim", func() bool { return w.received(att.ID()) >= arrived+10 })
	honestSeen := w.validations(honest.ID())
	within(t, 10*time.Second, "the honest node's next announcements validated", func() bool { return w.validations(honest.ID()) >= honestSeen+2 })
	if got := w.validations(att.ID()); got != validated || victim.Status().Announcements.Rejected != rejected {
		t.Fatalf("graylisted attacker: %d of its 10 arrived messages validated, rejected %d → %d", got-validated, rejected, victim.Status().Announcements.Rejected)
	}
	hs, _ := w.score(honest.ID())
	if in, _ := w.inMesh(honest.ID()); hs.Score <= 0 || !in {
		t.Fatalf("the honest node: score %.1f, in the mesh %v; want above 0 and in", hs.Score, in)
	}
	t.Logf("honest node: score %.1f (first deliveries %.1f)", hs.Score, hs.Topics[w.topic].FirstMessageDeliveries)
	t.Logf("figure F10: the forger graylisted at the %dth rejected vector (score %.0f), its next 10 messages dropped unvalidated; the honest neighbour %.1f, in the mesh", rejected, s.Score, hs.Score)
}

// localIPv4 is a non-loopback IPv4 address of this machine, or "" when it has none.
// GossipSub leaves loopback out of its IP colocation count, so a test of that count needs
// peers that connect from another address; they all share this one.
func localIPv4() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			return ipn.IP.String()
		}
	}
	return ""
}

// TestSybilsOnOneIPScoreBelowPublish is F11 on real hosts: twelve identities on one IP
// address connect to a node (on the machine's own non-loopback address, since GossipSub
// ignores loopback in P6 and the resource manager exempts it), and the node connects to
// one peer on 127.0.0.3.
// The per-IP connection cap lets limitConnsPerIPv4 (8) of the twelve in; GossipSub's IP
// colocation factor then scores each of them (8-3)² = 25 times -10: -250, below the gossip
// (-50) and publish (-100) thresholds and under zero: no mesh place, no gossip, never a
// publish target. The peer on its own address scores 0 and stays connected.
func TestSybilsOnOneIPScoreBelowPublish(t *testing.T) {
	ip := localIPv4()
	if ip == "" {
		t.Skip("no non-loopback IPv4 address on this machine")
	}
	w := newScoreWatch()
	victim := startTestNode(t, Config{ListenAddrs: []string{"/ip4/" + ip + "/tcp/0"}, PubsubOptions: w.options()})
	var sybils []peer.ID
	refused := 0
	for range 12 {
		h, _ := gossipPeer(t, ip)
		if err := connect(h, victim.Host()); err != nil {
			refused++
			continue
		}
		if ips := remoteIPs(victim.Host(), h.ID()); len(ips) != 1 || ips[0] != ip {
			t.Fatalf("the node sees a Sybil from %v, want %s", ips, ip)
		}
		sybils = append(sybils, h.ID())
	}
	if len(sybils) != limitConnsPerIPv4 {
		t.Fatalf("%d of 12 identities on one IP connected, want %d", len(sybils), limitConnsPerIPv4)
	}
	// The node dials this one: a dial from 127.0.0.3 to the node's address would leave
	// from that address, the Sybils'.
	honest, _ := gossipPeer(t, "127.0.0.3")
	if err := connect(victim.Host(), honest); err != nil {
		t.Fatal(err)
	}
	factor := float64((limitConnsPerIPv4 - 3) * (limitConnsPerIPv4 - 3))
	want := -10 * factor
	within(t, 15*time.Second, fmt.Sprintf("every connected Sybil scoring %.0f", want), func() bool {
		for _, p := range sybils {
			if s, ok := w.score(p); !ok || s.IPColocationFactor != factor {
				return false
			}
		}
		_, ok := w.score(honest.ID())
		return ok
	})
	for _, p := range sybils {
		if s, _ := w.score(p); s.Score > want || s.Score > announce.ScorePublish {
			t.Fatalf("Sybil %s scores %.1f, want at most %.0f, below the publish threshold %v", p, s.Score, want, announce.ScorePublish)
		}
	}
	if s, _ := w.score(honest.ID()); s.Score < 0 || s.IPColocationFactor != 0 {
		t.Fatalf("the peer on its own address scores %.1f (colocation %.0f), want at least 0", s.Score, s.IPColocationFactor)
	}
	if victim.Host().Network().Connectedness(honest.ID()) != network.Connected {
		t.Fatal("the peer on its own address was disconnected")
	}
	t.Logf("figure F11: %d Sybils on %s connected (%d refused by the per-IP cap), each scoring %.0f; the peer on 127.0.0.3 scores 0", len(sybils), ip, refused, want)
}

// Bootstrap peers' IP addresses are allowlisted in the resource manager for their own peer
// ID only; a DNS address is left out; another peer on the same address is not allowlisted.
func TestBootstrapPeersAllowlisted(t *testing.T) {
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	boot, _ := peer.IDFromPrivateKey(key)
	other := tcpPeer(t, "127.0.0.1").ID()
	rm, err := newResourceManager(Config{Bootstrap: []peer.AddrInfo{{ID: boot, Addrs: []ma.Multiaddr{
		ma.StringCast("/ip4/203.0.113.7/tcp/4001"), ma.StringCast("/ip6/2001:db8::7/udp/4001/quic-v1"), ma.StringCast("/dns4/boot.example.com/tcp/4001"),
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer rm.Close()
	al := rcmgr.GetAllowlist(rm)
	for _, tc := range []struct {
		p    peer.ID
		addr string
		want bool
	}{
		{boot, "/ip4/203.0.113.7/tcp/5555", true},
		{boot, "/ip6/2001:db8::7/tcp/4001", true},
		{boot, "/ip4/203.0.113.8/tcp/4001", false},
		{other, "/ip4/203.0.113.7/tcp/4001", false},
	} {
		if got := al.AllowedPeerAndMultiaddr(tc.p, ma.StringCast(tc.addr)); got != tc.want {
			t.Errorf("%s from %s: allowlisted %v, want %v", tc.p, tc.addr, got, tc.want)
		}
	}
}
