package discovery

import (
	"net"
	"net/netip"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// What a found peer can make this node dial.
//
// A rendezvous record is a DHT provider record that anyone can publish, with any addresses,
// an mDNS answer is whatever a machine on the LAN says, and a connected peer's answer to
// Contact's question (contact.go) whatever that peer says: all would otherwise steer this
// node's dials at will. So of a found peer's addresses this node dials only those that pass
// dialable, at most maxAddrsPerPeer of them, and a rendezvous round dials at most
// maxDialsPerRound peers. Operator-given bootstrap addresses are dialled as given.
//
// An address passes when all of these hold:
//   - it starts with an IP address: a DNS name resolves to anything, past this filter;
//   - the IP is a unicast address this node can reach (below), not unspecified, multicast,
//     broadcast or link-local (which needs a zone no record can name);
//   - its port (TCP or UDP) is not 0;
//   - one of this node's transports dials it (go-libp2p's swarm decides: TCP and QUIC,
//     circuit relay where it is on; the swarm also drops this node's own addresses).
//
// Reach follows the addresses this node listens on (reach):
//   - loopback addresses only when it listens on a loopback address itself (a testnet on
//     one machine): a node listening on every interface is not steered at services on its
//     own machine;
//   - private addresses (RFC 1918, IPv6 unique local, 100.64.0.0/10 shared space) when it
//     listens on a private address or on every interface (0.0.0.0, ::), or listens nowhere;
//   - public addresses unless it listens on loopback addresses only.

// Bounds on what a found peer makes this node dial.
const (
	// maxAddrsPerPeer bounds the addresses of one found peer that this node dials: a node
	// listening on TCP and QUIC over IPv4 and IPv6, with an external address of each, has 8.
	maxAddrsPerPeer = 8
	// maxDialsPerRound bounds the peers one rendezvous round dials; the next round (or
	// GossipSub and the DHT, which find peers on their own) goes on from there.
	maxDialsPerRound = 8
)

// reach is which scopes of address this node dials found peers at.
type reach struct {
	loopback, private, public bool
}

// reachOf is the reach of a node listening on listen.
func reachOf(listen []ma.Multiaddr) reach {
	var r reach
	anyIP := false
	for _, a := range listen {
		ip, err := manet.ToIP(a)
		if err != nil {
			continue
		}
		anyIP = true
		switch {
		case ip.IsLoopback():
			r.loopback = true
		case ip.IsUnspecified():
			r.private, r.public = true, true
		case isPrivate(ip):
			r.private, r.public = true, true
		default:
			r.public = true
		}
	}
	if !anyIP { // listens nowhere: it still dials out, as a node on every interface would
		r.private, r.public = true, true
	}
	return r
}

// dialable keeps the addresses of a found peer that this node dials (see above), at most
// maxAddrsPerPeer, in their order. canDial reports whether one of this node's transports
// dials an address (the swarm's CanDial); nil: any.
func (r reach) dialable(p peer.ID, addrs []ma.Multiaddr, canDial func(peer.ID, ma.Multiaddr) bool) []ma.Multiaddr {
	var out []ma.Multiaddr
	for _, a := range addrs {
		if len(out) == maxAddrsPerPeer {
			break
		}
		if r.allows(a) && (canDial == nil || canDial(p, a)) {
			out = append(out, a)
		}
	}
	return out
}

// allows checks an address's IP and port against r.
func (r reach) allows(a ma.Multiaddr) bool {
	if len(a) == 0 {
		return false
	}
	switch a[0].Code() {
	case ma.P_IP4, ma.P_IP6:
	default:
		return false // DNS names, unix sockets, anything not an IP address first
	}
	ip, err := manet.ToIP(a)
	if err != nil {
		return false
	}
	port := ""
	if len(a) > 1 {
		switch a[1].Code() {
		case ma.P_TCP, ma.P_UDP:
			port = a[1].Value()
		}
	}
	if port == "" || port == "0" {
		return false
	}
	switch {
	case ip.IsUnspecified(), ip.IsMulticast(), ip.IsLinkLocalUnicast(), ip.Equal(net.IPv4bcast):
		return false
	case ip.IsLoopback():
		return r.loopback
	case isPrivate(ip):
		return r.private
	}
	return r.public
}

// shared is 100.64.0.0/10, the shared address space of carrier-grade NAT and overlay
// networks: reachable like a private network, not from the internet.
var shared = netip.MustParsePrefix("100.64.0.0/10")

// isPrivate reports whether ip is in a private range: RFC 1918, IPv6 unique local, or the
// shared address space.
func isPrivate(ip net.IP) bool {
	if ip.IsPrivate() {
		return true
	}
	a, ok := netip.AddrFromSlice(ip)
	return ok && shared.Contains(a.Unmap())
}
