package node

import (
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/node/console"
)

// Status is the snapshot served at /api/status.
func (n *Node) Status() console.Status {
	now := n.cfg.Now()
	roles := []string{string(RoleContributor)}
	for _, r := range n.cfg.Roles {
		if r != RoleContributor {
			roles = append(roles, string(r))
		}
	}
	var addrs []string
	for _, a := range n.P2PAddrs() {
		addrs = append(addrs, a.String())
	}
	entries := n.reg.Entries(now)
	known, stale := 0, 0
	for _, e := range entries {
		if !e.Contacted {
			continue
		}
		known++
		if e.Stale {
			stale++
		}
	}
	connected := 0
	for _, p := range n.host.Network().Peers() {
		if n.host.Network().Connectedness(p) == network.Connected {
			connected++
		}
	}
	c := n.announcer.Counts()
	contacted, dropped := n.announcer.Contacts()
	rs := n.rep.Stats(now)
	inf := console.Inference{API: n.APIAddr(), Models: append([]string{}, n.cfg.Models...)}
	if n.infer != nil {
		st := n.infer.Stats()
		inf.InFlight, inf.Served, inf.Failed = st.InFlight, st.Served, st.Failed
		inf.Overloaded, inf.ClientDisconnected, inf.Moved = st.Overloaded, st.ClientDisconnected, st.Moved
	}
	var routing console.Routing
	migration := console.Migration{Decisions: map[string]uint64{}, Recent: []console.MigrationDecision{}}
	if n.exec != nil {
		routing, migration = n.exec.Routing(), n.exec.Migration()
		gs := n.gate.Stats()
		routing.LocalOnly = console.LocalOnly{Served: gs.Served, Refused: gs.Refused, Failed: gs.Failed}
	}
	return console.Status{
		Inference:     inf,
		Routing:       routing,
		Participation: n.part.status(),
		WebRTC:        n.webrtcStatus(),
		Pipelines:     n.pipelinesStatus(),
		Migration:     migration,
		RoutingAffinity: console.RoutingAffinity{TargetReputation: console.TargetReputation{
			PenalizedTargets: rs.PenalizedTargets, RoutesPenalized: rs.RoutesPenalized,
			CoolingTargets: rs.CoolingTargets, ExcludedPeers: rs.ExcludedPeers,
		}},
		NodeID:      n.host.ID().String(),
		Version:     n.cfg.Version,
		Roles:       roles,
		ListenAddrs: addrs,
		UptimeS:     now.Sub(n.started).Seconds(),
		Ready:       n.Ready(),
		Capability:  n.announcer.Own(),
		Mesh: console.Mesh{
			Name:           n.cfg.Mesh,
			PeersConnected: connected,
			PeersKnown:     known,
			PeersPending:   len(entries) - known,
			PeersStale:     stale,
			TopicPeers:     n.announcer.TopicPeers(),
			DHTPeers:       n.dht.RoutingTable().Size(),
		},
		Announcements: console.Announcements{
			Published:   n.announcer.Published(),
			Accepted:    c.Accepted,
			Rejected:    c.Rejected,
			Ignored:     c.Ignored,
			RateLimited: c.RateLimited,
			Synced:      n.announcer.Synced(),
			Contacted:   contacted,
			Dropped:     dropped,
			Refused:     n.reg.Counts(),
		},
	}
}

// Peers is the snapshot served at /api/peers.
func (n *Node) Peers() []console.Peer {
	now := n.cfg.Now()
	entries := n.reg.Entries(now)
	out := make([]console.Peer, 0, len(entries))
	for _, e := range entries {
		reason, changed, _ := n.rep.LastChange(e.Peer.String())
		out = append(out, console.Peer{
			ScoreReason:    reason,
			ScoreChangedAt: rfc3339(changed),
			PeerID:         e.Peer.String(),
			Connected:      e.Connected,
			Contacted:      e.Contacted,
			Stale:          e.Stale,
			AgeS:           e.Age(now).Seconds(),
			Score:          n.rep.Score(e.Peer.String(), now),
			Excluded:       n.rep.Excluded(e.Peer.String(), now),
			Capability:     e.Vector,
			Conns:          n.connsTo(e.Peer),
		})
		last := &out[len(out)-1]
		last.BandwidthMbps, last.BandwidthMeasuredAt = n.peerBandwidth(e.Peer)
	}
	return out
}

// rfc3339 formats t in UTC, or "" for the zero time.
func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// connsTo describes the open connections to p.
func (n *Node) connsTo(p peer.ID) []console.Conn {
	conns := n.host.Network().ConnsToPeer(p)
	out := make([]console.Conn, 0, len(conns))
	for _, c := range conns {
		st, cs := c.Stat(), c.ConnState()
		out = append(out, console.Conn{
			Transport: cs.Transport, Muxer: string(cs.StreamMultiplexer), Security: string(cs.Security),
			Direction: st.Direction.String(), Limited: st.Limited,
		})
	}
	return out
}
