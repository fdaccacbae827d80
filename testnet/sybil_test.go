package testnet

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/mesh/announce"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/node"
)

// phantomVectors signs n vectors of made-up identities, each a copy of tmpl (a real node's
// vector, so every field is in bounds) claiming an idle machine with every model warm.
func phantomVectors(t *testing.T, tmpl *caps.Vector, n int) [][]byte {
	t.Helper()
	now := time.Now()
	out := make([][]byte, 0, n)
	for range n {
		key, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		id, err := peer.IDFromPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		v := tmpl.Clone()
		v.PeerID, v.Seq = id.String(), 1
		v.IssuedAt, v.Expires = now.UnixMilli(), now.Add(caps.MaxTTL).UnixMilli()
		v.Load.InFlight = 0
		if err := caps.Sign(key, v); err != nil {
			t.Fatal(err)
		}
		data, err := caps.Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, data)
	}
	return out
}

// TestSybilVectorsThroughCapsSync is the attack of issue #19's finding 3 on real hosts: a
// peer joins the mesh's capability topic and answers the victim's caps-sync pull with 3,000
// validly signed vectors of made-up identities offering the model an honest peer serves.
// The victim takes at most one budget of them, as pending peers, never routes to them,
// drops them when it cannot reach them, serves none of them to others, and routes every
// request to the honest peer.
func TestSybilVectorsThroughCapsSync(t *testing.T) {
	tn := start(t, Options{Nodes: 2, NoConsole: true, Heartbeat: time.Second, ModelsFor: serveNothing})
	within(t, 15*time.Second, "converge", tn.Converged)
	victim, honest := tn.Node(0), tn.Node(1)
	phantoms := phantomVectors(t, honest.Status().Capability, 3000)

	// The attacker: a plain libp2p host with GossipSub, subscribed to the capability topic so
	// that the victim pulls from it on join.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	att, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	served := make(chan int, 8)
	att.SetStreamHandler(announce.SyncProtocol(node.DefaultMesh), func(s network.Stream) {
		defer s.Close()
		sent := 0
		for _, d := range phantoms {
			if err := frame.Write(s, d); err != nil {
				break // the victim stopped reading
			}
			sent++
		}
		served <- sent
	})
	ps, err := pubsub.NewGossipSub(ctx, att)
	if err != nil {
		t.Fatal(err)
	}
	topic, err := ps.Join(announce.Topic(node.DefaultMesh))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := topic.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Cancel()
	connected := time.Now()
	if err := att.Connect(ctx, peer.AddrInfo{ID: victim.ID(), Addrs: victim.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-served:
		t.Logf("attacker wrote %d of %d phantom vectors before the victim stopped reading", n, len(phantoms))
	case <-time.After(30 * time.Second):
		t.Fatal("the victim never pulled from the attacker")
	}

	// Bounded: at most the source's budget of pending peers (the burst, and what refilled
	// since: a young node pulls twice), none of them known.
	st := victim.Status()
	budget := registry.DefaultSourceBurst + int(time.Since(connected)/registry.DefaultSourceRefill) + 1
	if st.Mesh.PeersPending > budget || st.Mesh.PeersKnown != 1 || victim.Registry().Len() > 1+budget {
		t.Fatalf("after the sync: known %d pending %d held %d; want 1 known, at most %d pending",
			st.Mesh.PeersKnown, st.Mesh.PeersPending, victim.Registry().Len(), budget)
	}
	if st.Announcements.Refused.OverBudget == 0 {
		t.Fatal("no vector was refused over budget")
	}

	// Routing is unaffected while phantoms are pending: every request goes to the honest peer.
	for i := range 20 {
		body := routedBody("synth-tiny", 4, int64(i), nil)
		r := stream(t, victim.APIAddr(), body, nil, nil)
		if r.errCode != "" || !r.done || r.final.Route != "peer:"+honest.ID().String() || r.final.Attempts != 1 {
			t.Fatalf("request %d with phantoms pending: %+v", i, r)
		}
	}

	// The phantoms cannot be reached: each is dropped, and none comes back.
	within(t, 60*time.Second, "phantoms dropped", func() bool { return victim.Status().Mesh.PeersPending == 0 })
	if st := victim.Status(); st.Mesh.PeersKnown != 1 || st.Announcements.Dropped == 0 || st.Announcements.Contacted != 0 {
		t.Fatalf("after the drops: known %d, contacted %d, dropped %d", st.Mesh.PeersKnown, st.Announcements.Contacted, st.Announcements.Dropped)
	}

	// An empty caps-sync request to the victim is answered with its own vector and the honest
	// peer's: nothing it has not been connected to.
	s, err := att.NewStream(ctx, victim.ID(), announce.SyncProtocol(node.DefaultMesh))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Reset()
	s.CloseWrite()
	r := frame.NewReader(s, caps.MaxEncodedSize)
	got := 0
	for {
		if _, err := r.Next(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		got++
	}
	if got != 2 {
		t.Fatalf("the victim's sync answer holds %d vectors, want 2 (its own and the honest peer's)", got)
	}
	t.Logf("figure F11: made-up identities handed over by sync: the victim's sync answer holds %d vectors (its own and the honest peer's), none of the Sybils'", got)
}
