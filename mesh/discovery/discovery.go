// Package discovery finds other nodes of this node's mesh and connects to them, from four
// sources:
//
//   - bootstrap peers given by the operator (--bootstrap), dialled at start and redialled
//     while this node has fewer than LowWater connections;
//   - rendezvous: the mesh's namespace ("meshinfer/<mesh>") advertised and looked up through
//     a content-routing Discovery (the node passes one built on its /meshinfer Kademlia DHT);
//   - mDNS on the local network, under the service name "meshinfer-<mesh>";
//   - whatever else connects to us (GossipSub and the DHT learn peers on their own).
//
// Against eclipse attacks (diverse.go), it protects up to DiverseSlots outbound connections
// in distinct network groups from the connection manager's trimming, and supplies the DHT's
// routing-table diversity filter.
//
// A peer found by rendezvous or mDNS is dialled only at the addresses that filter.go allows:
// a few, of IP scopes this node reaches as it listens, and a bounded number of peers per
// rendezvous round.
//
// Contact (contact.go) connects to one peer this node heard of through others, at addresses
// its connected peers give, under the same filter and without a walk through the DHT.
//
// Every network call carries a timeout. All loops are owned by the Discovery: started in New,
// stopped and waited for by Close.
//
// It must not import transport, inference or node.
package discovery

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	logging "github.com/ipfs/go-log/v2"
	"github.com/libp2p/go-libp2p/core/discovery"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/discovery/mdns"
	ma "github.com/multiformats/go-multiaddr"
)

var log = logging.Logger("mesh/discovery")

// Defaults and bounds.
const (
	// DialTimeout bounds one connection attempt (TCP/QUIC handshake, security, muxer).
	DialTimeout = 10 * time.Second
	// RoutingTimeout bounds one DHT advertise or lookup.
	RoutingTimeout = 30 * time.Second
	// DefaultLowWater is how many connections discovery works towards; above it, it only
	// keeps advertising. Matches the connection manager's low water mark.
	DefaultLowWater = 16
	// DefaultInterval is the longest pause between two rendezvous rounds and bootstrap checks.
	// The first rounds come faster (from minInterval, doubling) so a new node fills up quickly.
	DefaultInterval = 2 * time.Minute
	minInterval     = 2 * time.Second
	// foundQueue bounds peers found by mDNS waiting to be dialled; beyond it they are dropped
	// (mDNS repeats itself).
	foundQueue = 64
	// protectTag keeps bootstrap connections out of the connection manager's trimming.
	protectTag = "meshinfer-bootstrap"
)

// Params configures discovery.
type Params struct {
	Mesh       string              // mesh name; selects the rendezvous namespace and mDNS service
	Bootstrap  []peer.AddrInfo     // operator-given peers
	Rendezvous discovery.Discovery // nil disables rendezvous
	MDNS       bool                // browse and answer mDNS on the LAN
	LowWater   int                 // DefaultLowWater when 0
	Interval   time.Duration       // DefaultInterval when 0
	// DiverseSlots is how many outbound connections in distinct network groups are kept
	// safe from trimming (diverse.go): DefaultDiverseSlots when 0, none when negative.
	DiverseSlots int
}

// Namespace is the rendezvous namespace of a mesh.
func Namespace(mesh string) string { return "meshinfer/" + mesh }

// Discovery runs the discovery loops of one node.
type Discovery struct {
	h      host.Host
	params Params
	mdns   mdns.Service
	found  chan peer.AddrInfo

	bootstrapped atomic.Bool
	diverse      atomic.Int64 // outbound connections protected as diverse

	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// New starts discovery. Close stops it.
func New(h host.Host, p Params) (*Discovery, error) {
	if p.LowWater <= 0 {
		p.LowWater = DefaultLowWater
	}
	if p.Interval <= 0 {
		p.Interval = DefaultInterval
	}
	if p.DiverseSlots == 0 {
		p.DiverseSlots = DefaultDiverseSlots
	}
	for _, ai := range p.Bootstrap {
		if ai.ID == h.ID() {
			return nil, fmt.Errorf("bootstrap peer %s is this node itself", ai.ID)
		}
	}
	d := &Discovery{h: h, params: p, found: make(chan peer.AddrInfo, foundQueue)}
	if len(p.Bootstrap) == 0 {
		d.bootstrapped.Store(true)
	}
	// Protected before New returns, so a connection the DHT opens first is protected too.
	for _, ai := range p.Bootstrap {
		h.ConnManager().Protect(ai.ID, protectTag)
	}
	var conns event.Subscription
	if p.DiverseSlots > 0 {
		var err error
		if conns, err = h.EventBus().Subscribe(new(event.EvtPeerConnectednessChanged)); err != nil {
			return nil, fmt.Errorf("subscribe to connection events: %w", err)
		}
	}
	if p.MDNS {
		d.mdns = mdns.NewMdnsService(h, "meshinfer-"+p.Mesh, notifee{d.found})
		if err := d.mdns.Start(); err != nil {
			if conns != nil {
				conns.Close()
			}
			return nil, fmt.Errorf("start mdns: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	// Each loop ends when Close cancels ctx.
	d.wg.Add(2)
	go d.bootstrapLoop(ctx)
	go d.foundLoop(ctx)
	if conns != nil {
		d.wg.Add(1)
		go d.diverseLoop(ctx, conns)
	}
	if p.Rendezvous != nil {
		d.wg.Add(1)
		go d.rendezvousLoop(ctx)
	}
	return d, nil
}

// Close stops every loop and mDNS. It is idempotent.
func (d *Discovery) Close() error {
	var err error
	d.once.Do(func() {
		if d.mdns != nil {
			err = d.mdns.Close()
		}
		d.cancel()
		d.wg.Wait()
	})
	return err
}

// Bootstrapped reports whether this node has reached at least one bootstrap peer (always true
// when none are configured).
func (d *Discovery) Bootstrapped() bool { return d.bootstrapped.Load() }

// bootstrapLoop dials the bootstrap peers at start and again, with backoff, whenever the node
// is below LowWater connections and a bootstrap peer is not connected.
func (d *Discovery) bootstrapLoop(ctx context.Context) {
	defer d.wg.Done()
	if len(d.params.Bootstrap) == 0 {
		return
	}
	wait := minInterval
	for {
		if len(d.h.Network().Peers()) < d.params.LowWater {
			d.dialBootstrap(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, d.params.Interval)
	}
}

func (d *Discovery) dialBootstrap(ctx context.Context) {
	var wg sync.WaitGroup
	for _, ai := range d.params.Bootstrap {
		if d.h.Network().Connectedness(ai.ID) == network.Connected {
			d.bootstrapped.Store(true)
			continue
		}
		wg.Go(func() {
			if err := d.connect(ctx, ai); err != nil {
				if ctx.Err() == nil {
					log.Warnw("bootstrap peer unreachable; will retry", "peer", ai.ID, "err", err)
				}
				return
			}
			d.bootstrapped.Store(true)
			log.Infow("connected to bootstrap peer", "peer", ai.ID)
		})
	}
	wg.Wait()
}

// rendezvousLoop advertises the mesh namespace and connects to peers found under it.
func (d *Discovery) rendezvousLoop(ctx context.Context) {
	defer d.wg.Done()
	ns := Namespace(d.params.Mesh)
	wait := minInterval
	var nextAdvertise time.Time
	for {
		if time.Now().After(nextAdvertise) {
			actx, cancel := context.WithTimeout(ctx, RoutingTimeout)
			ttl, err := d.params.Rendezvous.Advertise(actx, ns)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				log.Debugw("rendezvous advertise failed; will retry", "err", err)
			} else {
				// Re-advertise at 7/8 of the record's lifetime, as go-libp2p's util.Advertise does.
				nextAdvertise = time.Now().Add(ttl * 7 / 8)
			}
		}
		if len(d.h.Network().Peers()) < d.params.LowWater {
			d.findAndConnect(ctx, ns)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, d.params.Interval)
	}
}

func (d *Discovery) findAndConnect(ctx context.Context, ns string) {
	fctx, cancel := context.WithTimeout(ctx, RoutingTimeout)
	defer cancel()
	ch, err := d.params.Rendezvous.FindPeers(fctx, ns, discovery.Limit(d.params.LowWater*2))
	if err != nil {
		log.Debugw("rendezvous lookup failed; will retry", "err", err)
		return
	}
	dials := 0
	for ai := range ch {
		if dials >= maxDialsPerRound || len(d.h.Network().Peers()) >= d.params.LowWater {
			continue // drain the channel so the lookup can finish
		}
		if ai.ID == d.h.ID() || d.h.Network().Connectedness(ai.ID) == network.Connected {
			continue
		}
		if ai.Addrs = dialable(d.h, ai); len(ai.Addrs) == 0 {
			continue
		}
		dials++
		if err := d.connect(ctx, ai); err != nil && ctx.Err() == nil {
			log.Debugw("rendezvous peer unreachable", "peer", ai.ID, "err", err)
		}
	}
}

// dialable is what h dials of a found peer's addresses (filter.go).
func dialable(h host.Host, ai peer.AddrInfo) []ma.Multiaddr {
	var canDial func(peer.ID, ma.Multiaddr) bool
	if sw, ok := h.Network().(interface {
		CanDial(peer.ID, ma.Multiaddr) bool
	}); ok {
		canDial = sw.CanDial
	}
	return reachOf(h.Network().ListenAddresses()).dialable(ai.ID, ai.Addrs, canDial)
}

// foundLoop dials peers announced by mDNS.
func (d *Discovery) foundLoop(ctx context.Context) {
	defer d.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case ai := <-d.found:
			if ai.ID == d.h.ID() || d.h.Network().Connectedness(ai.ID) == network.Connected {
				continue
			}
			if ai.Addrs = dialable(d.h, ai); len(ai.Addrs) == 0 {
				continue
			}
			if err := d.connect(ctx, ai); err != nil && ctx.Err() == nil {
				log.Debugw("mdns peer unreachable", "peer", ai.ID, "err", err)
			}
		}
	}
}

func (d *Discovery) connect(ctx context.Context, ai peer.AddrInfo) error {
	cctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	if err := d.h.Connect(cctx, ai); err != nil {
		return fmt.Errorf("connect %s: %w", ai.ID, err)
	}
	return nil
}

// notifee queues peers found by mDNS; it never blocks mDNS.
type notifee struct{ found chan<- peer.AddrInfo }

func (n notifee) HandlePeerFound(ai peer.AddrInfo) {
	select {
	case n.found <- ai:
	default:
	}
}
