package node

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/meshinfer/meshinfer/mesh/participation"
)

// startTestNode starts a node on loopback (127.0.0.1 unless cfg listens elsewhere) with a
// fresh identity, no console, its API on a
// random port and, unless cfg says otherwise, consent to everything; closed when the test
// ends.
func startTestNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Identity, cfg.Loopback = key, true
	if len(cfg.ListenAddrs) == 0 {
		cfg.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	}
	cfg.ConsoleAddr, cfg.APIAddr = ConsoleOff, "127.0.0.1:0"
	if cfg.Consent == nil && cfg.DataDir == "" { // with a data dir, consent.json decides
		cfg.Consent = &participation.Consent{Version: participation.ConsentVersion, RunLocal: true, Contribute: true,
			CloudFallback: true, BatteryFloor: participation.DefaultBatteryFloor}
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// within waits until cond holds, polling every 10 ms, and fails the test naming what it
// waited for when d passes first. d only bounds a failure: a passing test waits for cond.
func within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
