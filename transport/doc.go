// Package transport is the home of the node's wire protocols and network-facing servers
// (their varint-length frames are internal/frame, shared with mesh):
//
//	transport/infer    the peer inference protocol /meshinfer/infer/1.0.0 (client and server)
//	transport/openai   the OpenAI-compatible HTTP API a node serves on 127.0.0.1:9337
//	transport/gateway  the coordinator's API keys, key authentication, usage metering and the
//	                   WebSocket gateway of thin clients (transport/gateway/client: their Go
//	                   client)
//	transport/webrtc   WebRTC data channels straight to a peer, signaled over libp2p
//	                   (/meshinfer/webrtc-signal/1.0.0) or relayed by a coordinator for a
//	                   thin client (transport/gateway/client/direct), carrying the
//	                   inference protocol
//	transport/bwprobe  the bandwidth probe /meshinfer/bwprobe/1.0.0: a bounded transfer each
//	                   way, timed, when no recent transfer measured a peer's bandwidth
//
// This package itself holds what they share: the loopback check for local-only listeners,
// and the limits of the node's HTTP servers (the API and the console) against slow and
// greedy clients: deadlines, a header bound and a cap on connections per client address
// (HTTPLimits, PerIPListener).
//
// transport must never import mesh or node; node connects the two through small interfaces
// declared by the consuming package (openai.Dispatcher, infer.Generator).
package transport
