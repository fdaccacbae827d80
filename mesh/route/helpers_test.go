package route

import (
	"crypto/rand"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/reputation"
)

var now = time.UnixMilli(1_800_000_000_000)

func newPeer(t testing.TB) peer.ID {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func newStore(t testing.TB, mutate ...func(*reputation.Params)) *reputation.Store {
	t.Helper()
	p := reputation.DefaultParams()
	for _, m := range mutate {
		m(&p)
	}
	s, err := reputation.New(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func warm(name string) caps.Model { return caps.Model{Name: name, State: caps.ModelWarm} }
func cold(name string) caps.Model { return caps.Model{Name: name, State: caps.ModelCold} }

// entry is a registry entry for p: fresh, accepting, serving models.
func entry(p peer.ID, models ...caps.Model) registry.Entry {
	v := &caps.Vector{PeerID: p.String(), Load: caps.Load{Accepting: true}, Models: models}
	return registry.Entry{Peer: p, Vector: v, LastSeen: now}
}

// fleet names peers for tests: "a", "b", ... and renders attempts with those names.
type fleet struct {
	ids   map[string]peer.ID
	names map[peer.ID]string
}

func newFleet(t testing.TB, names ...string) *fleet {
	f := &fleet{ids: map[string]peer.ID{}, names: map[peer.ID]string{}}
	for _, n := range names {
		id := newPeer(t)
		f.ids[n], f.names[id] = id, n
	}
	return f
}

func (f *fleet) id(name string) peer.ID { return f.ids[name] }
func (f *fleet) key(name string) string { return f.ids[name].String() }

// peer is a Peer named name, serving models, RTT 10 ms.
func (f *fleet) peer(name string, models ...caps.Model) Peer {
	return Peer{Entry: entry(f.ids[name], models...), RTT: 10 * time.Millisecond}
}

// render writes attempts as "local", "cloud" and "peer:<name>".
func (f *fleet) render(ts []Target) []string {
	out := []string{}
	for _, t := range ts {
		if t.Tier == TierMesh {
			out = append(out, "peer:"+f.names[t.Peer])
			continue
		}
		out = append(out, t.String())
	}
	return out
}

func stale(p Peer) Peer  { p.Entry.Stale = true; return p }
func paused(p Peer) Peer { p.Entry.Vector.Load.Accepting = false; return p }
func full(p Peer) Peer {
	p.Entry.Vector.Load.InFlight, p.Entry.Vector.Load.Capacity = 4, 4
	return p
}
func load(p Peer, inFlight, capacity int) Peer {
	p.Entry.Vector.Load.InFlight, p.Entry.Vector.Load.Capacity = inFlight, capacity
	return p
}

func lw(name string) LocalModel { return LocalModel{Name: name, Warm: true} }
func lc(name string) LocalModel { return LocalModel{Name: name} }

func request(model string, prefs inference.Prefs) *inference.Request {
	return &inference.Request{
		Model:    model,
		Messages: []inference.Message{{Role: inference.RoleUser, Content: "hello"}},
		Prefs:    prefs,
	}
}

func prefs(privacy inference.Privacy, priority inference.Priority, route inference.RouteMode) inference.Prefs {
	return inference.Prefs{Privacy: privacy, Priority: priority, Route: route}
}

func seeded(seed uint64) *mrand.Rand { return mrand.New(mrand.NewPCG(seed, 1)) }

// sameAttempts compares rendered attempts, allowing any order within a run of peers: the
// first mesh target is a weighted random pick, which the mesh-order tests cover.
func sameAttempts(got, want []string) bool {
	norm := func(s []string) []string {
		s = slices.Clone(s)
		for i := 0; i < len(s); {
			j := i
			for j < len(s) && strings.HasPrefix(s[j], "peer:") {
				j++
			}
			if j > i {
				slices.Sort(s[i:j])
				i = j
				continue
			}
			i++
		}
		return s
	}
	return slices.Equal(norm(got), norm(want))
}
