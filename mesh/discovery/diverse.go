package discovery

import (
	"cmp"
	"context"
	"net/netip"
	"slices"
	"time"

	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p-kad-dht/amino"
	"github.com/libp2p/go-libp2p-kbucket/peerdiversity"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// Eclipse protection (docs/reliability.md F12). An attacker that wants to cut a node off
// the honest mesh fills its connection slots with its own peers; the connection manager
// then trims down to its low water mark, and honest peers can be among the connections it
// closes. Two defences live here:
//
//   - Diverse outbound connections are protected from trimming: up to DiverseSlots peers
//     this node dialled itself, each in a different network group (an IPv4 /24, an IPv6
//     /48). Outbound, because an attacker chooses whom it dials to us but not whom we dial;
//     diverse, because one operator's addresses usually sit in a few such groups; the
//     longest-held first, because a connection made before an attack began is the one the
//     attacker did not arrange. Whatever floods in, these stay, and with them a route to the
//     honest mesh (GossipSub keeps D_out = 2 outbound peers in its mesh on top of this).
//   - The DHT's routing table takes at most amino's 2 peers per IP group per bucket and 3
//     per table (DHTDiversityFilter), so one operator's addresses cannot fill the table a
//     lookup starts from.
//
// Bootstrap peers are protected too (protectTag), and the node allowlists their addresses
// in the resource manager.
const (
	// DefaultDiverseSlots is how many diverse outbound connections are protected: eight, an
	// eighth of the default low water mark (64), so the trimming the connection manager
	// exists for still has most connections to choose from, and more than GossipSub's
	// D_out (2) plus the few DHT peers a lookup needs.
	DefaultDiverseSlots = 8
	// diverseTag marks the protections this file makes in the connection manager.
	diverseTag = "meshinfer-diverse"
	// ipv4GroupBits and ipv6GroupBits size a network group: a /24, the smallest block
	// routed on the internet and what one hosting customer usually gets; a /48, one IPv6
	// site.
	ipv4GroupBits = 24
	ipv6GroupBits = 48
	// diverseRecheck is how often the protected set is recomputed besides on connection
	// events: a second connection to a peer already connected raises no event.
	diverseRecheck = 30 * time.Second
)

// outbound is an outbound connection as the choice of protected peers sees it.
type outbound struct {
	peer   peer.ID
	group  netip.Prefix
	opened time.Time
}

// groupOf is the network group of a connection's remote address; false for an address
// without an IP (a relayed connection is the relay's address, and is skipped by the caller).
func groupOf(a ma.Multiaddr) (netip.Prefix, bool) {
	ip, err := manet.ToIP(a)
	if err != nil {
		return netip.Prefix{}, false
	}
	addr, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Prefix{}, false
	}
	addr = addr.Unmap()
	bits := ipv6GroupBits
	if addr.Is4() {
		bits = ipv4GroupBits
	}
	p, err := addr.Prefix(bits)
	return p, err == nil
}

// chooseDiverse picks at most slots peers to protect out of conns, no two in one network
// group: the peers protected now first (so protection does not churn), then the oldest
// connections. conns holds one entry per peer. A pure function of its inputs.
func chooseDiverse(conns []outbound, protected map[peer.ID]bool, slots int) map[peer.ID]bool {
	conns = slices.Clone(conns)
	slices.SortFunc(conns, func(a, b outbound) int {
		if protected[a.peer] != protected[b.peer] {
			if protected[a.peer] {
				return -1
			}
			return 1
		}
		return cmp.Or(a.opened.Compare(b.opened), cmp.Compare(a.peer, b.peer))
	})
	out := make(map[peer.ID]bool, slots)
	used := make(map[netip.Prefix]bool, slots)
	for _, c := range conns {
		if len(out) >= slots {
			break
		}
		if used[c.group] {
			continue
		}
		out[c.peer], used[c.group] = true, true
	}
	return out
}

// outboundConns lists, per peer, the oldest direct outbound connection.
func outboundConns(h host.Host) []outbound {
	oldest := make(map[peer.ID]outbound)
	for _, c := range h.Network().Conns() {
		st := c.Stat()
		if st.Direction != network.DirOutbound || st.Limited {
			continue
		}
		if _, err := c.RemoteMultiaddr().ValueForProtocol(ma.P_CIRCUIT); err == nil {
			continue
		}
		g, ok := groupOf(c.RemoteMultiaddr())
		if !ok {
			continue
		}
		p := c.RemotePeer()
		if o, ok := oldest[p]; !ok || st.Opened.Before(o.opened) {
			oldest[p] = outbound{peer: p, group: g, opened: st.Opened}
		}
	}
	out := make([]outbound, 0, len(oldest))
	for _, o := range oldest {
		out = append(out, o)
	}
	return out
}

// diverseLoop keeps DiverseSlots diverse outbound connections protected, recomputing on
// every connection event and every diverseRecheck. It owns sub and closes it; it exits
// when ctx is cancelled by Close.
func (d *Discovery) diverseLoop(ctx context.Context, sub event.Subscription) {
	defer d.wg.Done()
	defer sub.Close()
	tick := time.NewTicker(diverseRecheck)
	defer tick.Stop()
	protected := map[peer.ID]bool{}
	cm := d.h.ConnManager()
	for {
		next := chooseDiverse(outboundConns(d.h), protected, d.params.DiverseSlots)
		for p := range protected {
			if !next[p] {
				cm.Unprotect(p, diverseTag)
			}
		}
		for p := range next {
			if !protected[p] {
				cm.Protect(p, diverseTag)
			}
		}
		protected = next
		d.diverse.Store(int64(len(protected)))
		select {
		case <-ctx.Done():
			return
		case <-sub.Out():
		case <-tick.C:
		}
	}
}

// Diverse is how many outbound connections are protected as diverse now.
func (d *Discovery) Diverse() int { return int(d.diverse.Load()) }

// DHTDiversityFilter returns the routing-table diversity filter for a DHT on h
// (dht.RoutingTablePeerDiversityFilter): kad-dht's, with amino's limits of 2 peers per IP
// group per bucket and 3 per table (an IPv4 /16 or legacy /8, an IPv6 ASN), except for
// loopback and private groups. Those cannot come from a remote attacker (the filter judges
// the addresses of live connections, not what a peer claims), and a LAN mesh or a testnet
// has all its peers in one of them: limited, its DHT would hold three peers.
//
// kad-dht also drops lookup answers crowded into one IP group when its own filter is in
// place; it recognizes only its own type, so with this wrapper that second check is off.
func DHTDiversityFilter(h host.Host) peerdiversity.PeerIPGroupFilter {
	return localExempt{dht.NewRTPeerDiversityFilter(h, amino.DefaultMaxPeersPerIPGroupPerCpl, amino.DefaultMaxPeersPerIPGroup)}
}

// localExempt is a diversity filter that always allows loopback and private IP groups.
type localExempt struct {
	peerdiversity.PeerIPGroupFilter
}

func (f localExempt) Allow(g peerdiversity.PeerGroupInfo) bool {
	// An IPv4 group key is the group's base address ("192.168.0.0"); IPv6 keys are ASNs.
	if a, err := netip.ParseAddr(string(g.IPGroupKey)); err == nil && (a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast()) {
		return true
	}
	return f.PeerIPGroupFilter.Allow(g)
}
