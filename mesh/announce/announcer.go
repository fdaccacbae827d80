package announce

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	logging "github.com/ipfs/go-log/v2"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"

	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/window"
	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/registry"
	"github.com/meshinfer/meshinfer/reputation"
)

var log = logging.Logger("mesh/announce")

// Defaults.
const (
	// DefaultHeartbeat is the re-announcement period. 15 s detects a silent peer in about
	// 31 s (two misses plus a grace second), against mesh-llm's ~41 s.
	DefaultHeartbeat = 15 * time.Second
	// DefaultContactLowWater is how many connections a node wants before it contacts pending
	// peers only for models it has no contacted peer for: 8, enough candidates for the
	// router's weighted choice and its three attempts, and few enough that a 100-node mesh on
	// one machine stays within docs/benchmarks.md B6 (each connection costs a TLS handshake,
	// buffers and goroutines).
	DefaultContactLowWater = 8
	// DefaultMinGap is the least time between two publishes of this node: join and change
	// triggers inside it fold into one message, so a burst of joins costs one announcement.
	DefaultMinGap = time.Second
	// pingTimeout bounds one RTT measurement. A peer slower than that is not worth a figure.
	pingTimeout = 2 * time.Second
	// pingPeers is how many connected peers are pinged per heartbeat: enough for a median.
	pingPeers = 4
	// heartbeatGrace is how late a heartbeat may be before it counts as missed: a message
	// crossing a few GossipSub hops.
	heartbeatGrace = time.Second
	// contactTimeout bounds one attempt to connect to a pending peer, a DHT lookup of its
	// addresses included (Params.Lookup).
	contactTimeout = 15 * time.Second
	// contactWorkers is how many pending peers are contacted at once, and contactQueue how
	// many may wait (the others are queued again at the next heartbeat).
	contactWorkers = 4
	contactQueue   = 64
	// contactAttempts is how many contacts of a pending peer fail, a heartbeat apart,
	// before it is dropped as unreachable: one failed DHT lookup on a busy machine does not
	// cost an honest peer its place.
	contactAttempts = 3
	// ttlHeartbeats is how many heartbeats a vector stays valid: three, so one lost message
	// never expires a live peer's vector.
	ttlHeartbeats = 3
	// announceReach is how many topic peers a newcomer's announcement must have been sent
	// to. Its announcement on its first join goes to its first one or two neighbours, young
	// too, whose GossipSub meshes are not grafted yet: they forward it to few, and a node
	// that misses it waits for the next heartbeat (in B6, 3 nodes of 100 went unseen by half
	// the mesh for 10 s; with three, 1 run in 2 still had one). Sent to four, one of them
	// forwards it. So a newcomer announces once more when it has four topic peers, if no
	// announcement of its reached four yet: three announcements in all, within the burst
	// every receiver accepts from one author (rateBurst), and in a mesh of fewer than five
	// nodes, where every peer is a neighbour that pulls on its join, no more than before.
	announceReach = 4
)

// subscriptionBuffer is how many accepted announcements may wait for receiveLoop. GossipSub
// drops what does not fit (32 by default) after the validator has raised the seq mark.
const subscriptionBuffer = 256

// Source supplies the unsigned parts of this node's vector: hardware, models, load and what
// it knows of its network (type, metered, downlink). The Announcer fills peer_id, net.rtt_ms,
// seq, issued_at, expires_at and sig.
type Source interface {
	Vector(now time.Time) caps.Vector
}

// Params configures an Announcer.
type Params struct {
	Mesh      string           // mesh name; selects the topic
	Heartbeat time.Duration    // re-announce period; DefaultHeartbeat when 0
	MinGap    time.Duration    // least gap between publishes; DefaultMinGap when 0
	Now       func() time.Time // clock; time.Now when nil
	// Contact connects to a pending peer (one the registry holds but this node was never
	// connected to) at addresses this node knows or can learn without dialling anyone else
	// (the node asks its connected peers); nil uses the host's Connect with the addresses
	// in its peerstore. A peer that cannot be contacted is dropped.
	Contact func(ctx context.Context, p peer.ID) error
	// Lookup connects to a pending peer finding its addresses in the DHT: a Kademlia walk,
	// which dials the peers on its way (20-30 of a 100-node mesh, docs/benchmarks.md B6). It
	// is tried after Contact failed, and only for a peer that offers a model no contacted
	// peer offers or before a peer is dropped; nil: never.
	Lookup func(ctx context.Context, p peer.ID) error
	// ContactLowWater is how many connections this node wants before it contacts a pending
	// peer only for a model no contacted peer offers (DefaultContactLowWater when 0).
	ContactLowWater int
	// Observer, when set, is told of each missed heartbeat of a contacted peer, and of each
	// announcement or sync answer that breaks the rules, against the peer at fault (the
	// message's signed author, the sync server).
	Observer Observer
	// Transfers, when set, is told of each sync answer read to its end, timed from its
	// first byte to its last (internal/bandwidth: the caller keeps those that are samples,
	// answers of at least 64 KiB that the network paced rather than the checks of the
	// vectors).
	Transfers func(from peer.ID, t bandwidth.Transfer)
}

// Observer records events in peers' scores; reputation.Store is one.
type Observer interface {
	Observe(peer string, e reputation.Event, now time.Time)
}

// Announcer publishes this node's vector and feeds the registry from others'.
type Announcer struct {
	h      host.Host
	key    crypto.PrivKey
	src    Source
	reg    *registry.Registry
	params Params
	val    *validator
	ps     *pubsub.PubSub
	topic  *pubsub.Topic
	sub    *pubsub.Subscription
	events *pubsub.TopicEventHandler
	bus    event.Subscription

	trigger chan struct{} // one slot: a pending publish request
	syncQ   chan peer.ID  // peers to pull vectors from (see SyncProtocol)
	serve   syncLimiter   // bounds the sync answers this node gives
	// contactQ holds pending peers to contact; queued (under qmu) those in it or being
	// contacted, so a peer is queued once.
	contactQ chan peer.ID
	qmu      sync.Mutex
	queued   map[peer.ID]bool
	failures map[peer.ID]int // failed contacts of pending peers, under qmu
	dialing  int             // contacts under way, under qmu
	born     time.Time       // when New ran (syncLoop pulls twice while the node is young)
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	closed   atomic.Bool

	own       atomic.Pointer[caps.Vector] // latest signed vector of this node
	ownWire   atomic.Pointer[[]byte]      // its wire form
	published atomic.Uint64               // publishes done
	reached   atomic.Int64                // topic peers present at the latest publish
	synced    atomic.Uint64               // vectors learned through SyncProtocol
	contacted atomic.Uint64               // pending peers contacted
	dropped   atomic.Uint64               // pending peers dropped as unreachable
	rttMS     atomic.Uint64               // math.Float64bits of the latest median RTT

	mu  sync.Mutex // guards seq
	seq uint64
}

// New joins the mesh's capability topic on ps, registers its validator and starts the
// publish, receive and event loops. Close stops them.
func New(h host.Host, ps *pubsub.PubSub, key crypto.PrivKey, reg *registry.Registry, src Source, p Params) (*Announcer, error) {
	if p.Heartbeat <= 0 {
		p.Heartbeat = DefaultHeartbeat
	}
	if p.MinGap <= 0 {
		p.MinGap = DefaultMinGap
	}
	if p.Now == nil {
		p.Now = time.Now
	}
	if p.ContactLowWater <= 0 {
		p.ContactLowWater = DefaultContactLowWater
	}
	if p.Contact == nil {
		p.Contact = func(ctx context.Context, id peer.ID) error { return h.Connect(ctx, peer.AddrInfo{ID: id}) }
	}
	if p.Heartbeat*ttlHeartbeats > caps.MaxTTL {
		return nil, fmt.Errorf("heartbeat %v too long: vectors would outlive %v", p.Heartbeat, caps.MaxTTL)
	}
	a := &Announcer{
		h: h, key: key, src: src, reg: reg, params: p, ps: ps,
		val:      newValidator(p.Now, p.Heartbeat),
		trigger:  make(chan struct{}, 1),
		syncQ:    make(chan peer.ID, syncQueue),
		serve:    syncLimiter{last: window.Keyed[peer.ID]{Length: syncServeWindow, Max: syncServeBurst, Cap: maxSyncClients}},
		contactQ: make(chan peer.ID, contactQueue),
		queued:   make(map[peer.ID]bool),
		failures: make(map[peer.ID]int),
		born:     time.Now(),
		// Start the seq at the wall clock in ms, so a restart with the same identity keeps
		// announcing above the seq its peers remember.
		seq: uint64(max(p.Now().UnixMilli(), 1)),
	}
	a.val.self = h.ID()
	a.val.newer = func(id peer.ID, seq uint64) bool {
		have, ok := reg.Seq(id)
		return ok && have > seq
	}
	if p.Observer != nil {
		a.val.observe = func(id peer.ID, e reputation.Event) { p.Observer.Observe(id.String(), e, p.Now()) }
	}
	a.val.admit = func(author, via peer.ID) bool {
		return reg.Admit(author, registry.Heard{Via: via, Connected: a.connected(author)}, p.Now()) == registry.Stored
	}
	name := Topic(p.Mesh)
	if err := ps.RegisterTopicValidator(name, pubsub.ValidatorEx(a.val.Validate)); err != nil {
		return nil, fmt.Errorf("register validator on %s: %w", name, err)
	}
	if err := a.join(name); err != nil {
		a.release()
		return nil, err
	}
	h.SetStreamHandler(SyncProtocol(p.Mesh), a.handleSync)
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	a.Changed() // announce at start
	// Each loop exits when ctx is cancelled by Close (or its input closes), and is waited for there.
	a.wg.Add(5 + contactWorkers)
	for range contactWorkers {
		go a.contactLoop(ctx)
	}
	go a.syncLoop(ctx)
	go a.publishLoop(ctx)
	go a.receiveLoop(ctx)
	go a.joinLoop(ctx)
	go a.connectednessLoop(ctx)
	return a, nil
}

func (a *Announcer) join(name string) error {
	var err error
	if a.topic, err = a.ps.Join(name); err != nil {
		return fmt.Errorf("join %s: %w", name, err)
	}
	if a.sub, err = a.topic.Subscribe(pubsub.WithBufferSize(subscriptionBuffer)); err != nil {
		return fmt.Errorf("subscribe %s: %w", name, err)
	}
	if a.events, err = a.topic.EventHandler(); err != nil {
		return fmt.Errorf("topic events %s: %w", name, err)
	}
	if a.bus, err = a.h.EventBus().Subscribe(new(event.EvtPeerConnectednessChanged)); err != nil {
		return fmt.Errorf("subscribe to connection events: %w", err)
	}
	return nil
}

// release undoes join and the validator registration; safe on a partial join.
func (a *Announcer) release() {
	if a.bus != nil {
		a.bus.Close()
	}
	if a.events != nil {
		a.events.Cancel()
	}
	if a.sub != nil {
		a.sub.Cancel()
	}
	if a.topic != nil {
		a.topic.Close()
	}
	a.ps.UnregisterTopicValidator(Topic(a.params.Mesh))
}

// Close stops the loops and leaves the topic. It is idempotent.
func (a *Announcer) Close() error {
	if !a.closed.CompareAndSwap(false, true) {
		return nil
	}
	a.h.RemoveStreamHandler(SyncProtocol(a.params.Mesh))
	a.cancel()
	a.bus.Close() // ends connectednessLoop's channel
	a.wg.Wait()
	a.release()
	return nil
}

// Changed asks for a publish soon. Many calls fold into one.
func (a *Announcer) Changed() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// Own returns the latest vector this node published, or nil before the first.
func (a *Announcer) Own() *caps.Vector { return a.own.Load().Clone() }

// Counts returns how many incoming announcements were accepted, rejected and ignored.
func (a *Announcer) Counts() Counts { return a.val.counts() }

// Synced is the number of vectors learned through SyncProtocol.
func (a *Announcer) Synced() uint64 { return a.synced.Load() }

// Published is the number of announcements this node has published.
func (a *Announcer) Published() uint64 { return a.published.Load() }

// Contacts returns how many pending peers were contacted, and how many were dropped as
// unreachable.
func (a *Announcer) Contacts() (contacted, dropped uint64) {
	return a.contacted.Load(), a.dropped.Load()
}

// TopicPeers is the number of peers subscribed to the capability topic.
func (a *Announcer) TopicPeers() int { return len(a.topic.ListPeers()) }

// publishLoop publishes on triggers and heartbeats, never twice within MinGap: a trigger
// that arrives during the gap waits in the one-slot channel and causes one publish after it.
// Exits when ctx is done.
func (a *Announcer) publishLoop(ctx context.Context) {
	defer a.wg.Done()
	heartbeat := time.NewTicker(a.params.Heartbeat)
	defer heartbeat.Stop()
	gap := time.NewTimer(a.params.MinGap)
	defer gap.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-heartbeat.C:
			a.measureRTT(ctx)
			a.sweep(a.params.Now())
		case <-a.trigger:
		}
		if err := a.publish(ctx); err != nil && ctx.Err() == nil {
			log.Warnw("publish capability vector", "err", err)
		}
		gap.Reset(a.params.MinGap)
		select {
		case <-ctx.Done():
			return
		case <-gap.C:
		}
	}
}

// sweep records the heartbeats contacted peers missed, forgets the peers silent for too
// long and queues the pending ones for contact.
func (a *Announcer) sweep(now time.Time) {
	if a.params.Observer != nil {
		for p, n := range a.reg.Overdue(now, a.params.Heartbeat, heartbeatGrace) {
			for range n {
				a.params.Observer.Observe(p.String(), reputation.HeartbeatMissed, now)
			}
		}
	}
	for _, g := range a.reg.Sweep(now) {
		// Its last vector may still be valid: a sync answer must not bring it back.
		a.val.raise(g.Peer, g.Seq, now)
		if a.h.Network().Connectedness(g.Peer) != network.Connected {
			// Nothing else removes a peer from the peerstore: its protocols, metadata and
			// latency would stay for the life of the process (a 10-minute soak left 160
			// killed peers there, half its heap growth). Its addresses expire on their own
			// TTLs, so a node that comes back can still be dialled.
			a.h.Peerstore().RemovePeer(g.Peer)
		}
	}
	pending := a.reg.PendingPeers()
	var offered map[string]bool
	if len(pending) > 0 && len(a.h.Network().Peers()) >= a.params.ContactLowWater {
		offered = a.reg.ContactedModels(now)
	}
	for _, p := range pending {
		a.contactIfNeeded(p, offered)
	}
	a.qmu.Lock()
	for p := range a.failures { // peers no longer pending: contacted, evicted or forgotten
		if !slices.Contains(pending, p) {
			delete(a.failures, p)
		}
	}
	a.qmu.Unlock()
}

// publish signs the current vector with the next seq and publishes it.
func (a *Announcer) publish(ctx context.Context) error {
	now := a.params.Now()
	v := a.src.Vector(now)
	v.Net.RTTMS = math.Float64frombits(a.rttMS.Load())
	v.IssuedAt = now.UnixMilli()
	v.Expires = now.Add(ttlHeartbeats * a.params.Heartbeat).UnixMilli()
	a.mu.Lock()
	a.seq = max(a.seq+1, uint64(max(now.UnixMilli(), 1)))
	v.Seq = a.seq
	a.mu.Unlock()
	v.PeerID = a.h.ID().String()
	if err := v.Validate(); err != nil {
		// Peers would reject it: say so here, where it can be fixed (usually a probe that
		// cannot read /proc under its root).
		return fmt.Errorf("own capability vector is invalid: %w", err)
	}
	if err := caps.Sign(a.key, &v); err != nil {
		return err
	}
	data, err := caps.Encode(&v)
	if err != nil {
		return err
	}
	a.own.Store(&v)
	a.ownWire.Store(&data)
	if err := a.topic.Publish(ctx, data); err != nil {
		return fmt.Errorf("publish on %s: %w", a.topic, err)
	}
	a.reached.Store(int64(len(a.topic.ListPeers())))
	a.published.Add(1)
	return nil
}

// receiveLoop stores accepted vectors of other peers. Exits when ctx is done.
func (a *Announcer) receiveLoop(ctx context.Context) {
	defer a.wg.Done()
	for {
		msg, err := a.sub.Next(ctx)
		if err != nil {
			return // ctx cancelled or subscription cancelled
		}
		vec, ok := msg.ValidatorData.(*caps.Vector)
		if !ok || msg.GetFrom() == a.h.ID() {
			continue
		}
		author := msg.GetFrom()
		heard := registry.Heard{Vector: vec, Wire: msg.Data, Via: msg.ReceivedFrom, Connected: a.connected(author)}
		if a.reg.Put(author, heard, a.params.Now()) == registry.Stored {
			a.contactLater(author)
		}
	}
}

// connected reports whether a direct connection to p exists now.
func (a *Announcer) connected(p peer.ID) bool {
	return a.h.Network().Connectedness(p) == network.Connected
}

// contactLater queues p to be contacted if the registry holds it pending and it is not
// queued yet. A full queue drops it; the next heartbeat queues it again.
//
// A pending peer is contacted only while it is needed: this node has fewer than
// ContactLowWater connections, or the peer offers a model no contacted peer offers. So a node
// of a large mesh connects to enough peers to route well and to every model there is, not to
// every peer it hears of.
func (a *Announcer) contactLater(p peer.ID) {
	a.contactIfNeeded(p, nil)
}

// contactIfNeeded is contactLater with the models of contacted peers already gathered (nil:
// gathered here, if needed).
func (a *Announcer) contactIfNeeded(p peer.ID, offered map[string]bool) {
	if !a.reg.Pending(p) || !a.needed(p, offered) {
		return
	}
	a.qmu.Lock()
	defer a.qmu.Unlock()
	if a.queued[p] {
		return
	}
	select {
	case a.contactQ <- p:
		a.queued[p] = true
	default:
	}
}

// needed reports whether pending peer p is worth a connection: this node has fewer than
// ContactLowWater connections, or p offers a model no contacted peer offers (offered: the
// contacted peers' models, gathered here when nil).
func (a *Announcer) needed(p peer.ID, offered map[string]bool) bool {
	if len(a.h.Network().Peers()) < a.params.ContactLowWater {
		return true
	}
	if offered == nil {
		offered = a.reg.ContactedModels(a.params.Now())
	}
	return a.reg.OffersOtherModels(p, offered)
}

// contactLoop connects to pending peers: one that answers becomes contacted (a routing
// candidate); one that cannot be reached is dropped from the registry, refused for a while,
// and its last vector cannot come back through sync. Exits when ctx is done.
func (a *Announcer) contactLoop(ctx context.Context) {
	defer a.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-a.contactQ:
			tried := a.contact(ctx, p)
			a.qmu.Lock()
			delete(a.queued, p)
			a.qmu.Unlock()
			if tried && ctx.Err() == nil {
				a.refill()
			}
		}
	}
}

// refill queues the pending peers whose contact never failed, if this node is short of
// connections: after a contact ended, the place it held may go to a peer skipped meanwhile
// (contacts under way had filled the low water), and after a connection closed, the place
// it leaves, both now instead of at the next heartbeat. A peer whose contact failed waits
// for the heartbeat, so no peer is tried twice between two.
func (a *Announcer) refill() {
	if len(a.h.Network().Peers()) >= a.params.ContactLowWater {
		return
	}
	for _, p := range a.reg.PendingPeers() {
		a.qmu.Lock()
		failed := a.failures[p] > 0
		a.qmu.Unlock()
		if !failed {
			a.contactIfNeeded(p, nil)
		}
	}
}

// contact connects to pending peer p if it is still needed: through Params.Contact, and
// when that fails through Params.Lookup too if p offers a model no contacted peer offers, or
// if this is p's last attempt before it is dropped (a peer none of this node's neighbours
// knows is not dropped unless the DHT cannot find it either). Contacts under way count as
// the connections they will make, so the workers together do not overshoot ContactLowWater.
// It reports whether it tried.
func (a *Announcer) contact(ctx context.Context, p peer.ID) bool {
	if !a.reg.Pending(p) {
		return false // connected meanwhile, or gone
	}
	rare := a.reg.OffersOtherModels(p, a.reg.ContactedModels(a.params.Now()))
	conns := len(a.h.Network().Peers())
	a.qmu.Lock()
	short := conns+a.dialing < a.params.ContactLowWater
	if short || rare {
		a.dialing++
	}
	last := a.failures[p]+1 >= contactAttempts
	a.qmu.Unlock()
	if !short && !rare {
		return false // no longer needed, or contacts under way will fill the low water
	}
	defer func() {
		a.qmu.Lock()
		a.dialing--
		a.qmu.Unlock()
	}()
	cctx, cancel := context.WithTimeout(ctx, contactTimeout)
	err := a.params.Contact(cctx, p)
	if err != nil && (rare || last) && a.params.Lookup != nil && cctx.Err() == nil {
		err = a.params.Lookup(cctx, p)
	}
	cancel()
	if ctx.Err() != nil {
		return true
	}
	if err == nil {
		a.reg.SetConnected(p, true)
		a.contacted.Add(1)
		a.qmu.Lock()
		delete(a.failures, p)
		a.qmu.Unlock()
		return true
	}
	a.qmu.Lock()
	a.failures[p]++
	tries := a.failures[p]
	if tries >= contactAttempts {
		delete(a.failures, p)
	}
	a.qmu.Unlock()
	if tries < contactAttempts {
		log.Debugw("pending peer not reached; tried again at the next heartbeat", "peer", p, "try", tries, "err", err)
		return true
	}
	log.Debugw("pending peer unreachable; dropped", "peer", p, "err", err)
	now := a.params.Now()
	seq, _ := a.reg.Seq(p)
	a.reg.Unreachable(p, now)
	a.val.raise(p, seq, now)
	a.dropped.Add(1)
	return true
}

// joinLoop re-announces when a peer joins the topic. Exits when ctx is done.
func (a *Announcer) joinLoop(ctx context.Context) {
	defer a.wg.Done()
	for {
		ev, err := a.events.NextPeerEvent(ctx)
		if err != nil {
			return
		}
		if ev.Type == pubsub.PeerJoin {
			// Our vector reaches the newcomer through its sync from us; re-announce only
			// while we are the newcomer: when no announcement of ours has reached anyone
			// yet, and once more when announceReach peers can hear it (see there), so a
			// join costs the mesh an announcement or two, not one from every neighbour.
			if reached := a.reached.Load(); reached == 0 ||
				reached < announceReach && a.published.Load() < rateBurst && len(a.topic.ListPeers()) >= announceReach {
				a.Changed()
			}
			select {
			case a.syncQ <- ev.Peer:
			default: // queue full: the heartbeat will bring the rest
			}
		}
	}
}

// connectednessLoop mirrors libp2p connection events into the registry, so a clean
// disconnect shows at once, and refills a low water a disconnect left short. Exits when the
// event subscription is closed by Close.
func (a *Announcer) connectednessLoop(ctx context.Context) {
	defer a.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-a.bus.Out():
			if !ok {
				return
			}
			ev := e.(event.EvtPeerConnectednessChanged)
			a.reg.SetConnected(ev.Peer, ev.Connectedness == network.Connected)
			if ev.Connectedness != network.Connected {
				a.refill()
			}
		}
	}
}

// measureRTT pings up to pingPeers connected peers and keeps the median RTT.
func (a *Announcer) measureRTT(ctx context.Context) {
	peers := a.h.Network().Peers()
	if len(peers) > pingPeers {
		peers = peers[:pingPeers]
	}
	rtts := make([]time.Duration, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, pingTimeout)
			defer cancel()
			select {
			case res := <-ping.Ping(pctx, a.h, p):
				if res.Error == nil {
					rtts[i] = res.RTT
				}
			case <-pctx.Done():
			}
		})
	}
	wg.Wait()
	rtts = slices.DeleteFunc(rtts, func(d time.Duration) bool { return d <= 0 })
	if len(rtts) == 0 {
		return
	}
	slices.Sort(rtts)
	med := rtts[len(rtts)/2]
	a.rttMS.Store(math.Float64bits(float64(med.Microseconds()) / 1000))
}
