package webrtc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/pion/webrtc/v4"

	"github.com/meshinfer/meshinfer/internal/frame"
)

// Tests of the remote candidates a peer may give (issue 19): capped, trickled or embedded,
// and filtered by address.

func TestCheckCandidate(t *testing.T) {
	for _, tc := range []struct {
		line string
		ok   bool
	}{
		{"candidate:1 1 udp 2130706431 127.0.0.1 5000 typ host", true},
		{"a=candidate:1 1 udp 2130706431 127.0.0.1 5000 typ host", true},
		{"candidate:1 1 udp 2130706431 192.168.1.7 5000 typ host", true},
		{"candidate:1 1 udp 2130706431 10.1.2.3 5000 typ host", true},
		{"candidate:1 1 udp 2130706431 fd00::7 5000 typ host", true},
		{"candidate:1 1 udp 2130706431 ::1 5000 typ host", true},
		{"candidate:1 1 udp 1694498815 203.0.113.9 41000 typ srflx raddr 10.0.0.2 rport 5000", true},
		{"candidate:1 1 udp 2130706431 127.0.0.1 0 typ host", false},      // port 0
		{"candidate:1 1 udp 2130706431 0.0.0.0 5000 typ host", false},     // unspecified
		{"candidate:1 1 udp 2130706431 :: 5000 typ host", false},          // unspecified
		{"candidate:1 1 udp 2130706431 0.1.2.3 5000 typ host", false},     // this network
		{"candidate:1 1 udp 2130706431 239.1.2.3 5000 typ host", false},   // multicast
		{"candidate:1 1 udp 2130706431 224.0.0.251 5353 typ host", false}, // link-local multicast
		{"candidate:1 1 udp 2130706431 ff02::1 5000 typ host", false},     // link-local multicast
		{"candidate:1 1 udp 2130706431 ff0e::1 5000 typ host", false},     // global multicast
		{"candidate:1 1 udp 2130706431 255.255.255.255 5000 typ host", false},
		{"candidate:1 1 udp 2130706431 250.1.2.3 5000 typ host", false},        // reserved
		{"candidate:1 1 udp 2130706431 169.254.169.254 80 typ host", false},    // link-local: metadata
		{"candidate:1 1 udp 2130706431 fe80::1 5000 typ host", false},          // link-local
		{"candidate:1 1 udp 2130706431 ::ffff:239.1.2.3 5000 typ host", false}, // mapped multicast
		{"candidate:1 1 udp 2130706431 f3a1c2d4-0000.local 5000 typ host", false},
		{"candidate:1 1 udp 1694498815 example.com 5000 typ srflx raddr 0.0.0.0 rport 0", false},
		{"candidate:1 1 udp 2130706431 127.0.0.1 5000 typ nonsense", false},
		{"candidate:garbage", false},
		{"hello", false},
	} {
		err := checkCandidate(tc.line)
		if (err == nil) != tc.ok {
			t.Errorf("%q: %v, want ok %v", tc.line, err, tc.ok)
		}
		if err != nil && !errors.Is(err, errRefusedCandidate) {
			t.Errorf("%q: %v, want errRefusedCandidate", tc.line, err)
		}
	}
}

// withCandidates returns sdp with the candidate lines added at its end (in its last media
// section), as a peer that does not trickle would send them.
func withCandidates(sdp string, lines ...string) string {
	var b strings.Builder
	b.WriteString(sdp)
	for _, l := range lines {
		b.WriteString("a=" + l + "\r\n")
	}
	return b.String()
}

// candidateLines returns n distinct candidate lines on loopback: usable ones, so that only
// their count can refuse them.
func candidateLines(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("candidate:%d 1 udp 1 127.0.0.1 %d typ host", i, 10000+i)
	}
	return out
}

func TestSanitizeSDP(t *testing.T) {
	base := "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"
	good := "candidate:1 1 udp 2130706431 127.0.0.1 5000 typ host"
	bad := "candidate:2 1 udp 2130706431 239.1.2.3 5000 typ host"
	got, n, err := sanitizeSDP(withCandidates(base, good, bad, good), MaxCandidates)
	if err != nil || n != 3 || got != withCandidates(base, good, good) {
		t.Fatalf("sanitize: %d candidates, %v:\n%s", n, err, got)
	}
	if got, n, err := sanitizeSDP(base, 0); err != nil || n != 0 || got != base {
		t.Fatalf("no candidates: %d, %v:\n%s", n, err, got)
	}
	// LF line endings are kept as they are.
	lf := strings.ReplaceAll(withCandidates(base, good, bad), "\r\n", "\n")
	if got, _, err := sanitizeSDP(lf, MaxCandidates); err != nil || got != strings.ReplaceAll(withCandidates(base, good), "\r\n", "\n") {
		t.Fatalf("LF endings: %v:\n%q", err, got)
	}
	// Refused ones count too: the budget is of lines, not of those kept.
	if _, _, err := sanitizeSDP(withCandidates(base, bad, bad, good), 2); !errors.Is(err, errSignalMessage) {
		t.Fatalf("3 candidates with a budget of 2: %v, want errSignalMessage", err)
	}
}

// An offer that embeds more than MaxCandidates candidates in its SDP (as many as fit in
// MaxSDP, then 1,000, which do not fit) is refused: the stream is reset before any
// PeerConnection is made, over SignalID and relayed alike. Exactly MaxCandidates pass.
func TestOfferWithEmbeddedCandidatesOverTheCap(t *testing.T) {
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	var seen observed
	cfg := accepting()
	cfg.Observer = &seen
	b := newTransport(t, hb, cfg)
	offer := testOffer(t)
	fit := 0 // how many candidate lines fit in MaxSDP
	for len(withCandidates(offer, candidateLines(fit+1)...)) <= MaxSDP {
		fit++
	}
	if fit <= 2*MaxCandidates {
		t.Fatalf("only %d candidates fit in an offer: the test shows nothing", fit)
	}
	for _, n := range []int{MaxCandidates + 1, fit, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			waitSetupsDone(t, b)
			sdp := withCandidates(offer, candidateLines(n)...)
			before := len(seen.events()) // before the offer: the stage may judge it at once
			st, err := ha.NewStream(context.Background(), hb.ID(), SignalID)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Reset()
			st.SetDeadline(time.Now().Add(10 * time.Second))
			// An offer over the frame bound may be refused (the stream reset) while it is
			// still being written: then the write fails, and the read below sees the reset.
			frame.Write(st, encodeSignal(sigOffer, sdp))
			if body, err := frame.NewReader(st, maxSignalFrame).Next(); err == nil || errors.Is(err, io.EOF) || isTimeout(err) {
				t.Fatalf("read %q, %v; want the stream reset before any answer", body, err)
			}
			// The offering peer's violation is in its score.
			waitFor(t, "the violation recorded", func() bool { return len(seen.events()) > before })
			if got := seen.events()[before]; !strings.HasPrefix(got, ha.ID().String()+" ") {
				t.Fatalf("recorded %q, want a violation of the offering peer %s", got, ha.ID())
			}
			client, server := relayPipe(t, ha, hb)
			client.SetDeadline(time.Now().Add(10 * time.Second))
			if err := frame.Write(client, encodeSignal(sigOffer, sdp)); err != nil {
				t.Fatal(err)
			}
			if _, _, err := b.AcceptRelayed(context.Background(), ha.ID(), recv(t, server)); !errors.Is(err, ErrSignaling) {
				t.Fatalf("relayed: %v, want ErrSignaling", err)
			}
			if st := b.Stats(); st != (Stats{}) {
				t.Fatalf("stats %+v, want untouched", st)
			}
		})
	}
	// At the cap the offer is answered.
	waitSetupsDone(t, b)
	st, err := ha.NewStream(context.Background(), hb.ID(), SignalID)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Reset()
	st.SetDeadline(time.Now().Add(10 * time.Second))
	if err := frame.Write(st, encodeSignal(sigOffer, withCandidates(offer, candidateLines(MaxCandidates)...))); err != nil {
		t.Fatal(err)
	}
	body, err := frame.NewReader(st, maxSignalFrame).Next()
	if err != nil || len(body) == 0 || body[0] != sigAnswer {
		t.Fatalf("offer with %d candidates: %q, %v; want an answer", MaxCandidates, body, err)
	}
}

// tamperedSignal is the offerer's signaling stream with its first frame, the offer,
// rewritten by offer, and the frames of after sent right behind it (before the offerer's
// own candidates).
type tamperedSignal struct {
	SignalStream
	offer func(sdp string) string
	after [][]byte
	sent  bool
}

func (s *tamperedSignal) Write(p []byte) (int, error) {
	if s.sent {
		return s.SignalStream.Write(p)
	}
	s.sent = true
	body, err := frame.ReadOne(bytes.NewReader(p), len(p))
	if err != nil || body[0] != sigOffer {
		return 0, fmt.Errorf("first frame %q: %v, want the offer", body, err)
	}
	out := frame.Append(nil, encodeSignal(sigOffer, s.offer(string(body[1:]))))
	for _, f := range s.after {
		out = frame.Append(out, f)
	}
	if _, err := s.SignalStream.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// remoteCandidates returns the addresses of the remote candidates pc's ICE agent holds.
func remoteCandidates(pc *webrtc.PeerConnection) []string {
	var out []string
	for _, s := range pc.GetStats() {
		if c, ok := s.(webrtc.ICECandidateStats); ok && c.Type == webrtc.StatsTypeRemoteCandidate {
			out = append(out, c.IP)
		}
	}
	return out
}

// Candidates a peer gives at addresses of the classes refused (multicast, broadcast,
// link-local, port 0), trickled or embedded in its offer, never reach the answerer's ICE
// agent, while its real ones do and the set-up succeeds.
func TestRefusedCandidatesNotUsed(t *testing.T) {
	p := newPair(t, *loopbackEngine(), *loopbackEngine())
	conns := make(chan *peerConn, 1)
	p.b.SetStreamHandler(func(_ peer.ID, s Stream) {
		conns <- s.(*stream).c // the answerer's PeerConnection, once its first stream is up
		echo(peer.ID(""), s)
	})
	embedded := []string{
		"candidate:7 1 udp 2130706431 239.7.7.7 5000 typ host",
		"candidate:8 1 udp 2130706431 169.254.169.254 5000 typ host",
	}
	trickled := []string{
		"candidate:9 1 udp 2130706431 224.0.0.9 5000 typ host",
		"candidate:10 1 udp 2130706431 255.255.255.255 5000 typ host",
		"candidate:11 1 udp 2130706431 127.0.0.1 0 typ host",
	}
	refused := []string{"239.7.7.7", "169.254.169.254", "224.0.0.9", "255.255.255.255"}
	var after [][]byte
	for _, c := range trickled {
		after = append(after, encodeSignal(sigCandidate, c))
	}
	st, err := p.ha.NewStream(context.Background(), p.hb.ID(), SignalID)
	if err != nil {
		t.Fatal(err)
	}
	sig := &tamperedSignal{SignalStream: st, offer: func(sdp string) string { return withCandidates(sdp, embedded...) }, after: after}
	st.SetDeadline(time.Now().Add(p.a.cfg.ConnectTimeout))
	c, err := p.a.newPeerConn(p.hb.ID(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close(ErrClosed)
	s, err := p.a.offer(context.Background(), c, sig, false)
	if err != nil {
		t.Fatal("set-up:", err)
	}
	if got := roundTrip(t, s, []byte("hello")); string(got) != "hello" {
		t.Fatalf("echo %q", got)
	}
	s.Close()
	// The refused candidates came before the offerer's own, which ICE connected with: had
	// they been added, the agent would hold them now.
	got := remoteCandidates(recv(t, conns).pc)
	if len(got) == 0 {
		t.Fatal("the answerer's agent holds no remote candidate: the check shows nothing")
	}
	for _, ip := range got {
		a, err := netip.ParseAddr(ip)
		if err != nil || !usableAddr(a) {
			t.Errorf("the answerer's agent holds a remote candidate at %q", ip)
		}
		for _, r := range refused {
			if ip == r {
				t.Errorf("the answerer's agent holds the refused candidate %s", ip)
			}
		}
	}
	t.Logf("remote candidates the answerer holds: %v", got)
}

// Trickled candidates past MaxCandidates, counted with those embedded in the offer, are a
// violation: the answerer resets the stream (long before its ConnectTimeout). Up to
// MaxCandidates in all, it answers and waits for ICE.
func TestTrickledCandidatesCountWithEmbedded(t *testing.T) {
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	cfg := accepting()
	cfg.ConnectTimeout = time.Minute // a reset within the test is the violation's
	b := newTransport(t, hb, cfg)
	offer := testOffer(t)
	for _, n := range []int{MaxCandidates, MaxCandidates + 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			waitSetupsDone(t, b) // the last subtest's stream reset
			st, err := ha.NewStream(context.Background(), hb.ID(), SignalID)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Reset()
			st.SetDeadline(time.Now().Add(30 * time.Second))
			lines := candidateLines(n)
			half := MaxCandidates / 2
			msgs := frame.Append(nil, encodeSignal(sigOffer, withCandidates(offer, lines[:half]...)))
			for _, l := range lines[half:] {
				msgs = frame.Append(msgs, encodeSignal(sigCandidate, l))
			}
			if _, err := st.Write(msgs); err != nil {
				t.Fatal(err)
			}
			// The answer may be lost to the reset: read until either.
			r := frame.NewReader(st, maxSignalFrame)
			for {
				body, err := r.Next()
				switch {
				case err == nil && body[0] == sigAnswer && n <= MaxCandidates:
					return // answered; its ICE checks would go to the candidates
				case err == nil && body[0] != sigOffer:
					continue
				case err != nil && n > MaxCandidates && !errors.Is(err, io.EOF) && !isTimeout(err):
					return // reset
				}
				t.Fatalf("%d candidates: read %q, %v", n, body, err)
			}
		})
	}
}

// Whatever the remote's description, sanitizeSDP keeps every line that is not a candidate
// as it was, in order, and only candidates checkCandidate passes, never more than the
// budget.
func FuzzSanitizeSDP(f *testing.F) {
	f.Add(withCandidates(testOffer(f), "candidate:1 1 udp 1 127.0.0.1 5000 typ host", "candidate:2 1 udp 1 239.0.0.1 5000 typ host"), 32)
	f.Add("a=candidate:1 1 udp 1 10.0.0.1 1 typ host\na=candidate:x\r\n", 1)
	f.Add("a=candidate:", 0)
	f.Fuzz(func(t *testing.T, sdp string, budget int) {
		budget %= 2 * MaxCandidates
		out, n, err := sanitizeSDP(sdp, budget)
		if err != nil {
			if n <= budget {
				t.Fatalf("refused %d candidates with a budget of %d: %v", n, budget, err)
			}
			return
		}
		var others []string
		kept := 0
		for line := range strings.Lines(out) {
			if strings.HasPrefix(line, "a=candidate:") {
				kept++
				if err := checkCandidate(strings.TrimRight(line, "\r\n")); err != nil {
					t.Fatalf("kept %q: %v", line, err)
				}
				continue
			}
			others = append(others, line)
		}
		var want []string
		for line := range strings.Lines(sdp) {
			if !strings.HasPrefix(line, "a=candidate:") {
				want = append(want, line)
			}
		}
		if kept > n || n > max(budget, 0) || !slices.Equal(others, want) {
			t.Fatalf("kept %d of %d (budget %d); other lines %q, want %q", kept, n, budget, others, want)
		}
	})
}
