package node

import (
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	quic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// Resource manager limits. They are explicit rather than go-libp2p's auto-scaled defaults so
// a reader knows what one node will hold, and sized for a desktop contributor: a few hundred
// peers, a few thousand streams (token streams are long-lived), memory a laptop can spare.
// Scopes not named here (services, protocols, single streams) keep go-libp2p's defaults.
const (
	limitSystemConns     = 512      // all connections
	limitSystemConnsIn   = 256      // inbound connections: half, so inbound floods cannot starve our own dials
	limitSystemStreams   = 8192     // all streams
	limitSystemStreamsIn = 4096     // inbound streams
	limitSystemFD        = 512      // file descriptors for sockets
	limitSystemMemory    = 1 << 30  // bytes reserved by muxers and protocols (1 GiB)
	limitPeerStreams     = 512      // streams per peer
	limitPeerStreamsIn   = 256      // inbound streams per peer (docs/reliability.md L2 bounds an attacker)
	limitPeerConns       = 8        // connections per peer (TCP + QUIC + relayed, with slack)
	limitPeerMemory      = 64 << 20 // bytes per peer (64 MiB)
)

// Per-IP connection caps (docs/reliability.md L3, F11, F12): connections, inbound and
// outbound alike, counted against the remote address by the resource manager, which
// refuses one more before the security handshake. An attacker's identities are free, its
// addresses are not: filling the 256 inbound slots takes 32 IPv4 addresses, not one
// machine. Loopback is exempt (go-libp2p's own default) unless Config.LimitLoopback. There
// is no cap per /24: a LAN mesh has all its nodes in one, and a bootstrap node on it is
// dialled by every one of them.
const (
	// limitConnsPerIPv4 per IPv4 address: go-libp2p's default, made explicit. A node holds
	// up to two connections to a peer (TCP and QUIC while a dial race settles), so one
	// address carries four nodes behind a NAT, a household's or an office's.
	limitConnsPerIPv4 = 8
	// limitConnsPerIPv6Site per IPv6 /56 (one subscriber's site) and limitConnsPerIPv6Net
	// per /48: go-libp2p's defaults. An IPv6 subscriber gets a whole /56 or /64s, so one
	// address means nothing there.
	limitConnsPerIPv6Site = 8
	limitConnsPerIPv6Net  = 64
)

// Circuit relay v2 limits for the bootstrap role. go-libp2p's defaults reset a relayed
// connection after 2 minutes or 128 KiB, which cuts a long token stream; these let a relayed
// request run for an hour or 64 MiB each way, while the slot counts stay at the defaults'
// scale so a relay cannot be used as a free bulk pipe.
const (
	relayDuration        = time.Hour
	relayData            = 64 << 20
	relayMaxReservations = 128
	relayMaxCircuits     = 16
)

// connGrace is how long a new connection is safe from the connection manager's trimming.
const connGrace = 30 * time.Second

// newHost builds the libp2p host: TCP and QUIC, Noise and TLS, yamux on TCP, the resource
// manager and connection manager, and (unless cfg.Loopback) AutoNAT, hole punching and the
// relay client. The bootstrap role adds the relay service and the AutoNAT
// service.
func newHost(cfg Config, key crypto.PrivKey) (host.Host, error) {
	rm, err := newResourceManager(cfg)
	if err != nil {
		return nil, err
	}
	announce, err := parseAddrs(cfg.AnnounceAddrs)
	if err != nil {
		rm.Close()
		return nil, fmt.Errorf("announce addresses: %w", err)
	}
	cm, err := connmgr.NewConnManager(cfg.ConnsLow, cfg.ConnsHigh, connmgr.WithGracePeriod(connGrace))
	if err != nil {
		rm.Close()
		return nil, fmt.Errorf("connection manager: %w", err)
	}
	opts := []libp2p.Option{
		libp2p.Identity(key),
		libp2p.ListenAddrStrings(cfg.ListenAddrs...),
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.Transport(quic.NewTransport),
		// TLS 1.3 first (AES-GCM on the wire where the CPU has AES instructions, as Go's
		// crypto/tls picks), Noise for peers that offer only Noise.
		libp2p.Security(libp2ptls.ID, libp2ptls.New),
		libp2p.Security(noise.ID, noise.New),
		// yamux, the multiplexer every libp2p implementation speaks: it reserves its
		// receive windows (up to 16 MiB per stream) in the resource manager, so the peer
		// and system memory limits below bound what a peer's streams hold.
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.SwarmOpts(swarm.WithDialRanker(rankDials)),
		libp2p.ResourceManager(rm),
		libp2p.ConnectionManager(cm),
		libp2p.UserAgent("meshinfer/" + cfg.Version),
		libp2p.Ping(true),
		libp2p.DisableMetrics(),
	}
	if len(announce) > 0 {
		opts = append(opts, libp2p.AddrsFactory(func([]ma.Multiaddr) []ma.Multiaddr { return slices.Clone(announce) }))
	}
	if cfg.Loopback {
		// One machine: nothing to traverse, and AutoNAT probes between loopback peers only
		// cost CPU. Relay stays off too: every peer is directly reachable.
		opts = append(opts, libp2p.DisableRelay(), libp2p.ForceReachabilityPublic())
	} else {
		opts = append(opts,
			libp2p.EnableRelay(),
			libp2p.EnableHolePunching(),
			libp2p.EnableAutoNATv2(),
			libp2p.NATPortMap(),
		)
		if len(cfg.Bootstrap) > 0 {
			opts = append(opts, libp2p.EnableAutoRelayWithStaticRelays(cfg.Bootstrap))
		}
	}
	if cfg.HasRole(RoleBootstrap) {
		res := relayv2.DefaultResources()
		res.Limit = &relayv2.RelayLimit{Duration: relayDuration, Data: relayData}
		res.MaxReservations = relayMaxReservations
		res.MaxCircuits = relayMaxCircuits
		opts = append(opts, libp2p.EnableRelayService(relayv2.WithResources(res)))
		if !cfg.Loopback {
			opts = append(opts, libp2p.EnableNATService())
		}
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		// libp2p.New closes what it started on failure, except the managers we passed in.
		cm.Close()
		rm.Close()
		return nil, fmt.Errorf("start libp2p host: %w", err)
	}
	return h, nil
}

func newResourceManager(cfg Config) (network.ResourceManager, error) {
	limits := rcmgr.PartialLimitConfig{
		System: rcmgr.ResourceLimits{
			Conns:           limitSystemConns,
			ConnsInbound:    limitSystemConnsIn,
			ConnsOutbound:   limitSystemConns,
			Streams:         limitSystemStreams,
			StreamsInbound:  limitSystemStreamsIn,
			StreamsOutbound: limitSystemStreams,
			FD:              limitSystemFD,
			Memory:          limitSystemMemory,
		},
		PeerDefault: rcmgr.ResourceLimits{
			Conns:           limitPeerConns,
			ConnsInbound:    limitPeerConns,
			ConnsOutbound:   limitPeerConns,
			Streams:         limitPeerStreams,
			StreamsInbound:  limitPeerStreamsIn,
			StreamsOutbound: limitPeerStreams,
			Memory:          limitPeerMemory,
		},
	}
	concrete := limits.Build(rcmgr.DefaultLimits.AutoScale())
	// Metrics off, as for the host (libp2p.DisableMetrics does not reach a resource manager
	// passed in): otherwise every stream and memory reservation goes through the Prometheus
	// StatsTraceReporter, time.Now().Format included, and nothing ever reads it.
	opts := []rcmgr.Option{
		rcmgr.WithMetricsDisabled(),
		rcmgr.WithLimitPerSubnet(
			[]rcmgr.ConnLimitPerSubnet{{PrefixLength: 32, ConnCount: limitConnsPerIPv4}},
			[]rcmgr.ConnLimitPerSubnet{{PrefixLength: 56, ConnCount: limitConnsPerIPv6Site}, {PrefixLength: 48, ConnCount: limitConnsPerIPv6Net}},
		),
	}
	if cfg.LimitLoopback {
		// No prefix is exempt: go-libp2p's default list holds only 127.0.0.0/8 and ::1,
		// unlimited. (Its connection rate limiter keeps its own loopback exemption.)
		opts = append(opts, rcmgr.WithNetworkPrefixLimit([]rcmgr.NetworkPrefixLimit{}, []rcmgr.NetworkPrefixLimit{}))
	}
	if allow := bootstrapAllowlist(cfg.Bootstrap); len(allow) > 0 {
		// A bootstrap peer connects even when attackers hold every inbound slot (F12, L3):
		// its connections, from its addresses and with its peer ID only, go to the
		// allowlisted scopes when the system's are full.
		opts = append(opts, rcmgr.WithAllowlistedMultiaddrs(allow))
	}
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(concrete), opts...)
	if err != nil {
		return nil, fmt.Errorf("resource manager: %w", err)
	}
	return rm, nil
}

// bootstrapAllowlist is the bootstrap peers' IP addresses, each bound to its peer ID, for
// the resource manager's allowlist. Addresses without an IP (DNS names) are left out.
func bootstrapAllowlist(boot []peer.AddrInfo) []ma.Multiaddr {
	var out []ma.Multiaddr
	for _, ai := range boot {
		id, err := ma.NewComponent("p2p", ai.ID.String())
		if err != nil {
			continue
		}
		for _, a := range ai.Addrs {
			ip, err := manet.ToIP(a)
			if err != nil {
				continue
			}
			ipAddr, err := manet.FromIP(ip)
			if err != nil {
				continue
			}
			out = append(out, ipAddr.Encapsulate(id))
		}
	}
	return out
}

// lanQUICDelay is how long a dial to a private QUIC address waits for the TCP dial to the
// same peer: go-libp2p's PublicTCPDelay, the other way round. A TCP dial that has not
// connected by then has likely failed; 30 ms (go-libp2p's private delay) lost the race to
// QUIC now and then on a busy 2-core machine.
const lanQUICDelay = 250 * time.Millisecond

// rankDials is go-libp2p's default dial ranking with one change: on private addresses
// (loopback, LAN) TCP is dialed first and QUIC 250 ms later, not the reverse. A LAN round
// trip costs little either way, and on TCP with yamux tokens cross faster than on QUIC.
// Measured node to node through the router (testnet's BenchmarkInferencePaths, loopback,
// 2-core VM, three runs with this ranking and three with go-libp2p's, which picks QUIC):
// per-token added delay p50 91-103 µs on TCP against 154-236 µs on QUIC, and the first
// token 442-600 µs later than direct against 828-836 µs (TTFT ratio 1.017-1.023 against
// 1.032 with a 25 ms backend); request latency (B1: 597-680 µs added against 605-756 µs)
// and throughput (B3) did not clearly differ. The same runs' bare transport paths agree:
// 70-112 µs per token on TCP, 130-178 µs on QUIC, in each of the six. Public addresses keep
// QUIC first: fewer round trips to set up, and hole punching succeeds more often.
func rankDials(addrs []ma.Multiaddr) []network.AddrDelay {
	ranked := swarm.DefaultDialRanker(addrs)
	tcpFirst := false
	for _, a := range ranked {
		if isPrivateTCP(a.Addr) {
			tcpFirst = true
			break
		}
	}
	if !tcpFirst {
		return ranked
	}
	for i, a := range ranked {
		switch {
		case isPrivateTCP(a.Addr):
			ranked[i].Delay = 0
		case manet.IsPrivateAddr(a.Addr) && !isRelay(a.Addr) && isProto(a.Addr, ma.P_QUIC_V1):
			ranked[i].Delay = max(a.Delay, lanQUICDelay)
		}
	}
	return ranked
}

func isPrivateTCP(a ma.Multiaddr) bool {
	return manet.IsPrivateAddr(a) && !isRelay(a) && isProto(a, ma.P_TCP) && !isProto(a, ma.P_WS) && !isProto(a, ma.P_WSS)
}

func isRelay(a ma.Multiaddr) bool { return isProto(a, ma.P_CIRCUIT) }

func isProto(a ma.Multiaddr, code int) bool {
	_, err := a.ValueForProtocol(code)
	return err == nil
}

func parseAddrs(ss []string) ([]ma.Multiaddr, error) {
	out := make([]ma.Multiaddr, 0, len(ss))
	for _, s := range ss {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}
