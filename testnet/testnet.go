// Package testnet runs many meshinfer nodes on loopback, in one process or (StartProcs) one
// process each, for `meshinfer testnet`, `make run`, integration tests and benchmarks.
//
// Node 0 has the bootstrap role. Every other node bootstraps to node 0 and to up to two
// random nodes already running when its start wave begins (nodes start Parallel at a time),
// so a large mesh does not hang on one hub; a small one (≤ Parallel+1 nodes) is a star
// around node 0 plus what discovery adds. Nodes listen on
// 127.0.0.1 TCP and QUIC with OS-chosen ports; consoles listen on ConsoleBase+i (or
// OS-chosen ports when ConsoleBase is 0), and OpenAI APIs on APIBase+i likewise. Nodes
// serve different synthetic models (DefaultModels), so some requests must cross the mesh.
// Options.Faults makes the last nodes misbehave (liars and slow nodes; see Faults), and
// Options.Links puts a fault proxy in front of every node, so that tests delay, throttle,
// blackhole and reset the links between nodes while they run (links.go).
//
// Loopback pitfalls, handled here on purpose:
//   - go-libp2p's resource manager exempts 127.0.0.0/8 from its per-IP connection limits, so
//     100 nodes on one address are not throttled as one host would be. Tests of those limits
//     set node.Config.LimitLoopback and bind peers to distinct 127.0.0.x addresses.
//     GossipSub's IP colocation penalty ignores loopback addresses altogether (its tests use
//     the machine's own non-loopback address).
//   - kad-dht's IP-diversity filter would put all of 127/8 in one group and keep only a few
//     peers per bucket; meshinfer nodes enable it with loopback and private groups exempt
//     (mesh/discovery's DHTDiversityFilter), so the DHT fills normally.
//   - loopback addresses are never "public", so DHT server mode is forced (Config.Loopback)
//     and NAT traversal services, which would only burn CPU here, are off.
//   - verification voters must be on hosts apart, and every node on 127.0.0.1 is one host:
//     tests of verification set Options.DistinctHosts (node i on 127.0.0.(i+1)), which
//     Config.Loopback makes count as hosts of their own.
//   - Config.Loopback also turns off the DHT's routing-table refresh, DHT rendezvous and
//     GossipSub peer exchange: on one machine they make every node dial dozens of others
//     (the ~20 nodes closest to the single rendezvous key become hubs), which at 100 nodes
//     starves 2 cores (docs/benchmarks.md B6). Bootstrap peers reach every node here. Production
//     nodes keep all three; how they behave at 100 real nodes is not measured yet.
//
// Options can add a stand-in cloud API as every node's cloud tier (Cloud), simulated
// battery/thermal/network sensors per node (Sensors), and misbehaving nodes: liars, slow
// and flaky ones (Faults). Each node keeps its data dir (receipts) under a temporary
// directory that Close removes.
//
// StartProcs runs the nodes as `meshinfer node` processes instead, for faults that are real
// signals (procs.go).
//
// Nothing in production imports this package.
package testnet

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/meshinfer/meshinfer/mesh/announce"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/node"
)

// Options configures a testnet.
type Options struct {
	Nodes       int    // how many nodes to start (at least 1)
	Mesh        string // mesh name; node.DefaultMesh when empty
	ConsoleBase int    // node i's console on 127.0.0.1:ConsoleBase+i; 0: OS-chosen ports
	NoConsole   bool   // start no consoles
	APIBase     int    // node i's OpenAI API on 127.0.0.1:APIBase+i; 0: OS-chosen ports
	NoAPI       bool   // start no APIs
	// ModelsFor returns the synthetic models node i serves; DefaultModels when nil.
	ModelsFor func(i int) []string
	// MemoryBudget is every node's memory budget for mesh work (node's --memory-budget);
	// DefaultMemoryBudget when 0.
	MemoryBudget int64
	Heartbeat    time.Duration // announcement period; node.DefaultHeartbeat when 0
	ConnsLow     int           // connection manager low water; 16 when 0
	ConnsHigh    int           // connection manager high water; 32 when 0
	ProbeRoot    string        // filesystem root for the capability probe; "/" when empty
	Version      string        // reported by each node
	Seed         uint64        // seeds the choice of bootstrap peers
	// Parallel is how many nodes start at once; 8 when 0. More saturates 2 cores with
	// handshakes and slows everything.
	Parallel int
	// Cloud starts a stand-in cloud API (see Cloud) serving every synthetic preset, and
	// makes it every node's cloud tier. CloudAddr is its listen address (127.0.0.1:0 when
	// empty) and CloudLatency its added latency (DefaultCloudLatency when 0).
	Cloud        bool
	CloudAddr    string
	CloudLatency time.Duration
	// CloudModels, with Cloud, are the only models the cloud serves (and the nodes ask it
	// for); every synthetic preset when nil. The cloud loads its models before it starts,
	// and synth-large alone takes about 5 s of CPU under -race: a test that needs one
	// small model from the cloud names it here.
	CloudModels []string
	// ColdStart is added to every synthetic model's load on the nodes (not the cloud's), so
	// that cold starts last as long as a real model's (node.Config.SynthLoadDelay).
	ColdStart time.Duration
	// Sensors gives every node simulated hardware (see Sensors), starting from
	// DefaultSensors, instead of this machine's: scenarios rewrite it.
	Sensors bool
	// Faults makes some nodes misbehave (see Faults); none when zero.
	Faults Faults
	// WebRTC makes WebRTC data channels every node's transport to its peers, falling back
	// to libp2p streams where no direct path sets up, and makes every node accept peers'
	// set-ups (node's --webrtc).
	WebRTC bool
	// DistinctHosts makes node i listen on 127.0.0.(i+1) instead of 127.0.0.1, and so dial
	// from it too, so that its peers see each node on a host of its own: verification
	// voters must be on hosts apart (node/dispatch/verify.go; with Config.Loopback each
	// loopback address is one). Linux routes all of 127.0.0.0/8 to the loopback
	// interface; elsewhere the addresses need aliases. At most 254 nodes.
	DistinctHosts bool
	// WebRTCAccept makes every node answer peers' WebRTC set-ups (node's --webrtc-accept):
	// direct paths for requests that ask for WebRTC, and direct tasks. Without it (or
	// WebRTC) no node answers one, and such requests go over libp2p.
	WebRTCAccept bool
	// Links puts a fault proxy in front of every node (see links.go): node i listens on
	// 127.0.0.(i+1) TCP only (no QUIC: it would bypass the proxy) and announces the proxy,
	// and the link faults change while the nodes run (Testnet.Link, LinksOf, Between).
	// Implies DistinctHosts; not with WebRTC.
	Links bool
	// LinkFaults, with Links, gives each link's faults at start (from node i to node j);
	// none when nil. Set here, a delay is in the first round trip peers measure.
	LinkFaults func(i, j int) LinkFaults
	// Configure, when set, adjusts node i's configuration last (tests: another backend, a
	// default privacy).
	Configure func(i int, cfg *node.Config)
}

// DefaultMemoryBudget is a testnet node's memory budget (256 MiB): every preset but
// synth-large (481 MB) fits one node, so synth-large is served by a pipeline.
const DefaultMemoryBudget = 256 << 20

// DefaultModels alternates synth-tiny and synth-small across the nodes, so a request for
// either model sent to half the nodes has to cross the mesh.
func DefaultModels(i int) []string {
	if i%2 == 0 {
		return []string{"synth-tiny"}
	}
	return []string{"synth-small"}
}

// Testnet is a set of in-process nodes.
type Testnet struct {
	opts Options

	cloud *Cloud // nil without Options.Cloud
	// stop ends the flaky nodes' connection droppers (faultWG), at Close.
	stop      chan struct{}
	faultWG   sync.WaitGroup
	closeOnce sync.Once
	// linkState is the faults of every link, shared by the proxies in front of the nodes
	// (proxies), with Options.Links; nil without.
	linkState *linkState
	// tmp holds the testnet's files: each node's data dir (receipts) and simulated sensor
	// tree; removed by Close.
	tmp string

	mu      sync.Mutex
	nodes   []*node.Node // nil where stopped or killed
	sensors []*Sensors   // by node index, with Options.Sensors
	proxies []*linkProxy // by node index, with Options.Links
	rng     *mrand.Rand
}

// New starts opts.Nodes nodes and returns once each has started (not converged: see
// WaitConverged). On error, every node started so far is closed.
func New(opts Options) (*Testnet, error) {
	if opts.Nodes < 1 {
		return nil, fmt.Errorf("testnet needs at least 1 node, got %d", opts.Nodes)
	}
	if err := opts.Faults.validate(opts.Nodes); err != nil {
		return nil, err
	}
	if opts.Links {
		if opts.WebRTC {
			return nil, errors.New("testnet: Links need TCP between nodes, not WebRTC")
		}
		opts.DistinctHosts = true
	}
	if opts.ConnsLow == 0 {
		opts.ConnsLow = 16
	}
	if opts.ConnsHigh == 0 {
		opts.ConnsHigh = 32
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 8
	}
	if opts.ModelsFor == nil {
		opts.ModelsFor = DefaultModels
	}
	t := &Testnet{opts: opts, rng: mrand.New(mrand.NewPCG(opts.Seed, 0x6d657368)), stop: make(chan struct{})}
	dir, err := os.MkdirTemp("", "meshinfer-testnet-")
	if err != nil {
		return nil, err
	}
	t.tmp = dir
	if opts.Links {
		t.linkState = newLinkState()
		if opts.LinkFaults != nil {
			for i := range opts.Nodes {
				for j := range opts.Nodes {
					if f := opts.LinkFaults(i, j); i != j && f != (LinkFaults{}) {
						t.linkState.update([][2]int{{i, j}}, func(lf *LinkFaults) { *lf = f })
					}
				}
			}
		}
	}
	if opts.Cloud {
		addr := opts.CloudAddr
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		latency := opts.CloudLatency
		if latency == 0 {
			latency = DefaultCloudLatency
		}
		models := opts.CloudModels
		if models == nil {
			for _, p := range synth.Presets() {
				models = append(models, p.Name)
			}
		}
		c, err := StartCloud(addr, latency, models...)
		if err != nil {
			os.RemoveAll(t.tmp)
			return nil, err
		}
		t.cloud = c
	}
	if _, err := t.add(); err != nil {
		t.Close()
		return nil, err
	}
	for len(t.nodes) < opts.Nodes {
		wave := min(opts.Parallel, opts.Nodes-len(t.nodes))
		if err := t.addWave(wave); err != nil {
			t.Close()
			return nil, err
		}
	}
	return t, nil
}

// addWave starts n nodes concurrently, each bootstrapping into the nodes already running.
func (t *Testnet) addWave(n int) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, errs[i] = t.add() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Add starts one more node, bootstrapped like the others, and returns its index.
func (t *Testnet) Add() (int, error) { return t.add() }

func (t *Testnet) add() (int, error) {
	t.mu.Lock()
	idx := len(t.nodes)
	t.nodes = append(t.nodes, nil) // reserve the index (and its console port)
	t.sensors = append(t.sensors, nil)
	t.proxies = append(t.proxies, nil)
	boot := t.bootstrapFor(idx)
	t.mu.Unlock()

	dataDir := filepath.Join(t.tmp, fmt.Sprintf("node%d", idx))
	probeRoot := t.opts.ProbeRoot
	if t.opts.Sensors {
		s, err := newSensors(filepath.Join(dataDir, "sensors"), DefaultSensors())
		if err != nil {
			return 0, fmt.Errorf("node %d sensors: %w", idx, err)
		}
		t.mu.Lock()
		t.sensors[idx] = s
		t.mu.Unlock()
		probeRoot = s.Root()
	}

	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return 0, fmt.Errorf("node %d identity: %w", idx, err)
	}
	ip := "127.0.0.1"
	if t.opts.DistinctHosts {
		if idx > 253 {
			return 0, fmt.Errorf("node %d: distinct loopback hosts run out at 254 nodes", idx)
		}
		ip = fmt.Sprintf("127.0.0.%d", idx+1)
	}
	cfg := node.Config{
		Identity:    key,
		DataDir:     dataDir,
		Mesh:        t.opts.Mesh,
		ListenAddrs: []string{"/ip4/" + ip + "/tcp/0", "/ip4/" + ip + "/udp/0/quic-v1"},
		Bootstrap:   boot,
		ConsoleAddr: t.consoleAddr(idx),
		APIAddr:     t.apiAddr(idx),
		Models:      t.opts.ModelsFor(idx),
		Heartbeat:   t.opts.Heartbeat,
		ConnsLow:    t.opts.ConnsLow,
		ConnsHigh:   t.opts.ConnsHigh,
		Loopback:    true,
		ProbeRoot:   probeRoot,
		// A testnet drives hundreds of requests a minute through a few nodes: no rate limit
		// (mesh/participation tests it).
		ProfileOverrides: participation.Overrides{MaxTasksPerMin: new(int)},
		// A testnet stands for machines whose owners said yes to everything.
		Consent: &participation.Consent{Version: participation.ConsentVersion, GivenAt: time.Now().UTC(), RunLocal: true, Contribute: true,
			CloudFallback: true, BatteryFloor: participation.DefaultBatteryFloor, PauseOnMetered: true},
		SynthLoadDelay: t.opts.ColdStart,
		MemoryBudget:   cmp.Or(t.opts.MemoryBudget, DefaultMemoryBudget),
		Version:        t.opts.Version,
	}
	if idx == 0 {
		cfg.Roles = []node.Role{node.RoleBootstrap}
	}
	if t.cloud != nil {
		cfg.CloudURL, cfg.CloudModels = t.cloud.URL(), t.cloud.Models()
	}
	cfg.WrapBackend = t.opts.Faults.wrapFor(idx, t.opts.Nodes)
	if t.opts.WebRTC {
		cfg.Prefs.Transport = inference.TransportWebRTC
	}
	cfg.WebRTCAccept = t.opts.WebRTC || t.opts.WebRTCAccept
	var proxy *linkProxy
	if t.linkState != nil {
		if proxy, err = newLinkProxy(idx, ip, t.linkState); err != nil {
			return 0, err
		}
		cfg.ListenAddrs = []string{"/ip4/" + ip + "/tcp/0"}
		cfg.AnnounceAddrs = []string{proxy.multiaddr()}
	}
	if t.opts.Configure != nil {
		t.opts.Configure(idx, &cfg)
	}
	n, err := node.New(cfg)
	if err != nil {
		if proxy != nil {
			proxy.close()
		}
		return 0, fmt.Errorf("node %d: %w", idx, err)
	}
	if proxy != nil {
		up, err := tcpListenAddr(n)
		if err != nil {
			proxy.close()
			return 0, errors.Join(fmt.Errorf("node %d: %w", idx, err), n.Close())
		}
		proxy.setUpstream(up)
	}
	t.mu.Lock()
	t.nodes[idx] = n
	t.proxies[idx] = proxy
	t.mu.Unlock()
	if t.opts.Faults.flaky(idx, t.opts.Nodes) {
		t.faultWG.Go(func() { t.dropConnections(n) })
	}
	return idx, nil
}

// bootstrapFor picks node 0 and up to two other running nodes below idx. Caller holds mu.
func (t *Testnet) bootstrapFor(idx int) []peer.AddrInfo {
	var running []int
	for i := 0; i < idx; i++ {
		if t.nodes[i] != nil {
			running = append(running, i)
		}
	}
	if len(running) == 0 {
		return nil
	}
	var out []peer.AddrInfo
	if running[0] == 0 {
		out = append(out, t.nodes[0].AddrInfo())
		running = running[1:]
	}
	t.rng.Shuffle(len(running), func(a, b int) { running[a], running[b] = running[b], running[a] })
	for _, i := range running[:min(2, len(running))] {
		out = append(out, t.nodes[i].AddrInfo())
	}
	return out
}

func (t *Testnet) consoleAddr(idx int) string {
	switch {
	case t.opts.NoConsole:
		return node.ConsoleOff
	case t.opts.ConsoleBase == 0:
		return "127.0.0.1:0"
	default:
		return fmt.Sprintf("127.0.0.1:%d", t.opts.ConsoleBase+idx)
	}
}

func (t *Testnet) apiAddr(idx int) string {
	switch {
	case t.opts.NoAPI:
		return node.APIOff
	case t.opts.APIBase == 0:
		return "127.0.0.1:0"
	default:
		return fmt.Sprintf("127.0.0.1:%d", t.opts.APIBase+idx)
	}
}

// Len is the number of node slots, running or not.
func (t *Testnet) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.nodes)
}

// Node returns node i, or nil when it is stopped or i is out of range.
func (t *Testnet) Node(i int) *node.Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i < 0 || i >= len(t.nodes) {
		return nil
	}
	return t.nodes[i]
}

// Running returns the running nodes in index order.
func (t *Testnet) Running() []*node.Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*node.Node
	for _, n := range t.nodes {
		if n != nil {
			out = append(out, n)
		}
	}
	return out
}

// Stop closes node i cleanly.
func (t *Testnet) Stop(i int) error {
	n := t.take(i)
	if n == nil {
		return fmt.Errorf("node %d is not running", i)
	}
	return n.Close()
}

// Kill crashes node i as its peers see it: its host closes every connection at once and it
// never announces again. Then the rest of the node is torn down.
func (t *Testnet) Kill(i int) error {
	n := t.take(i)
	if n == nil {
		return fmt.Errorf("node %d is not running", i)
	}
	herr := n.Host().Close()
	return errors.Join(herr, n.Close())
}

func (t *Testnet) take(i int) *node.Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i < 0 || i >= len(t.nodes) {
		return nil
	}
	n := t.nodes[i]
	t.nodes[i] = nil
	return n
}

// DataDir is node i's data directory (its receipts log is there).
func (t *Testnet) DataDir(i int) string { return filepath.Join(t.tmp, fmt.Sprintf("node%d", i)) }

// Sensors is node i's simulated hardware, or nil without Options.Sensors.
func (t *Testnet) Sensors(i int) *Sensors {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i < 0 || i >= len(t.sensors) {
		return nil
	}
	return t.sensors[i]
}

// dropConnections closes all of a flaky node's connections every FlakyPeriod, until Close.
func (t *Testnet) dropConnections(n *node.Node) {
	tick := time.NewTicker(FlakyPeriod)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		for _, c := range n.Host().Network().Conns() {
			c.Close()
		}
	}
}

// Cloud is the stand-in cloud, or nil when Options.Cloud is off.
func (t *Testnet) Cloud() *Cloud { return t.cloud }

// Converged reports whether every running node holds a fresh (not stale) verified vector
// of every other running node, and has been connected to it (a routing candidate) unless it
// has its fill of connections (announce.DefaultContactLowWater: past it, a node contacts a
// peer it heard of only for a model no contacted peer offers).
func (t *Testnet) Converged() bool {
	nodes := t.Running()
	for _, n := range nodes {
		now := time.Now()
		for _, other := range nodes {
			if other == n {
				continue
			}
			e, ok := n.Registry().Get(other.ID(), now)
			if !ok || e.Stale || !e.Contacted && len(n.Host().Network().Peers()) < announce.DefaultContactLowWater {
				return false
			}
		}
	}
	return true
}

// convergePoll is how often WaitConverged checks; a check at N=100 costs ~10k map lookups.
const convergePoll = 20 * time.Millisecond

// WaitConverged waits until Converged or ctx ends.
func (t *Testnet) WaitConverged(ctx context.Context) error {
	return WaitFor(ctx, convergePoll, t.Converged)
}

// WaitFor polls cond every interval until it holds or ctx ends.
func WaitFor(ctx context.Context, interval time.Duration, cond func() bool) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("condition not reached: %w", ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// Close stops every running node, in reverse index order.
func (t *Testnet) Close() error {
	t.closeOnce.Do(func() { close(t.stop) })
	t.faultWG.Wait()
	t.mu.Lock()
	nodes := t.nodes
	t.nodes = make([]*node.Node, len(nodes))
	proxies := t.proxies
	t.proxies = nil
	t.mu.Unlock()
	if t.linkState != nil {
		// Heal everything first, so that no node's shutdown waits on a partition.
		t.linkState.clear()
	}
	var errs []error
	for i := len(nodes) - 1; i >= 0; i-- {
		if nodes[i] != nil {
			errs = append(errs, nodes[i].Close())
		}
		if i < len(proxies) && proxies[i] != nil {
			proxies[i].close()
		}
	}
	if t.cloud != nil {
		errs = append(errs, t.cloud.Close())
	}
	errs = append(errs, os.RemoveAll(t.tmp))
	return errors.Join(errs...)
}
