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

// heard is p's vector at seq, delivered by p itself.
func heard(p peer.ID, seq uint64) Heard { return Heard{Vector: vec(p, seq), Via: p} }

func TestPutKeepsOnlyNewerSeq(t *testing.T) {
	r := New(ParamsForHeartbeat(15 * time.Second))
	p := newPeer(t)
	steps := []struct {
		seq  uint64
		want bool
	}{{5, true}, {5, false}, {4, false}, {6, true}, {1, false}}
	for i, s := range steps {
		if got := r.Put(p, heard(p, s.seq), t0.Add(time.Duration(i)*time.Second)) == Stored; got != s.want {
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
	r.Put(p, heard(p, 1), t0)
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
	r.Put(p, heard(p, 1), t0)
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
		r.Put(p, heard(p, 1), t0.Add(time.Duration(i)*time.Second))
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
	r.Put(p, Heard{Vector: in, Via: p}, t0)
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
		r.Put(p, heard(p, 1), t0)
	}
	es := r.Entries(t0)
	for i := 1; i < len(es); i++ {
		if es[i-1].Peer >= es[i].Peer {
			t.Fatalf("entries not sorted at %d: %s >= %s", i, es[i-1].Peer, es[i].Peer)
		}
	}
}

func TestNewIdentitiesAreChargedToTheirSource(t *testing.T) {
	r := New(Params{StaleAfter: time.Minute, PendingCap: 1000})
	src := newPeer(t)
	stored := 0
	for range 100 {
		p := newPeer(t)
		h := Heard{Vector: vec(p, 1), Via: src}
		if r.Admit(p, h, t0) == Stored && r.Put(p, h, t0) == Stored {
			stored++
		}
	}
	if stored != DefaultSourceBurst {
		t.Fatalf("one source brought %d new identities at once, want the burst %d", stored, DefaultSourceBurst)
	}
	if c := r.Counts(); c.OverBudget != 100-DefaultSourceBurst {
		t.Fatalf("over_budget %d, want %d", c.OverBudget, 100-DefaultSourceBurst)
	}
	// Not charged: an author delivering its own vector, a peer connected now, a known peer.
	own := newPeer(t)
	conn := newPeer(t)
	if r.Admit(own, heard(own, 1), t0) != Stored || r.Admit(conn, Heard{Via: src, Connected: true}, t0) != Stored {
		t.Fatal("an author's own vector or a connected peer's was charged to a spent budget")
	}
	// Another source has its own budget; the spent one refills at one per SourceRefill.
	other := newPeer(t)
	if p := newPeer(t); r.Admit(p, Heard{Via: other}, t0) != Stored {
		t.Fatal("a second source was refused for the first one's spending")
	}
	p := newPeer(t)
	if r.Admit(p, Heard{Via: src}, t0.Add(DefaultSourceRefill-time.Millisecond)) != OverBudget {
		t.Fatal("admitted before a token refilled")
	}
	if r.Admit(p, Heard{Via: src}, t0.Add(DefaultSourceRefill)) != Stored {
		t.Fatal("refused after a token refilled")
	}
}

func TestPendingPeersNeverDisplaceContactedOnes(t *testing.T) {
	r := New(Params{StaleAfter: time.Minute, ForgetAfter: time.Hour, Cap: 4, PendingCap: 2})
	var contacted []peer.ID
	for i := range 2 {
		p := newPeer(t)
		contacted = append(contacted, p)
		if res := r.Put(p, Heard{Vector: vec(p, 1), Via: p, Connected: true}, t0.Add(time.Duration(i)*time.Second)); res != Stored {
			t.Fatalf("connected peer: %v", res)
		}
	}
	r.SetConnected(contacted[0], false) // contacted, not connected now: still not displaced
	// Pending newcomers fill PendingCap, then displace each other (longest silent first).
	var pending []peer.ID
	for i := range 5 {
		p := newPeer(t)
		pending = append(pending, p)
		if res := r.Put(p, heard(p, 1), t0.Add(time.Duration(10+i)*time.Second)); res != Stored {
			t.Fatalf("pending %d: %v", i, res)
		}
	}
	if r.Len() != 4 || !r.Pending(pending[3]) || !r.Pending(pending[4]) {
		t.Fatalf("len %d; want the 2 contacted and the 2 newest pending peers", r.Len())
	}
	for _, p := range contacted {
		if e, ok := r.Get(p, t0); !ok || !e.Contacted || r.Pending(p) {
			t.Fatalf("contacted peer %s displaced or pending (%+v, %v)", p, e, ok)
		}
	}
	// Contacting the pending peers fills the registry with contacted ones: a pending
	// newcomer finds no room.
	r.SetConnected(pending[3], true)
	r.SetConnected(pending[4], true)
	if p := newPeer(t); r.Put(p, heard(p, 1), t0.Add(time.Minute)) != Full {
		t.Fatal("a pending newcomer displaced a contacted peer")
	}
	// A connected newcomer displaces the longest-silent peer not connected now.
	p := newPeer(t)
	if res := r.Put(p, Heard{Vector: vec(p, 1), Via: p, Connected: true}, t0.Add(time.Minute)); res != Stored {
		t.Fatalf("connected newcomer: %v", res)
	}
	if _, ok := r.Get(contacted[0], t0); ok {
		t.Fatal("the disconnected contacted peer should have made way for a connected newcomer")
	}
	// Every peer connected: nothing makes way.
	if q := newPeer(t); r.Put(q, Heard{Vector: vec(q, 1), Via: q, Connected: true}, t0.Add(time.Minute)) != Full {
		t.Fatal("a connected peer was displaced")
	}
}

func TestUnreachablePeersAreRefusedForAWhile(t *testing.T) {
	r := New(Params{StaleAfter: time.Minute, UnreachableFor: 10 * time.Minute})
	p := newPeer(t)
	r.Put(p, heard(p, 1), t0)
	r.Unreachable(p, t0)
	if r.Len() != 0 {
		t.Fatal("an unreachable pending peer was kept")
	}
	if res := r.Put(p, heard(p, 2), t0.Add(time.Minute)); res != Unreachable {
		t.Fatalf("vector of an unreachable peer: %v, want unreachable", res)
	}
	if res := r.Admit(p, heard(p, 2), t0.Add(time.Minute)); res != Unreachable {
		t.Fatalf("Admit: %v, want unreachable", res)
	}
	if res := r.Put(p, Heard{Vector: vec(p, 2), Via: p, Connected: true}, t0.Add(time.Minute)); res != Stored {
		t.Fatalf("a peer that connected to us is refused: %v", res)
	}
	q := newPeer(t)
	r.Put(q, heard(q, 1), t0)
	r.Unreachable(q, t0)
	if res := r.Put(q, heard(q, 2), t0.Add(10*time.Minute)); res != Stored {
		t.Fatalf("after UnreachableFor: %v, want stored", res)
	}
	// A contacted peer is not dropped for one failed contact.
	r.SetConnected(p, false)
	r.Unreachable(p, t0.Add(time.Minute))
	if _, ok := r.Get(p, t0); !ok {
		t.Fatal("a contacted peer was dropped as unreachable")
	}
}

func TestWireServesContactedFreshPeersWithinBounds(t *testing.T) {
	r := New(Params{StaleAfter: time.Minute})
	wire := func(n int) []byte { return make([]byte, n) }
	var ids []peer.ID
	for i := range 4 {
		p := newPeer(t)
		ids = append(ids, p)
		r.Put(p, Heard{Vector: vec(p, 1), Wire: wire(100), Via: p, Connected: i > 0}, t0)
	}
	// ids[0] pending: never served. ids[1..3] contacted.
	if got := r.Wire(t0, "", 10, 1<<20); len(got) != 3 {
		t.Fatalf("served %d vectors, want the 3 contacted ones", len(got))
	}
	if got := r.Wire(t0, ids[1], 10, 1<<20); len(got) != 2 {
		t.Fatalf("served %d vectors, want 2 (the asker's own left out)", len(got))
	}
	if got := r.Wire(t0, "", 10, 250); len(got) != 2 {
		t.Fatalf("served %d vectors within 250 bytes, want 2", len(got))
	}
	if got := r.Wire(t0, "", 1, 1<<20); len(got) != 1 {
		t.Fatalf("served %d vectors, want at most 1", len(got))
	}
	if got := r.Wire(t0.Add(time.Minute), "", 10, 1<<20); len(got) != 0 {
		t.Fatalf("served %d stale vectors", len(got))
	}
}

func TestSweepReportsTheLastSeq(t *testing.T) {
	r := New(Params{StaleAfter: time.Second, ForgetAfter: time.Second})
	p := newPeer(t)
	r.Put(p, heard(p, 7), t0)
	gone := r.Sweep(t0.Add(time.Second))
	if len(gone) != 1 || gone[0] != (Gone{Peer: p, Seq: 7}) {
		t.Fatalf("Sweep = %v, want %s at seq 7", gone, p)
	}
}
