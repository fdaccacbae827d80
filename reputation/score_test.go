package reputation

import (
	"fmt"
	"math"
	"testing"
	"time"
)

func TestNewPeerIsNeutralAndReadsDoNotCreate(t *testing.T) {
	s := newStore(t)
	if got := s.Score("stranger", t0); got != NeutralScore {
		t.Fatalf("score of unknown peer = %v, want %v", got, NeutralScore)
	}
	if got := s.Performance("stranger", t0); got != 1 {
		t.Fatalf("performance of unknown peer = %v, want 1", got)
	}
	if s.Excluded("stranger", t0) {
		t.Fatalf("unknown peer excluded")
	}
	if got := s.Stats(t0).Peers; got != 0 {
		t.Fatalf("reads created %d entries", got)
	}
}

// makeReference gives the store a yardstick: two peers at 100 ms and 50 tokens/s.
func makeReference(s *Store, now time.Time) {
	for range 20 {
		s.RecordPerformance("ref1", 100*time.Millisecond, 50, now)
		s.RecordPerformance("ref2", 100*time.Millisecond, 50, now)
	}
}

func TestAvailabilityAndPerformanceAloneNeverExclude(t *testing.T) {
	s := newStore(t)
	now := t0
	makeReference(s, now)
	for range 200 {
		s.Record(Target{"m", "flaky"}, Timeout, now)
		s.Record(Target{"m", "flaky"}, Unavailable, now)
		s.Observe("flaky", HeartbeatMissed, now)
		s.RecordPerformance("flaky", 90*time.Second, 0.01, now)
		now = now.Add(time.Second)
	}
	if got := s.Score("flaky", now); got != DefaultAvailabilityFloor {
		t.Fatalf("score = %v, want the availability floor %v", got, DefaultAvailabilityFloor)
	}
	if s.Excluded("flaky", now) {
		t.Fatalf("availability and performance signals excluded a peer")
	}
	// Samples a second apart keep confidence just under full.
	if got, want := s.Performance("flaky", now), math.Exp2(-DefaultPerformanceRange); math.Abs(got-want) > 0.01*want {
		t.Fatalf("performance factor = %v, want about the bound %v", got, want)
	}
}

func TestPerformanceRelativeAndStaleBoost(t *testing.T) {
	s := newStore(t)
	now := t0
	makeReference(s, now)
	for range 10 {
		s.RecordPerformance("fast", 25*time.Millisecond, 200, now) // 4× on both axes
		s.RecordPerformance("slow", time.Second, 5, now)           // 10× worse: saturates
	}
	if got := s.Score("fast", now); got <= NeutralScore+DefaultPerformanceWeight/2 {
		t.Fatalf("fast score = %v, want well above neutral", got)
	}
	if got := s.Performance("fast", now); got <= 2 {
		t.Fatalf("fast performance = %v, want > 2", got)
	}
	if got := s.Score("slow", now); got != DefaultAvailabilityFloor {
		t.Fatalf("slow score = %v, want %v", got, DefaultAvailabilityFloor)
	}
	// Latency-only samples count too.
	s.RecordPerformance("lat-only", 400*time.Millisecond, 0, now)
	if got := s.Performance("lat-only", now); got >= 1 {
		t.Fatalf("slower latency-only peer has factor %v, want < 1", got)
	}
	// Garbage samples are ignored.
	s.RecordPerformance("junk", -time.Second, math.NaN(), now)
	s.RecordPerformance("junk", 0, math.Inf(1), now)
	if got := s.Stats(now).Peers; got != 5 {
		t.Fatalf("peers = %d, want 5 (junk samples must not create entries)", got)
	}
	// No new samples: confidence fades and the slow peer drifts back to par.
	now = now.Add(5 * time.Minute)
	mid := s.Performance("slow", now)
	if mid <= 0.25 || mid >= 1 {
		t.Fatalf("slow factor after 5 min = %v, want between 0.25 and 1", mid)
	}
	now = now.Add(time.Hour)
	if got := s.Performance("slow", now); got != 1 {
		t.Fatalf("slow factor after an hour idle = %v, want 1", got)
	}
	// A fixed peer converges within a handful of samples. Against the reference peers only.
	s.Forget("fast")
	s.Forget("lat-only")
	for range 8 {
		s.RecordPerformance("slow", 100*time.Millisecond, 50, now)
	}
	if got := s.Performance("slow", now); math.Abs(got-1) > 0.05 {
		t.Fatalf("recovered slow peer factor = %v, want about 1", got)
	}
}

func TestIntegrityFailureExcludesAndSticks(t *testing.T) {
	s := newStore(t)
	now := t0
	makeReference(s, now)
	for range 40 {
		s.Record(Target{"m", "liar"}, Success, now)
		s.Observe("liar", VerificationPassed, now)
		s.RecordPerformance("liar", 10*time.Millisecond, 1000, now)
	}
	if got := s.Score("liar", now); got != MaxScore {
		t.Fatalf("score before lying = %v, want %v", got, MaxScore)
	}
	s.Observe("liar", VerificationFailed, now)
	if got := s.Score("liar", now); got >= ExcludeBelow || !s.Excluded("liar", now) {
		t.Fatalf("score after one failed verification = %v, want excluded", got)
	}
	// Sticky: still out an hour later, and well after its good history has aged away.
	for _, after := range []time.Duration{time.Hour, 12 * time.Hour, 24 * time.Hour} {
		if !s.Excluded("liar", now.Add(after)) {
			t.Fatalf("liar back after %v (score %v)", after, s.Score("liar", now.Add(after)))
		}
	}
	// But not forever: an honest peer wrongly flagged once recovers without an operator.
	if s.Excluded("liar", now.Add(48*time.Hour)) {
		t.Fatalf("still excluded after 48 h (score %v)", s.Score("liar", now.Add(48*time.Hour)))
	}
}

func TestIntegrityEventWeights(t *testing.T) {
	tests := []struct {
		events   []Event
		want     float64
		excluded bool
	}{
		{[]Event{VerificationPassed}, 51.5, false},
		{[]Event{MalformedFrame}, 40, false},
		{[]Event{MalformedFrame, MalformedFrame}, 30, true},
		{[]Event{ForgedAnnouncement}, 0, true},
		{[]Event{VerificationFailed}, 0, true},
		{[]Event{HeartbeatMissed}, 48, false},
		{[]Event{Event(0), Event(99)}, 50, false},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.events), func(t *testing.T) {
			s := newStore(t)
			for _, e := range tc.events {
				s.Observe("p", e, t0)
			}
			if got := s.Score("p", t0); !near(got, tc.want) {
				t.Fatalf("score = %v, want %v", got, tc.want)
			}
			if got := s.Excluded("p", t0); got != tc.excluded {
				t.Fatalf("excluded = %v, want %v", got, tc.excluded)
			}
		})
	}
}

func TestScoreRecoveryByAgeing(t *testing.T) {
	s := newStore(t)
	for range 3 {
		s.Record(Target{"m", "p"}, Timeout, t0)
	}
	if got := s.Score("p", t0); got != DefaultAvailabilityFloor {
		t.Fatalf("score after three timeouts = %v, want %v", got, DefaultAvailabilityFloor)
	}
	// -12 points halve every 10 min: -1.5 after 30 min.
	if got := s.Score("p", t0.Add(30*time.Minute)); !near(got, 48.5) {
		t.Fatalf("score after 30 min = %v, want 48.5", got)
	}
	if got := s.Score("p", t0.Add(3*time.Hour)); got != NeutralScore {
		t.Fatalf("score after 3 h = %v, want %v", got, NeutralScore)
	}
}

func TestDecayIntervalReadsAreConsistent(t *testing.T) {
	s := newStore(t)
	s.Observe("p", HeartbeatMissed, t0)
	a := s.Score("p", t0.Add(400*time.Millisecond))
	b := s.Score("p", t0.Add(800*time.Millisecond))
	if a != b {
		t.Fatalf("reads within one DecayInterval differ: %v vs %v", a, b)
	}
	if s.Excluded("p", t0.Add(800*time.Millisecond)) != (b < ExcludeBelow) {
		t.Fatalf("Excluded disagrees with Score")
	}
	// Ageing is exact however it is chunked: an event forces it to the event's time.
	s.Observe("q", HeartbeatMissed, t0)
	s.Observe("q", VerificationPassed, t0.Add(10*time.Minute))
	want := NeutralScore + DefaultHeartbeatMissedWeight/2 + DefaultVerifyPassedWeight
	if got := s.Score("q", t0.Add(10*time.Minute)); !near(got, want) {
		t.Fatalf("score = %v, want %v", got, want)
	}
}

func TestScoresSurviveAbsenceAndForget(t *testing.T) {
	s := newStore(t)
	for range 10 {
		s.Record(Target{"m", "honest"}, Success, t0)
	}
	s.Observe("cheat", ForgedAnnouncement, t0)
	// Still known after a disconnect and reconnect within the retain period: nothing resets.
	if got := s.Score("honest", t0.Add(time.Minute)); got <= NeutralScore {
		t.Fatalf("honest score after a minute = %v, want above neutral", got)
	}
	// After Retain, Prune forgets the honest peer but not the one with an integrity debit.
	later := t0.Add(DefaultRetain + time.Minute)
	s.Prune(later)
	if st := s.Stats(later); st.Peers != 1 || st.ExcludedPeers != 1 {
		t.Fatalf("stats after prune %+v, want only the cheat left, excluded", st)
	}
	s.Forget("cheat")
	if got := s.Score("cheat", later); got != NeutralScore {
		t.Fatalf("score after Forget = %v, want %v", got, NeutralScore)
	}
}

// A peer that left is forgotten whole, health and score, once nothing has happened to it
// for Retain, although its residual penalty has not decayed yet (docs/reliability.md F19);
// a peer owing an integrity debit keeps its score, and a cooling record stays until its
// cooldown ends.
func TestPruneForgetsAPeerThatLeft(t *testing.T) {
	const retain = 2 * time.Minute
	s := newStore(t, func(p *Params) { p.Retain = retain })
	gone, liar, stays := Target{"m", "gone"}, Target{"m", "liar"}, Target{"m", "stays"}
	s.Record(gone, Success, t0)
	s.Record(gone, Timeout, t0.Add(time.Second)) // its last attempt, as it left
	s.Record(liar, Timeout, t0.Add(time.Second))
	s.Observe(liar.Peer, VerificationFailed, t0.Add(time.Second))
	s.Prune(t0.Add(time.Minute))
	if !s.Knows(gone.Peer) || !s.Knows(liar.Peer) {
		t.Fatal("a peer forgotten before Retain")
	}
	later := t0.Add(time.Second + retain)
	s.Record(stays, Success, later)
	if st, ok := s.TargetHealth(gone, later); !ok || st.Penalty == 0 {
		t.Fatalf("gone's health %+v %v: want a residual penalty still, so that Retain is what drops it", st, ok)
	}
	s.Prune(later)
	if s.Knows(gone.Peer) {
		t.Fatal("a peer untouched for Retain is still known")
	}
	if _, ok := s.TargetHealth(liar, later); ok || !s.Excluded(liar.Peer, later) {
		t.Fatal("the liar: want its health record gone and its integrity debit kept")
	}
	if !s.Knows(stays.Peer) {
		t.Fatal("a peer touched now was forgotten")
	}

	// Retain shorter than a cooldown: the cooling record stays until the cooldown ends.
	s = newStore(t, func(p *Params) { p.Retain = 0 })
	s.Record(gone, Timeout, t0)
	if s.Prune(t0.Add(DefaultCooldownBase / 2)); !s.Knows(gone.Peer) {
		t.Fatal("a cooling target forgotten")
	}
	if s.Prune(t0.Add(DefaultCooldownBase)); s.Knows(gone.Peer) {
		t.Fatal("a target whose cooldown ended still known with Retain 0")
	}
}

func TestPeerStoreBoundedKeepsIntegrityDebits(t *testing.T) {
	const maxEntries = 8
	s := newStore(t, func(p *Params) { p.MaxEntries = maxEntries })
	now := t0
	liars := []string{"liar0", "liar1", "liar2"}
	for _, l := range liars {
		s.Observe(l, VerificationFailed, now)
	}
	for i := range 200 {
		now = now.Add(time.Millisecond)
		s.Record(Target{"m", fmt.Sprintf("peer%d", i)}, Success, now)
		if st := s.Stats(now); st.Peers > maxEntries {
			t.Fatalf("after %d peers: %d entries, cap %d", i+1, st.Peers, maxEntries)
		}
	}
	for _, l := range liars {
		if !s.Excluded(l, now) {
			t.Fatalf("%s was evicted (score %v) while ordinary peers were available", l, s.Score(l, now))
		}
	}
	if st := s.Stats(now); st.EvictedPeers == 0 {
		t.Fatalf("no evictions recorded past the cap")
	}
}

func TestCandidatesBatch(t *testing.T) {
	s := newStore(t)
	s.Observe("bad", VerificationFailed, t0)
	got := s.Candidates([]string{"bad", "new"}, t0, nil)
	if len(got) != 2 {
		t.Fatalf("got %d candidates, want 2", len(got))
	}
	if got[0].Score >= ExcludeBelow || got[1].Score != NeutralScore || got[1].Performance != 1 || got[1].Spare != 1 {
		t.Fatalf("candidates = %+v", got)
	}
}

func TestWeightCurve(t *testing.T) {
	tests := []struct{ score, want float64 }{
		{math.NaN(), 0},
		{math.Inf(-1), 0},
		{0, 0},
		{39.999, 0},
		{40, 0.1},
		{45, 0.3},
		{50, 0.5},
		{70, 0.75},
		{89.999, 0.5 + 39.999/80},
		{90, 1},
		{100, 1},
	}
	for _, tc := range tests {
		if got := Weight(tc.score); !near(got, tc.want) {
			t.Errorf("Weight(%v) = %v, want %v", tc.score, got, tc.want)
		}
	}
}
