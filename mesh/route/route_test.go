package route

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/reputation"
)

var now = time.UnixMilli(1_800_000_000_000)

func newPeer(t *testing.T) peer.ID {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return id
}

func entry(p peer.ID, accepting, stale bool, models ...string) registry.Entry {
	v := &caps.Vector{PeerID: p.String(), Load: caps.Load{Accepting: accepting}}
	for _, m := range models {
		v.Models = append(v.Models, caps.Model{Name: m, State: caps.ModelWarm})
	}
	return registry.Entry{Peer: p, Vector: v, Stale: stale}
}

func TestPlan(t *testing.T) {
	a, b, c, d := newPeer(t), newPeer(t), newPeer(t), newPeer(t)
	rep, err := reputation.New(reputation.DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	entries := []registry.Entry{
		entry(a, true, false, "m1", "m2"),
		entry(b, true, false, "m2"),
		entry(c, false, false, "m2"), // paused: not accepting
		entry(d, true, true, "m2"),   // stale
	}
	str := func(ts []Target) []string {
		var out []string
		for _, t := range ts {
			out = append(out, t.String())
		}
		return out
	}
	cases := []struct {
		name  string
		model string
		local []string
		want  []string
	}{
		{"local first, then peers", "m1", []string{"m1"}, []string{"local", "peer:" + a.String()}},
		{"peers only", "m2", nil, []string{"peer:" + a.String(), "peer:" + b.String()}},
		{"nobody", "m3", []string{"m1"}, nil},
	}
	for _, tc := range cases {
		got := str(Plan(tc.model, tc.local, entries, rep, now))
		if len(got) != len(tc.want) {
			t.Fatalf("%s: got %v, want %v", tc.name, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("%s: got %v, want %v", tc.name, got, tc.want)
			}
		}
	}

	// A peer that just failed is dropped while another can serve.
	rep.Record(reputation.Target{Model: "m2", Peer: a.String()}, reputation.Unavailable, now)
	if got := str(Plan("m2", nil, entries, rep, now)); len(got) != 1 || got[0] != "peer:"+b.String() {
		t.Fatalf("after a's failure: %v, want only b", got)
	}
	// A forged-announcement peer (score under 40) is excluded outright.
	rep.Observe(b.String(), reputation.ForgedAnnouncement, now)
	if got := str(Plan("m2", nil, entries, rep, now)); len(got) != 1 || got[0] != "peer:"+a.String() {
		t.Fatalf("with b excluded and a cooling: %v, want a (explicit routing keeps the model reachable)", got)
	}
}
