package client_test

import (
	"crypto/rand"
	"runtime"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/infer"
)

// meshFixture is a real coordinator node on loopback, serving no model itself, and peers
// that serve synth-tiny and joined through it: every coordinator request crosses one
// libp2p hop to a peer.
type meshFixture struct {
	coord *node.Node
	peers []*node.Node
	dir   string // the coordinator's data dir (keys, usage)
	key   string
}

// startMesh starts the coordinator and npeers peers and waits until the coordinator holds
// a fresh announcement of every peer. Everything is closed when tb ends.
// idleSessions counts the inference streams (infer.ReuseID) open at the peers: each is a
// handler goroutine waiting for the coordinator's next request on it.
func (f *meshFixture) idleSessions() int {
	n := 0
	for _, p := range f.peers {
		for _, c := range p.Host().Network().Conns() {
			for _, s := range c.GetStreams() {
				if s.Protocol() == infer.ReuseID {
					n++
				}
			}
		}
	}
	return n
}

func startMesh(tb testing.TB, npeers int) *meshFixture {
	tb.Helper()
	f := &meshFixture{dir: tb.TempDir()}
	ks, err := gateway.OpenKeys(f.dir)
	if err != nil {
		tb.Fatal(err)
	}
	if f.key, _, err = ks.Create("load", time.Now()); err != nil {
		tb.Fatal(err)
	}
	f.coord = startNode(tb, node.Config{DataDir: f.dir, Roles: []node.Role{node.RoleCoordinator}})
	for range npeers {
		// The peers' participation rate limit (30 tasks a minute by default) is lifted: the
		// load test is about the gateway's and the peer server's admission, not the owner's.
		noLimit := 0
		f.peers = append(f.peers, startNode(tb, node.Config{Models: []string{testModel},
			Bootstrap:        []peer.AddrInfo{f.coord.AddrInfo()},
			Profile:          participation.ProfilePower,
			ProfileOverrides: participation.Overrides{MaxTasksPerMin: &noLimit}}))
	}
	seen := 0
	if !eventually(20*time.Second, func() bool {
		seen = 0
		for _, p := range f.peers {
			if e, ok := f.coord.Registry().Get(p.ID(), time.Now()); ok && !e.Stale {
				seen++
			}
		}
		return seen == npeers
	}) {
		tb.Fatalf("the coordinator saw %d of %d peers' announcements", seen, npeers)
	}
	return f
}

// startNode starts a node on loopback with an API; closed when tb ends.
func startNode(tb testing.TB, cfg node.Config) *node.Node {
	tb.Helper()
	id, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.Identity, cfg.Loopback = id, true
	cfg.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	cfg.ConsoleAddr, cfg.APIAddr = node.ConsoleOff, "127.0.0.1:0"
	cfg.Consent = &participation.Consent{Version: participation.ConsentVersion, RunLocal: true, Contribute: true}
	n, err := node.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Error(err)
		}
	})
	return n
}

// heapSampler samples HeapInuse every interval until stop, keeping the peak.
type heapSampler struct {
	peak atomic.Uint64
	stop chan struct{}
	done chan struct{}
}

func sampleHeap(interval time.Duration) *heapSampler {
	h := &heapSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() { // ends at h.end
		defer close(h.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > h.peak.Load() {
				h.peak.Store(ms.HeapInuse)
			}
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *heapSampler) end() uint64 {
	close(h.stop)
	<-h.done
	return h.peak.Load()
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// quantile is the nearest-rank q-quantile of xs (xs is not modified).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(float64(len(s))*q+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
