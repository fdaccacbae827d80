package webrtc

import (
	"context"
	"crypto/rand"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"go.uber.org/goleak"

	"github.com/meshinfer/meshinfer/reputation"
)

// TestMain checks that no goroutine outlives the tests. It needs no ignores for pion:
// Transport.Close waits for each PeerConnection's GracefulClose (ICE agent, DTLS, SCTP
// loops) and for its own goroutines, and streams never hand pion a future read deadline
// (whose timer goroutine pion can orphan; see wakeReader).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newHost(t testing.TB) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func connect(t testing.TB, a, b host.Host) {
	t.Helper()
	if err := a.Connect(context.Background(), peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		t.Fatal(err)
	}
}

func newTransport(t testing.TB, h host.Host, cfg Config) *Transport {
	t.Helper()
	tr, err := New(h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// pair is two Transports on two connected loopback hosts, both accepting set-ups.
type pair struct {
	a, b   *Transport
	ha, hb host.Host
}

func newPair(t testing.TB, ca, cb Config) pair {
	t.Helper()
	ha, hb := newHost(t), newHost(t)
	connect(t, ha, hb)
	ca.Accept, cb.Accept = true, true
	return pair{a: newTransport(t, ha, ca), b: newTransport(t, hb, cb), ha: ha, hb: hb}
}

// loopbackEngine is the default engine with candidates on loopback IPv4 only, so tests
// neither touch other interfaces nor wait on them.
func loopbackEngine() *Config {
	se := DefaultSettingEngine()
	se.SetInterfaceFilter(func(name string) bool { return name == "lo" })
	return &Config{SettingEngine: se}
}

// accepting is loopbackEngine's Config with Accept on: a Transport that answers set-ups.
func accepting() Config {
	cfg := *loopbackEngine()
	cfg.Accept = true
	return cfg
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitSetupsDone waits until tr holds no incoming set-up: until the handler of a peer's
// last signaling stream has returned. A peer's next stream sent before then is refused as
// busy (one set-up per peer), a reset that would pass for whatever the test looks for.
func waitSetupsDone(t testing.TB, tr *Transport) {
	t.Helper()
	waitFor(t, "the answerer's set-ups to end", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return len(tr.incoming) == 0
	})
}

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// echo writes back what it reads until the remote's fin, then closes.
func echo(_ peer.ID, s Stream) {
	if _, err := io.Copy(s, s); err != nil {
		s.Reset()
		return
	}
	s.Close()
}

// roundTrip writes data on s (concurrently with reading), ends the write side and returns
// everything read until EOF.
func roundTrip(t testing.TB, s Stream, data []byte) []byte {
	t.Helper()
	werr := make(chan error, 1)
	go func() {
		_, err := s.Write(data)
		if err == nil {
			err = s.CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(s)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	return got
}

// observed is an Observer that keeps what it is told, as "peer event".
type observed struct {
	mu  sync.Mutex
	got []string
}

func (o *observed) Observe(p string, e reputation.Event, _ time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, p+" "+e.String())
}

func (o *observed) events() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.got)
}
