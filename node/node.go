// Package node assembles one meshinfer node from its parts and owns their lifecycle:
// identity, libp2p host, Kademlia DHT (protocol prefix /meshinfer), GossipSub, the peer
// registry, the capability probe and announcer, discovery, the reputation store, the
// participation gate (consent, policy, live conditions: participation.go), the backend
// (synthetic, or an OpenAI-compatible upstream) with its peer inference server and receipts
// log, the executor (node/dispatch) that runs API requests which may leave this device and
// the privacy gate in front of it (inference/localonly), the OpenAI-compatible API (behind the coordinator's key check and gateway with
// RoleCoordinator: gateway.go), and the local console.
//
// New starts the parts in dependency order; if one fails, New closes what it started and
// returns the error. Close stops them in reverse order, waits for every goroutine, and is
// idempotent. The node holds no domain logic: each rule lives in the package that owns it,
// and node only connects them.
//
// node is the only package that imports every other; nothing imports node but cmd and testnet.
package node

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	logging "github.com/ipfs/go-log/v2"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	dhtpb "github.com/libp2p/go-libp2p-kad-dht/pb"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	corediscovery "github.com/libp2p/go-libp2p/core/discovery"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	drouting "github.com/libp2p/go-libp2p/p2p/discovery/routing"
	routedhost "github.com/libp2p/go-libp2p/p2p/host/routed"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/inference/localonly"
	"github.com/meshinfer/meshinfer/inference/synth"
	"github.com/meshinfer/meshinfer/inference/upstream"
	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/mesh/announce"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/discovery"
	"github.com/meshinfer/meshinfer/mesh/probe"
	"github.com/meshinfer/meshinfer/mesh/receipts"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/node/dispatch"
	"github.com/meshinfer/meshinfer/reputation"
	"github.com/meshinfer/meshinfer/transport"
	"github.com/meshinfer/meshinfer/transport/bwprobe"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/infer"
	"github.com/meshinfer/meshinfer/transport/openai"
	"github.com/meshinfer/meshinfer/transport/stage"
	"github.com/meshinfer/meshinfer/transport/webrtc"
)

var log = logging.Logger("node")

// DHTProtocolPrefix keeps this mesh's DHT apart from the public IPFS DHT (/ipfs/kad/1.0.0):
// our nodes speak /meshinfer/kad/1.0.0 and never answer or query IPFS peers.
const DHTProtocolPrefix = "/meshinfer"

// Node is one running meshinfer node.
type Node struct {
	cfg     Config
	key     crypto.PrivKey
	started time.Time

	host      host.Host
	dht       *dht.IpfsDHT
	ps        *pubsub.PubSub
	psCancel  context.CancelFunc
	reg       *registry.Registry
	probe     *probe.Prober
	announcer *announce.Announcer
	disc      *discovery.Discovery
	console   *console.Server
	rep       *reputation.Store
	backend   inference.Backend // nil when the node serves no model itself
	infer     *infer.Server
	part      *partGate              // participation: consent, policy, live conditions
	receipts  *receipts.Log          // tasks served for peers; nil without a data dir
	receiptQ  *receiptQueue          // writes receipts to the log; nil without it
	rtc       *webrtc.Transport      // WebRTC direct paths (webrtc.go)
	dialer    host.Host              // host, with addresses of unconnected peers found in the DHT
	mem       memoryBudget           // bytes of memory for mesh work (budget.go)
	stages    inference.StageBackend // layer ranges of the synthetic models served here; nil with an upstream
	ranges    stageHolder            // the ranges of stages held, within the budget (the synthetic backend); nil with an upstream
	rangesSig signal                 // a range started loading or finished: re-announce (the announcer's Changed)
	stageSrv  *stage.Server          // pipeline stages this node runs for heads; nil without stages
	head      *synth.Backend         // the head of pipelines this node routes: every synthetic preset
	pipelines pipelineStats
	keys      *gateway.KeyStore  // coordinator: the API keys of thin clients
	meter     *gateway.Meter     // coordinator: usage per key
	tasks     taskMeter          // meters API requests (a no-op but on a coordinator)
	exec      *dispatch.Executor // runs API requests that may leave this device
	gate      *localonly.Gate    // serves local-only API requests; holds no network handle
	api       *openai.Server

	bw      *bandwidth.Estimator // the bandwidth with each peer, from timed transfers (bandwidth.go)
	bwProbe *bwprobe.Client      // probes a peer's bandwidth on demand

	// draining is set by Drain: no peer task is admitted and the vector says not accepting.
	draining atomic.Bool

	closers   []func() error // in start order; Close runs them backwards
	closeOnce sync.Once
	closeErr  error
}

// New assembles and starts a node.
func New(cfg Config) (*Node, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, key: cfg.Identity, started: cfg.Now()}
	if err := n.start(); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

func (n *Node) start() error {
	cfg := n.cfg
	if n.key == nil {
		key, created, err := LoadOrCreateIdentity(cfg.DataDir)
		if err != nil {
			return err
		}
		if created {
			log.Infow("created a new identity", "dir", cfg.DataDir)
		}
		n.key = key
	}

	h, err := newHost(cfg, n.key)
	if err != nil {
		return err
	}
	n.host = h
	n.closers = append(n.closers, h.Close)

	mode := dht.ModeAuto
	if cfg.HasRole(RoleBootstrap) || cfg.Loopback {
		mode = dht.ModeServer
	}
	dhtOpts := []dht.Option{
		dht.ProtocolPrefix(DHTProtocolPrefix),
		dht.Mode(mode),
		dht.BootstrapPeers(cfg.Bootstrap...),
		// At most 3 peers of one public IP group in the routing table (eclipse; loopback
		// and private groups exempt, see mesh/discovery's diverse.go).
		dht.RoutingTablePeerDiversityFilter(discovery.DHTDiversityFilter(h)),
	}
	if cfg.Loopback {
		// The random-walk refresh queries ~20 peers per bucket; on one machine it connects each
		// node to 25-40 others and, with 100 nodes, starves 2 cores (docs/benchmarks.md B6).
		dhtOpts = append(dhtOpts, dht.DisableAutoRefresh())
	}
	n.dht, err = dht.New(h, dhtOpts...)
	if err != nil {
		return fmt.Errorf("start DHT: %w", err)
	}
	n.closers = append(n.closers, n.dht.Close)
	// Streams to peers go through a host that asks the DHT for the addresses of a peer known
	// only from its announcement (GossipSub relays vectors, not addresses), instead of
	// failing with "no addresses". Closing the node closes h itself, not the wrapper.
	n.dialer = routedhost.Wrap(h, n.dht)

	// GossipSub's lifetime is its context; Close cancels it.
	psCtx, psCancel := context.WithCancel(context.Background())
	n.closers = append(n.closers, func() error { psCancel(); return nil })
	// Peer scoring on the capability topic: a neighbour forwarding forged vectors, or too
	// many identities on one IP, is pruned and then graylisted by GossipSub itself
	// (mesh/announce's package doc has the figures).
	scoreParams, scoreThresholds := announce.PeerScore(cfg.Mesh)
	psOpts := []pubsub.Option{
		// On loopback the bootstrap node is connected to every node, prunes constantly and
		// its PX sends each pruned node up to 16 more dials.
		pubsub.WithPeerExchange(cfg.HasRole(RoleBootstrap) && !cfg.Loopback),
		pubsub.WithMaxMessageSize(maxPubsubMessage),
		// GossipSub's defaults (32 each) drop announcements in a join burst (B6).
		pubsub.WithValidateQueueSize(pubsubValidateQueue),
		pubsub.WithPeerOutboundQueueSize(pubsubPeerQueue),
		pubsub.WithPeerScore(scoreParams, scoreThresholds),
	}
	n.ps, err = pubsub.NewGossipSub(psCtx, h, append(psOpts, cfg.PubsubOptions...)...)
	if err != nil {
		return fmt.Errorf("start gossipsub: %w", err)
	}

	n.probe, err = probe.New(probe.WithRoot(cfg.ProbeRoot))
	if err != nil {
		return fmt.Errorf("start capability probe: %w", err)
	}
	n.closers = append(n.closers, n.probe.Close)
	// One reading at start: the memory budget and the first participation observation
	// below.
	first := n.probe.Probe(cfg.Now())
	if n.part, err = newPartGate(cfg); err != nil {
		return fmt.Errorf("participation: %w", err)
	}
	n.mem.init(cfg.MemoryBudget, first.RAM.FreeMB<<20, n.part.memoryShare())

	repParams := reputation.DefaultParams()
	if cfg.Reputation != nil {
		repParams = *cfg.Reputation
	}
	if n.rep, err = reputation.New(repParams); err != nil {
		return fmt.Errorf("reputation store: %w", err)
	}
	// The store forgets peers only when told to: pruned every heartbeat, a peer that left is
	// forgotten within Retain and a heartbeat of its last event (its last missed heartbeat,
	// once the registry forgets it), so churn does not fill it with the departed.
	repCtx, repCancel := context.WithCancel(context.Background())
	var repWG sync.WaitGroup
	repWG.Go(func() { pruneReputation(repCtx, n.rep, cfg.Now, cfg.Heartbeat) })
	n.closers = append(n.closers, func() error { repCancel(); repWG.Wait(); return nil })
	n.bw = bandwidth.New()
	switch {
	case cfg.Backend == BackendOpenAI:
		ub, err := upstream.New(cfg.Upstream, cfg.Models, upstream.WithAPIKey(os.Getenv(cfg.UpstreamKeyEnv)))
		if err != nil {
			return fmt.Errorf("backend %s: %w", BackendOpenAI, err)
		}
		n.backend = ub
		n.closers = append(n.closers, ub.Close)
	case len(cfg.Models) > 0:
		sb, err := synth.NewWith(cfg.Models, []synth.Option{
			synth.WithLoadDelay(cfg.SynthLoadDelay), synth.WithLoadGate(cfg.SynthLoadGate),
			synth.WithOnRangeChange(n.rangesSig.fire), synth.WithStageBudget(n.mem.get()),
		})
		if err != nil {
			return fmt.Errorf("models: %w", err)
		}
		n.backend = sb // assigned only when non-nil: a nil *synth.Backend would be a non-nil Backend
		n.stages, n.ranges = sb, sb
	}
	if n.stages != nil && cfg.WrapStages != nil {
		n.stages = cfg.WrapStages(n.stages)
	}
	if n.backend != nil && cfg.WrapBackend != nil {
		n.backend = cfg.WrapBackend(n.backend) // a testnet fault; nil in production
	}
	// The first observation now, so that the first announcement already says whether this
	// node accepts work; the loop started below observes every heartbeat after that.
	n.part.observe(first, cfg.Now())
	n.startBandwidth()
	var direct *directServer
	if n.backend != nil {
		opts := []infer.ServerOption{infer.WithAdmission(n.admit), infer.WithSigner(n.signTask), infer.WithServerObserver(n.rep),
			infer.WithServerTransfers(n.noteTransfer)}
		if cfg.DataDir != "" {
			// Every task served for a peer is receipted, off the task's own goroutine; the
			// queue drains and the log closes after every task has ended (direct.wait).
			if n.receipts, err = receipts.Open(cfg.DataDir, n.key); err != nil {
				return fmt.Errorf("receipts log: %w", err)
			}
			n.closers = append(n.closers, n.receipts.Close)
			q := newReceiptQueue(n.receipts)
			n.receiptQ = q
			n.closers = append(n.closers, q.stop)
			opts = append(opts, infer.WithOnServed(func(t infer.ServedTask) { q.add(n.servedReceipt(t)) }))
		}
		// Waited for last among these: after the inference server and the WebRTC transport
		// have ended the direct tasks still running.
		direct = &directServer{n: n}
		n.closers = append(n.closers, direct.wait)
		// Its streams' bytes are the mesh traffic the bandwidth cap counts (traffic.go).
		n.infer = infer.NewServer(n.part.traffic.servingHost(h), n.backend, opts...)
		n.closers = append(n.closers, n.infer.Close)
	}
	if err := n.startStages(); err != nil {
		return err
	}
	if err := n.startWebRTC(); err != nil {
		return err
	}
	if direct != nil && cfg.WebRTCAccept {
		h.SetStreamHandler(infer.DirectID, n.part.traffic.handler(direct.handle))
		n.closers = append(n.closers, direct.stop)
	}

	n.reg = registry.New(registry.ParamsForHeartbeat(cfg.Heartbeat))
	// The DHT's FIND_PEER request, sent to one connected peer at a time (discovery.Contact).
	ask, err := dhtpb.NewProtocolMessenger(n.dht.MessageSender())
	if err != nil {
		return fmt.Errorf("DHT messenger: %w", err)
	}
	n.announcer, err = announce.New(h, n.ps, n.key, n.reg, vectorSource{n}, announce.Params{
		Mesh: cfg.Mesh, Heartbeat: cfg.Heartbeat, Now: cfg.Now,
		// A peer known only from others' announcements is contacted in the background and a
		// few at a time: a request never waits on a contact, and a made-up identity is
		// dropped without ever being routed to. Its addresses come from the peers this node
		// is connected to; the DHT-routed host's walk, which dials every peer on its way, is
		// the announcer's last resort for a model no contacted peer offers (B6).
		Contact:   func(ctx context.Context, p peer.ID) error { return discovery.Contact(ctx, h, ask, p) },
		Lookup:    func(ctx context.Context, p peer.ID) error { return n.dialer.Connect(ctx, peer.AddrInfo{ID: p}) },
		Observer:  n.rep,
		Transfers: n.noteTransfer,
	})
	if err != nil {
		return fmt.Errorf("start announcer: %w", err)
	}
	n.closers = append(n.closers, n.announcer.Close)
	n.part.onChange(n.acceptingChanged)
	// The owner's consent, re-read, may change the memory share: the budget follows, and is
	// announced at once.
	n.part.onPolicy(n.policyChanged)
	n.policyChanged() // a consent re-read since the budget was first computed
	// A stage's range is announced as soon as it starts loading and again once it is warm.
	n.rangesSig.set(n.announcer.Changed)
	partCtx, partCancel := context.WithCancel(context.Background())
	var partWG sync.WaitGroup
	partWG.Go(func() { n.part.loop(partCtx, n.probe, cfg.Heartbeat) })
	n.closers = append(n.closers, func() error { partCancel(); partWG.Wait(); return nil })

	// Rendezvous advertises one DHT key from every node: on one machine that makes the ~20
	// nodes closest to it hubs that everyone dials. Bootstrap peers reach every node there.
	var rendezvous corediscovery.Discovery
	if !cfg.Loopback {
		rendezvous = drouting.NewRoutingDiscovery(n.dht)
	}
	n.disc, err = discovery.New(h, discovery.Params{
		Mesh:       cfg.Mesh,
		Bootstrap:  cfg.Bootstrap,
		Rendezvous: rendezvous,
		MDNS:       cfg.MDNS && !cfg.Loopback,
		LowWater:   cfg.ConnsLow,
	})
	if err != nil {
		return fmt.Errorf("start discovery: %w", err)
	}
	n.closers = append(n.closers, n.disc.Close)

	if cfg.APIAddr != APIOff {
		var cloud inference.Backend
		if cfg.CloudURL != "" {
			cb, err := upstream.New(cfg.CloudURL, cfg.CloudModels, upstream.WithAPIKey(os.Getenv(cfg.CloudKeyEnv)))
			if err != nil {
				return fmt.Errorf("cloud tier: %w", err)
			}
			cloud = cb
			n.closers = append(n.closers, cb.Close)
		}
		coordinator := cfg.HasRole(RoleCoordinator)
		clientOpts := []infer.ClientOption{
			infer.WithClientObserver(n.rep),
			infer.WithTimeouts(cfg.PeerFirstTokenTimeout, cfg.PeerInterTokenTimeout),
			infer.WithOpenTimeout(cfg.PeerOpenTimeout),
			// A leaving peer's KV rows are timed as they arrive: the gate's sample of the
			// bandwidth from it, which a paused peer would not answer a probe for.
			infer.WithClientTransfers(n.noteTransfer),
		}
		if coordinator {
			// The meter opens first and closes last: the executor's verifications record
			// in it until the executor has closed.
			if err := n.openMeter(); err != nil {
				return err
			}
			// Every task asks its peer for a receipt, verification runs included.
			clientOpts = append(clientOpts, infer.WithReceipts())
		}
		peers := infer.NewClient(n.dialer, clientOpts...)
		dcfg := dispatch.Config{
			Mesh: cfg.Mesh, Local: n.ownerBackend(), Peers: peers,
			Cloud: cloud, CloudModels: cfg.CloudModels, CloudUSDPerMTok: cfg.CloudUSDPerMTok,
			CloudAllowed: n.part.cloudAllowed,
			Registry:     n.reg, Latency: h.Peerstore().LatencyEWMA,
			Connected: func(p peer.ID) bool { return h.Network().Connectedness(p) == network.Connected },
			Bandwidth: n.gateBandwidth, Rep: n.rep,
			Degraded: n.probe.Refresh,
			WebRTC:   n.rtc, Streams: peers,
			VerifySample: cfg.VerifySample, VerifyProbationSample: cfg.VerifyProbationSample,
			Voters:   dispatch.Voters{MinKnown: cfg.VoterMinKnown, MinScore: cfg.VoterMinScore, LoopbackHosts: cfg.Loopback},
			PeerAddr: n.peerAddr,
			Self:     h.ID(), Dialer: n.dialer, Now: cfg.Now, Seed: randomSeed(),
			// A serving peer registers the direct-task protocol only when it accepts WebRTC
			// set-ups; identify tells which do.
			Head: n.head, Pipelines: n,
			AcceptsDirect: func(p peer.ID) bool {
				ps, err := h.Peerstore().SupportsProtocols(p, infer.DirectID)
				return err == nil && len(ps) > 0
			},
		}
		if coordinator {
			dcfg.Meter = n.tasks
		}
		if n.exec, err = dispatch.New(dcfg); err != nil {
			return err
		}
		n.closers = append(n.closers, n.exec.Close) // after the API's close: no request left
		n.gate = localonly.New(n.onDevice())
		opts := []openai.Option{openai.WithPublic(cfg.APIPublic), openai.WithDefaultPrefs(cfg.Prefs)}
		if cfg.TLSCert != "" {
			opts = append(opts, openai.WithTLS(cfg.TLSCert, cfg.TLSKey))
		}
		if coordinator {
			wrap, err := n.startGateway()
			if err != nil {
				return err
			}
			opts = append(opts, openai.WithWrap(wrap), openai.WithLocal(meteredLocal{n.gate, n.tasks}))
		} else {
			opts = append(opts, openai.WithLocal(n.gate))
		}
		n.api, err = openai.New(cfg.APIAddr, n.exec, opts...)
		if err != nil {
			return err
		}
		n.closers = append(n.closers, n.api.Close)
	}
	if cfg.ConsoleAddr != ConsoleOff {
		n.console, err = console.New(cfg.ConsoleAddr, cfg.ConsolePublic, n)
		if err != nil {
			return err
		}
		n.closers = append(n.closers, n.console.Close)
	}
	log.Infow("node started", "peer", h.ID(), "mesh", cfg.Mesh)
	return nil
}

// peerAddr is the remote IP address of a direct connection to p, or the zero Addr when
// there is none: not connected, or only through a relay (whose address is the relay's, not
// the peer's). The executor tells verification voters' hosts apart by it.
func (n *Node) peerAddr(p peer.ID) netip.Addr {
	// An outbound connection's remote address is one the peer listens on; an inbound one's
	// is where the peer dialled from, which a host with several addresses may pick
	// otherwise. With both open (each side dialled), the outbound one decides.
	var inbound netip.Addr
	for _, c := range n.host.Network().ConnsToPeer(p) {
		ra := c.RemoteMultiaddr()
		if _, err := ra.ValueForProtocol(ma.P_CIRCUIT); err == nil {
			continue
		}
		ip, err := manet.ToIP(ra)
		if err != nil {
			continue
		}
		a, ok := netip.AddrFromSlice(ip)
		switch {
		case !ok:
		case c.Stat().Direction == network.DirOutbound:
			return a.Unmap()
		case !inbound.IsValid():
			inbound = a.Unmap()
		}
	}
	return inbound
}

// randomSeed seeds the executor's draws (which peer, which task is verified) from the
// operating system's randomness: a seed from the start time would let a peer that knows
// when the node started predict which of its tasks are checked.
func randomSeed() uint64 {
	var b [8]byte
	cryptorand.Read(b[:]) // never fails on the platforms Go supports (crypto/rand)
	return binary.LittleEndian.Uint64(b[:])
}

// servedReceipt is the receipt of one served task: for a task whose requester got a receipt,
// the time and result it was signed with.
func (n *Node) servedReceipt(t infer.ServedTask) receipts.Receipt {
	r := receipts.Receipt{
		Time: n.cfg.Now().UTC(), Requester: t.From.String(), Model: t.Model,
		TokensIn: t.PromptTokens, TokensOut: t.CompletionTokens,
		DurationMS: t.Duration.Milliseconds(), Outcome: t.Outcome,
	}
	if !t.End.IsZero() {
		r.Time, r.Result = t.End.UTC(), t.Output.String()
	}
	return r
}

// signTask signs the task receipt a requester asked for (infer.Signer).
func (n *Node) signTask(t infer.ServedTask) (string, error) {
	return receipts.SignTask(n.key, n.servedReceipt(t))
}

// onDevice is the backend local-only requests may use: the synthetic one, or an upstream
// server on this machine (loopback). An upstream elsewhere would carry the prompt off the
// device, so local-only requests then get local_unavailable.
func (n *Node) onDevice() inference.Backend {
	if n.backend == nil {
		return nil
	}
	if n.cfg.Backend == BackendOpenAI {
		u, err := url.Parse(n.cfg.Upstream)
		if err != nil || transport.CheckLoopback(net.JoinHostPort(u.Hostname(), "0")) != nil {
			return nil
		}
	}
	return n.ownerBackend()
}

// ownerBackend is the backend as this node's own API requests may use it: as the owner's
// consent to run models locally allows (the peer server uses the backend as consent to
// contribute allows, through its admission).
func (n *Node) ownerBackend() inference.Backend {
	if n.backend == nil {
		return nil
	}
	b := consentBackend{Backend: n.backend, g: n.part}
	if ld, ok := n.backend.(dispatch.Loader); ok {
		return consentLoader{consentBackend: b, ld: ld}
	}
	return b
}

// maxPubsubMessage caps any GossipSub message this node will handle: capability vectors are
// at most caps.MaxEncodedSize, and nothing else travels on pubsub yet. GossipSub's own 1 MiB
// default would let one peer make us buffer 64× more than any valid message needs.
const maxPubsubMessage = 64 << 10

// GossipSub queue sizes: a join burst at N=100 overflows the defaults of 32.
const (
	pubsubValidateQueue = 512
	pubsubPeerQueue     = 256
)

// Close stops every part in reverse start order. It is idempotent.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		var errs []error
		for i := len(n.closers) - 1; i >= 0; i-- {
			if err := n.closers[i](); err != nil {
				errs = append(errs, err)
			}
		}
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

// ID is the node's peer ID.
func (n *Node) ID() peer.ID { return n.host.ID() }

// Host is the node's libp2p host.
func (n *Node) Host() host.Host { return n.host }

// Reputation is the node's reputation store: target health and peers' scores.
func (n *Node) Reputation() *reputation.Store { return n.rep }

// Registry is the node's peer registry.
func (n *Node) Registry() *registry.Registry { return n.reg }

// PubSub is the node's GossipSub router.
func (n *Node) PubSub() *pubsub.PubSub { return n.ps }

// AddrInfo is how other nodes reach this one.
func (n *Node) AddrInfo() peer.AddrInfo {
	return peer.AddrInfo{ID: n.host.ID(), Addrs: n.host.Addrs()}
}

// P2PAddrs are the node's listen addresses with /p2p/<id> appended, ready for --bootstrap.
func (n *Node) P2PAddrs() []ma.Multiaddr {
	addrs, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: n.host.ID(), Addrs: n.host.Addrs()})
	if err != nil {
		return nil
	}
	return addrs
}

// ConsoleAddr is where the console listens, or "" when it is off.
func (n *Node) ConsoleAddr() string {
	if n.console == nil {
		return ""
	}
	return n.console.Addr()
}

// Own is the latest capability vector this node published, or nil before the first.
func (n *Node) Own() *caps.Vector { return n.announcer.Own() }

// Announce asks the node to publish its vector soon (coalesced).
func (n *Node) Announce() { n.announcer.Changed() }

// Ready reports whether the node has reached its bootstrap peers (or needs none) and has
// published its capability vector.
func (n *Node) Ready() bool {
	return n.disc.Bootstrapped() && n.announcer.Published() > 0
}

// APIAddr is where the OpenAI-compatible API listens, or "" when it is off.
func (n *Node) APIAddr() string {
	if n.api == nil {
		return ""
	}
	return n.api.Addr()
}

// MemoryBudget is the memory this node gives to mesh work, in bytes: Config.MemoryBudget
// (or DefaultMemoryShare of the memory available at start), cut to the effective
// participation policy's max_memory_share of that memory.
func (n *Node) MemoryBudget() int64 { return n.mem.get() }

// vectorSource fills the unsigned parts of the vector: hardware from the probe (a foreground
// desktop), the battery floor from the participation policy, models and load from the
// backend and the peer inference server, the downlink from the bandwidth measured.
type vectorSource struct{ n *Node }

func (s vectorSource) Vector(now time.Time) caps.Vector {
	v := s.n.probe.Probe(now).Vector()
	v.Battery.Floor = s.n.part.batteryFloor()
	v.RAM.BudgetMB = min(s.n.mem.get()>>20, v.RAM.TotalMB)
	models := []caps.Model{}
	load := caps.Load{Accepting: s.n.backend != nil && s.n.part.accepting() && !s.n.draining.Load()}
	if s.n.backend != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		infos, err := s.n.backend.Models(ctx)
		cancel()
		if err == nil {
			for _, m := range infos {
				state := caps.ModelCold
				if m.Warm {
					state = caps.ModelWarm
				}
				cm := caps.Model{Name: m.Name, State: state, Deterministic: m.Deterministic}
				if s.n.stages != nil {
					if sh, err := s.n.stages.Shape(m.Name); err == nil {
						cm.Layers, cm.WeightBytes, cm.KVBytesPerToken = sh.Layers, sh.WeightBytes, sh.KVBytesPerToken
					}
				}
				models = append(models, cm)
			}
		}
		st := s.n.infer.Stats()
		load.InFlight, load.Capacity = int(st.InFlight), st.Capacity
	}
	v.Models, v.Load = models, load
	v.Net.DownlinkMbps = s.n.downlinkMbps(now)
	if s.n.ranges != nil {
		v.Stages = stagesHeld(s.n.ranges.Ranges(), models)
	}
	return v
}

// stageHolder is the backend that holds layer ranges for pipeline stages (synth.Backend):
// it lists them, and keeps them and their sessions within the memory budget it is given.
type stageHolder interface {
	Ranges() []synth.RangeState
	SetStageBudget(bytes int64)
}

// stagesHeld is the vector's stages: the ranges of the models announced, at most
// caps.MaxStages of them, those loading first (a range loading now is news; a warm one has
// been announced already).
func stagesHeld(ranges []synth.RangeState, models []caps.Model) []caps.Stage {
	var loading, warm []caps.Stage
	for _, r := range ranges {
		if !slices.ContainsFunc(models, func(m caps.Model) bool { return m.Name == r.Model }) {
			continue
		}
		st := caps.Stage{Model: r.Model, Lo: r.Lo, Hi: r.Hi, State: caps.StageLoading}
		if r.Loaded {
			st.State = caps.StageWarm
			warm = append(warm, st)
		} else {
			loading = append(loading, st)
		}
	}
	out := append(loading, warm...)
	return out[:min(len(out), caps.MaxStages)]
}

// signal calls the function it was last set to, if any: the synthetic backend reports its
// loads from the start, the announcer that hears of them exists only later.
type signal struct{ f atomic.Pointer[func()] }

func (s *signal) set(f func()) { s.f.Store(&f) }

func (s *signal) fire() {
	if f := s.f.Load(); f != nil {
		(*f)()
	}
}
