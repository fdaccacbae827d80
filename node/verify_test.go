package node

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/node/dispatch"
)

func TestConfigVerify(t *testing.T) {
	tests := []struct {
		name                string
		sample, probation   float64
		wantSample, wantPro float64
		wantErr             string
	}{
		{"defaults", 0, 0, DefaultVerifySample, DefaultVerifyProbationSample, ""},
		{"every task", 1, 0, 1, DefaultVerifyProbationSample, ""},
		{"off", VerifyOff, 0, VerifyOff, DefaultVerifyProbationSample, ""},
		{"no probation boost", 0.1, VerifyOff, 0.1, VerifyOff, ""},
		{"above one", 1.5, 0, 0, 0, "verification sample"},
		{"negative", -0.5, 0, 0, 0, "verification sample"},
		{"probation above one", 0, 2, 0, 0, "probation verification sample"},
	}
	for _, tt := range tests {
		cfg, err := Config{DataDir: t.TempDir(), VerifySample: tt.sample, VerifyProbationSample: tt.probation}.withDefaults()
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: withDefaults: %v", tt.name, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: withDefaults error %v, want one mentioning %q", tt.name, err, tt.wantErr)
		case err == nil && (cfg.VerifySample != tt.wantSample || cfg.VerifyProbationSample != tt.wantPro):
			t.Errorf("%s: samples %v and %v, want %v and %v", tt.name, cfg.VerifySample, cfg.VerifyProbationSample, tt.wantSample, tt.wantPro)
		}
	}
}

func TestConfigVoters(t *testing.T) {
	cfg, err := Config{DataDir: t.TempDir()}.withDefaults()
	if err != nil || cfg.VoterMinKnown != dispatch.DefaultVoterMinKnown || cfg.VoterMinScore != dispatch.DefaultVoterMinScore {
		t.Fatalf("defaults: voters known %v, score %v (%v); want %v and %v", cfg.VoterMinKnown, cfg.VoterMinScore, err,
			dispatch.DefaultVoterMinKnown, dispatch.DefaultVoterMinScore)
	}
	for _, bad := range []Config{{VoterMinKnown: -time.Minute}, {VoterMinScore: -1}, {VoterMinScore: 100.5}} {
		bad.DataDir = t.TempDir()
		if _, err := bad.withDefaults(); err == nil || !strings.Contains(err.Error(), "voter") {
			t.Errorf("voters known %v, score %v: error %v, want one about voters", bad.VoterMinKnown, bad.VoterMinScore, err)
		}
	}
}

// A peer's address, by which the executor tells verification voters' hosts apart, is the
// remote IP of the connection to it: each side sees the other's own loopback address,
// whichever dialled. A peer without a connection has none.
func TestPeerAddr(t *testing.T) {
	a := startTestNode(t, Config{ListenAddrs: []string{"/ip4/127.0.0.2/tcp/0"}})
	b := startTestNode(t, Config{ListenAddrs: []string{"/ip4/127.0.0.3/tcp/0"}, Bootstrap: []peer.AddrInfo{a.AddrInfo()}})
	within(t, 10*time.Second, "a and b connected, each side", func() bool {
		return a.Host().Network().Connectedness(b.ID()) == network.Connected &&
			b.Host().Network().Connectedness(a.ID()) == network.Connected
	})
	if got, want := a.peerAddr(b.ID()), netip.MustParseAddr("127.0.0.3"); got != want {
		t.Errorf("a sees b (which dialled) at %v, want %v", got, want)
	}
	if got, want := b.peerAddr(a.ID()), netip.MustParseAddr("127.0.0.2"); got != want {
		t.Errorf("b sees a at %v, want %v", got, want)
	}
	c := startTestNode(t, Config{})
	if got := a.peerAddr(c.ID()); got.IsValid() {
		t.Errorf("a sees c, never connected, at %v", got)
	}
}
