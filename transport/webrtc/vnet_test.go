package webrtc

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pion/transport/v3/vnet"
	"github.com/pion/webrtc/v4"
)

// vnetPath is an emulated network between two Transports' WebRTC media: every packet is
// delayed by the router, and a share of them (lossPct percent) dropped. Signaling still
// runs over the real loopback libp2p hosts.
type vnetPath struct {
	a, b    *webrtc.SettingEngine
	na, nb  *vnet.Net // the two ends' networks, 1.2.3.4 and 1.2.3.5
	lossPct atomic.Int32
}

// newVnetPath starts a router delaying each packet by oneWay (RTT 2×oneWay); it stops at
// the end of the test, after the Transports made later are closed.
func newVnetPath(t testing.TB, oneWay time.Duration) *vnetPath {
	t.Helper()
	router, err := vnet.NewRouter(&vnet.RouterConfig{CIDR: "1.2.3.0/24", MinDelay: oneWay, LoggerFactory: loggerFactory{}})
	if err != nil {
		t.Fatal(err)
	}
	path := &vnetPath{}
	router.AddChunkFilter(func(vnet.Chunk) bool {
		p := path.lossPct.Load()
		return p == 0 || rand.Int32N(100) >= p
	})
	engine := func(ip string) (*webrtc.SettingEngine, *vnet.Net) {
		n, err := vnet.NewNet(&vnet.NetConfig{StaticIPs: []string{ip}})
		if err != nil {
			t.Fatal(err)
		}
		if err := router.AddNet(n); err != nil {
			t.Fatal(err)
		}
		se := DefaultSettingEngine()
		se.SetNet(n)
		se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
		se.SetIncludeLoopbackCandidate(false)
		return se, n
	}
	path.a, path.na = engine("1.2.3.4")
	path.b, path.nb = engine("1.2.3.5")
	if err := router.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { router.Stop() })
	return path
}

// Over a 10 ms RTT path, then with 3% of packets lost, streams deliver identical bytes:
// SCTP retransmits.
func TestVnetDelayAndLoss(t *testing.T) {
	path := newVnetPath(t, 5*time.Millisecond)
	p := newPair(t, Config{SettingEngine: path.a}, Config{SettingEngine: path.b})
	p.b.SetStreamHandler(echo)
	ctx := context.Background()

	start := time.Now()
	s, _, err := p.a.OpenStream(ctx, p.hb.ID())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cold set-up over 10 ms RTT: %v", time.Since(start))
	data := randomBytes(t, 512<<10)
	if got := roundTrip(t, s, data); !bytes.Equal(got, data) {
		t.Fatalf("echo over the delayed path differs: %d bytes of %d", len(got), len(data))
	}
	s.Close()

	path.lossPct.Store(3)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Go(func() {
			s, warm, err := p.a.OpenStream(ctx, p.hb.ID())
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			if !warm {
				errs <- fmt.Errorf("stream %d not warm", i)
			}
			data := randomBytes(t, 128<<10)
			if got := roundTrip(t, s, data); !bytes.Equal(got, data) {
				errs <- fmt.Errorf("stream %d: echo over the lossy path differs: %d bytes of %d", i, len(got), len(data))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
