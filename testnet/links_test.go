package testnet

import (
	"net"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	manet "github.com/multiformats/go-multiaddr/net"
	"go.uber.org/goleak"

	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/reputation"
)

// checkProxied fails unless every connection between nodes crosses the proxy in front of
// the node dialed: a node dials only proxies, and sees each peer that dialed it on that
// peer's own loopback address.
func checkProxied(t *testing.T, tn *Testnet) {
	t.Helper()
	index := map[peer.ID]int{}
	for i := range tn.Len() {
		if n := tn.Node(i); n != nil {
			index[n.ID()] = i
		}
	}
	tn.mu.Lock()
	proxies := append([]*linkProxy(nil), tn.proxies...)
	tn.mu.Unlock()
	conns := 0
	for i := range tn.Len() {
		n := tn.Node(i)
		if n == nil {
			continue
		}
		for _, c := range n.Host().Network().Conns() {
			k, ok := index[c.RemotePeer()]
			if !ok {
				continue
			}
			conns++
			if c.Stat().Direction == network.DirOutbound {
				if got, want := c.RemoteMultiaddr().String(), proxies[k].multiaddr(); got != want {
					t.Errorf("node %d dialed node %d at %s, not its proxy %s", i, k, got, want)
				}
				continue
			}
			na, err := manet.ToNetAddr(c.RemoteMultiaddr())
			if err != nil {
				t.Fatal(err)
			}
			if src := nodeOf(na); src != k {
				t.Errorf("node %d sees node %d's connection from %v (node %d's address)", i, k, na, src)
			}
		}
	}
	if conns == 0 {
		t.Fatal("no connections between nodes")
	}
}

// F2 (docs/reliability.md): node 3 of a 4-node mesh is cut off, every link to and from it
// blackholed, then healed. Its peers stop routing to it once its vector is stale (two missed
// heartbeats and a grace second: registry.ParamsForHeartbeat), their requests served by the
// others meanwhile; node 3 serves its own model locally and refuses a model only the others
// have at once. The partition lasts until both sides have forgotten each other (the
// registry's forget period, as the catalogue's 60 s outlasts it at the production
// heartbeat). After the heal every node sees node 3 fresh again, a request reaches it again
// within 100 requests, and no node holds its score below the exclusion line: missed
// heartbeats cost availability, not a place in the mesh.
//
// Nothing here is timed: on a loaded machine announcements and requests come late, so the
// test waits for each state (its bounds only stop a hang) and checks what makes it so from
// the vectors and the route (none issued after the cut crossed it; a refusal with no target
// tried). The times are logged as the F2 figure.
func TestPartitionAndHeal(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const hb = time.Second
	// Nodes 1 and 3 serve synth-tiny, node 0 synth-small, node 2 nothing.
	models := func(i int) []string {
		switch i {
		case 0:
			return []string{"synth-small"}
		case 2:
			return nil
		}
		return []string{"synth-tiny"}
	}
	tn, err := New(Options{Nodes: 4, Links: true, NoConsole: true, Heartbeat: hb, ModelsFor: models})
	if err != nil {
		t.Fatal(err)
	}
	defer tn.Close() // before the leak check, also when the test fails early
	within(t, 20*time.Second, "4 nodes converge", tn.Converged)
	checkProxied(t, tn)

	staleAfter := registry.ParamsForHeartbeat(hb).StaleAfter
	cut := tn.Node(3)
	others := []int{0, 1, 2}
	seen := func(stale bool) func() bool {
		return func() bool {
			now := time.Now()
			for _, i := range others {
				a, b := tn.Node(i), cut
				for _, pair := range [][2]peerView{{a, b}, {b, a}} {
					e, ok := pair[0].Registry().Get(pair[1].ID(), now)
					if stale != (!ok || e.Stale) || !stale && !e.Contacted {
						return false
					}
				}
			}
			return true
		}
	}

	if err := tn.LinksOf(3).Partition(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	// Stale staleAfter past the last announcement that crossed (the registry's rule). When
	// that is depends on how soon the machine delivered the last ones before the cut, so
	// the test waits for it (the bound only stops a hang) and checks what makes it so:
	// no announcement issued after the cut crossed it, either way.
	within(t, time.Minute, "node 3 and the others stale to each other", seen(true))
	stale := time.Since(t0).Round(time.Millisecond)
	t.Logf("partition: stale after %v (registry's bound %v past the last announcement that crossed)", stale, staleAfter)
	for _, i := range others {
		a, b := tn.Node(i), cut
		for _, pair := range [][2]peerView{{a, b}, {b, a}} {
			e, ok := pair[0].Registry().Get(pair[1].ID(), time.Now())
			if ok && e.Vector.IssuedAt > t0.UnixMilli() {
				t.Fatalf("%s holds a vector of %s issued %d ms after the cut: an announcement crossed the partition",
					pair[0].ID(), pair[1].ID(), e.Vector.IssuedAt-t0.UnixMilli())
			}
		}
	}

	// Same side: synth-tiny from nodes 0 and 2 is served by node 1. Each request waits
	// until its sender heard from node 1 within the last heartbeat: on a loaded machine an
	// announcement can come late, and node 1, the one server left on this side, stale for a
	// moment, is no target (model_not_found, 2 runs in 12 under CPU burners).
	for k := range 10 {
		from := tn.Node(others[k%2*2])
		within(t, time.Minute, "node 1 heard from within a heartbeat", func() bool {
			now := time.Now()
			e, ok := from.Registry().Get(tn.Node(1).ID(), now)
			return ok && !e.Stale && e.Age(now) < hb
		})
		r := stream(t, from.APIAddr(), routedBody("synth-tiny", 4, int64(k), nil), nil, nil)
		if r.errCode != "" || !r.done || r.final.Route == "peer:"+cut.ID().String() {
			t.Fatalf("request %d during the partition: %+v", k, r)
		}
	}
	// Node 3's side: its own model locally; synth-small, only across, refused at once.
	if r := stream(t, cut.APIAddr(), routedBody("synth-tiny", 4, 100, nil), nil, nil); r.errCode != "" || r.final.Route != "local" {
		t.Fatalf("node 3's own model during the partition: %+v", r)
	}
	// At once: refused by the route decision, with no target tried (no dial into the
	// partition to time out), read from the error rather than a stopwatch.
	if r := stream(t, cut.APIAddr(), routedBody("synth-small", 4, 101, map[string]string{"route": "explicit"}), nil, nil); r.errCode != "model_not_found" || r.final.Attempts != 0 {
		t.Fatalf("a model across the partition from node 3: %+v; want model_not_found, no target tried", r)
	}

	// The catalogue's partition lasts 60 s, past every registry's forget period: so does
	// this one, scaled to the heartbeat. Node 3 and the others forget each other.
	forgetAfter := registry.ParamsForHeartbeat(hb).ForgetAfter
	// The registry forgets at its sweep, once a heartbeat, forgetAfter past the last
	// announcement that crossed; the bound only stops a hang.
	within(t, time.Minute, "node 3 and the others forgotten", func() bool {
		now := time.Now()
		for _, i := range others {
			if _, ok := tn.Node(i).Registry().Get(cut.ID(), now); ok {
				return false
			}
			if _, ok := cut.Registry().Get(tn.Node(i).ID(), now); ok {
				return false
			}
		}
		return true
	})
	t.Logf("partition: forgotten after %v (forget period %v)", time.Since(t0).Round(time.Millisecond), forgetAfter)

	t1 := time.Now()
	if err := tn.LinksOf(3).Heal(); err != nil {
		t.Fatal(err)
	}
	// Fresh again from the announcements held across the partition or the next ones: how
	// soon is the machine's speed, logged as the figure; the bound only stops a hang, and
	// stays under the registry's unreachable period (2 min), which must not be waited out.
	within(t, time.Minute, "node 3 and the others fresh to each other", seen(false))
	fresh := time.Since(t1).Round(time.Millisecond)
	t.Logf("heal: fresh after %v (heartbeat %v)", fresh, hb)
	// Node 3 is a target again: node 0's requests for synth-tiny go to node 1 or node 3, by
	// weight (its latency measured before the cut counts: it got the 1st to the 12th
	// request in 16 runs). Counted in requests, not seconds (a loaded machine fits fewer in
	// a window): at a 10 % share, 100 all missing node 3 has odds of 3 in 100,000.
	const maxRequests = 100
	served := 0
	for k := 0; served == 0; k++ {
		if k == maxRequests {
			t.Fatalf("node 3 served none of %d requests after the heal", maxRequests)
		}
		r := stream(t, tn.Node(0).APIAddr(), routedBody("synth-tiny", 4, int64(200+k), nil), nil, nil)
		if r.errCode != "" || !r.done {
			t.Fatalf("request %d after the heal: %+v", k, r)
		}
		if r.final.Route == "peer:"+cut.ID().String() {
			served = k + 1
		}
	}
	servedAfter := time.Since(t1).Round(time.Millisecond)
	t.Logf("heal: node 3 served request %d, %v after the heal", served, servedAfter)
	for _, i := range others {
		for _, p := range tn.Node(i).Peers() {
			if p.PeerID == cut.ID().String() && (p.Excluded || p.Score < reputation.ExcludeBelow) {
				t.Errorf("node %d scores node 3 %.1f after the partition (%s)", i, p.Score, p.ScoreReason)
			}
		}
	}
	for _, p := range cut.Peers() {
		if p.Excluded || p.Score < reputation.ExcludeBelow {
			t.Errorf("node 3 scores %s %.1f after the partition (%s)", p.PeerID, p.Score, p.ScoreReason)
		}
	}
	t.Logf("figure F2: stale %v after the cut (heartbeat %v); after the heal fresh %v, node 3 serving %v; no score below 40",
		stale, hb, fresh, servedAfter)
}

// peerView is what seen needs of a node.
type peerView interface {
	ID() peer.ID
	Registry() *registry.Registry
}

// Links into and out of node 2 add 50 ms each way from the start: node 0, which routes,
// measures a round trip to node 2 of at least 100 ms (the peerstore's latency, the RTT the
// executor gives route.Decide as Peer.RTT) and less to node 1. The share of
// requests node 2 gets is logged here; TestSlowPeerF3 asserts what route.Decide's latency
// rule makes of it.
func TestLinkDelay(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const delay = 50 * time.Millisecond
	tn, err := New(Options{Nodes: 3, Links: true, NoConsole: true, Heartbeat: time.Second, ModelsFor: serveNothing,
		LinkFaults: func(i, j int) LinkFaults {
			if i == 2 || j == 2 {
				return LinkFaults{Delay: delay}
			}
			return LinkFaults{}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer tn.Close()
	within(t, 20*time.Second, "3 nodes converge", tn.Converged)
	router, fast, slow := tn.Node(0), tn.Node(1), tn.Node(2)
	rtt := router.Host().Peerstore().LatencyEWMA
	within(t, 10*time.Second, "RTTs measured", func() bool { return rtt(fast.ID()) > 0 && rtt(slow.ID()) > 0 })
	if got := rtt(slow.ID()); got < 2*delay {
		t.Errorf("RTT to the delayed peer %v, want ≥ %v", got, 2*delay)
	}
	// Only node 2's links are delayed (an upper bound on the other's RTT would time the
	// machine).
	if got := rtt(fast.ID()); got >= rtt(slow.ID()) {
		t.Errorf("RTT to the direct peer %v, not under the delayed peer's %v", got, rtt(slow.ID()))
	}
	t.Logf("RTT: delayed peer %v, other %v", rtt(slow.ID()), rtt(fast.ID()))

	slowServed := 0
	const n = 40
	for k := range n {
		r := stream(t, router.APIAddr(), routedBody("synth-tiny", 4, int64(k), nil), nil, nil)
		if r.errCode != "" || !r.done {
			t.Fatalf("request %d: %+v", k, r)
		}
		if r.final.Route == "peer:"+slow.ID().String() {
			slowServed++
		}
	}
	t.Logf("the delayed peer served %d of %d requests", slowServed, n)
	t.Logf("figure F3: RTT to a peer %v further each way %v (direct peer %v); it served %d of %d requests",
		delay, rtt(slow.ID()).Round(time.Millisecond), rtt(fast.ID()).Round(time.Millisecond), slowServed, n)
}

// The proxy tells a node by its loopback source address.
func TestNodeOf(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want int
	}{
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 9}, 0},
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.4")}, 3},
		{&net.TCPAddr{IP: net.ParseIP("127.0.0.0")}, -1},
		{&net.TCPAddr{IP: net.ParseIP("127.0.1.2")}, -1},
		{&net.TCPAddr{IP: net.ParseIP("10.0.0.2")}, -1},
		{&net.TCPAddr{IP: net.ParseIP("::1")}, -1},
		{&net.UDPAddr{IP: net.ParseIP("127.0.0.2")}, -1},
	} {
		if got := nodeOf(tc.addr); got != tc.want {
			t.Errorf("nodeOf(%v) = %d, want %d", tc.addr, got, tc.want)
		}
	}
}
