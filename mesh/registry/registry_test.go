package registry

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

var t0 = time.UnixMilli(1_800_000_000_000)

func newPeer(t *testing.T) peer.ID {
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

func vec(p peer.ID, seq uint64) *caps.Vector {
	return &caps.Vector{PeerID: p.String(), Seq: seq, Models: []caps.Model{{Name: "m", State: caps.ModelWarm}}}
}

func TestPutKeepsOnlyNewerSeq(t *testing.T) {
	r := New(ParamsForHeartbeat(15 * time.Second))
	p := newPeer(t)
	steps := []struct {
		seq  uint64
		want bool
	}{{5, true}, {5, false}, {4, false}, {6, true}, {1, false}}
	for i, s := range steps {
		if got := r.Put(p, vec(p, s.seq), t0.Add(time.Duration(i)*time.Second)); got != s.want {
			t.Fatalf("step %d: Put(seq %d) = %v, want %v", i, s.seq, got, s.want)
		}
	}
	e, ok := r.Get(p, t0)
	if !ok || e.Vector.Seq != 6 {
		t.Fatalf("Get = %+v, %v; want seq 6", e, ok)
	}
	if !e.FirstSeen.Equal(t0) || !e.LastSeen.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("first %v last %v: want first at step 0 and last at the accepted step 3", e.FirstSeen, e.LastSeen)
	}
}

func TestStaleThenForgotten(t *testing.T) {
	hb := 15 * time.Second
	r := New(ParamsForHeartbeat(hb))
	p := newPeer(t)
	r.Put(p, vec(p, 1), t0)
	stale := 2*hb + time.Second
	cases := []struct {
		at        time.Duration
		wantStale bool
		wantKnown bool
	}{
		{0, false, true},
		{stale - time.Millisecond, false, true},
		{stale, true, true},
		{2*stale - time.Millisecond, true, true},
		{2 * stale, false, false},
	}
	for _, c := range cases {
		now := t0.Add(c.at)
		r.Sweep(now)
		e, ok := r.Get(p, now)
		if ok != c.wantKnown || (ok && e.Stale != c.wantStale) {
			t.Fatalf("at +%v: known %v stale %v; want known %v stale %v", c.at, ok, e.Stale, c.wantKnown, c.wantStale)
		}
	}
}

func TestSetConnectedOnlyForKnownPeers(t *testing.T) {
	r := New(ParamsForHeartbeat(time.Second))
	p := newPeer(t)
	r.SetConnected(p, true)
	if r.Len() != 0 {
		t.Fatal("a connection alone made a peer known")
	}
	r.Put(p, vec(p, 1), t0)
	r.SetConnected(p, true)
	if e, _ := r.Get(p, t0); !e.Connected {
		t.Fatal("want connected")
	}
	r.SetConnected(p, false)
	if e, _ := r.Get(p, t0); e.Connected {
		t.Fatal("want disconnected")
	}
}

func TestCapEvictsLongestSilent(t *testing.T) {
	r := New(Params{StaleAfter: time.Minute, ForgetAfter: time.Hour, Cap: 3})
	var ids []peer.ID
	for i := range 4 {
		p := newPeer(t)
		ids = append(ids, p)
		r.Put(p, vec(p, 1), t0.Add(time.Duration(i)*time.Second))
	}
	if r.Len() != 3 {
		t.Fatalf("len %d, want cap 3", r.Len())
	}
	if _, ok := r.Get(ids[0], t0); ok {
		t.Fatal("the longest-silent peer should have been evicted")
	}
	for _, p := range ids[1:] {
		if _, ok := r.Get(p, t0); !ok {
			t.Fatalf("peer %s evicted, want kept", p)
		}
	}
}

func TestReadsAreCopies(t *testing.T) {
	r := New(ParamsForHeartbeat(time.Second))
	p := newPeer(t)
	in := vec(p, 1)
	r.Put(p, in, t0)
	in.Models[0].Name = "changed by the caller after Put"
	e, _ := r.Get(p, t0)
	e.Vector.Models[0].Name = "changed by a reader"
	again, _ := r.Get(p, t0)
	if got := again.Vector.Models[0].Name; got != "m" {
		t.Fatalf("stored model name %q: registry state aliased a caller's vector", got)
	}
	all := r.Entries(t0)
	all[0].Vector.Seq = 99
	if e, _ := r.Get(p, t0); e.Vector.Seq != 1 {
		t.Fatal("Entries aliased internal state")
	}
}

func TestEntriesSortedByPeer(t *testing.T) {
	r := New(ParamsForHeartbeat(time.Second))
	for range 20 {
		p := newPeer(t)
		r.Put(p, vec(p, 1), t0)
	}
	es := r.Entries(t0)
	for i := 1; i < len(es); i++ {
		if es[i-1].Peer >= es[i].Peer {
			t.Fatalf("entries not sorted at %d: %s >= %s", i, es[i-1].Peer, es[i].Peer)
		}
	}
}
