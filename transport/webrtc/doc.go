// Package webrtc gives a node direct WebRTC data-channel streams to a peer, set up over an
// authenticated libp2p stream: /meshinfer/webrtc-signal/1.0.0; and to a client with no
// libp2p host, set up over signaling a third party relays (see Relayed signaling).
//
// A Transport answers set-ups only with Config.Accept: then it registers SignalID on the
// host and AcceptRelayed serves relayed set-ups. Without it, a peer's set-up fails as soon
// as the protocol is negotiated (not supported), AcceptRelayed fails with ErrNotAccepting,
// and no peer can make the node create a PeerConnection, gather candidates or send ICE
// checks; the Transport still offers (OpenStream).
//
// A Transport keeps a small pool of connected PeerConnections, used in both directions:
// OpenStream reuses one to the peer (warm: a new data channel, whose first bytes leave
// with its open message, so no round trip is spent before them) or sets one up (cold:
// signaling, ICE, DTLS and SCTP within Config.ConnectTimeout). At most Config.MaxWarm
// PeerConnections are kept, and at most max(1, min(2, MaxWarm/4)) per peer (two at the
// default MaxWarm of 8: one each way when both set up at once; one in a pool under 8):
// a peer's share, so that one that sets up again and again only replaces its own, and
// takes at most a quarter of the pool. Beyond either bound the least recently used is
// closed, idle ones before those with open streams (the peer's own first). One with no
// open stream for Config.IdleClose is closed by a sweep, and one whose ICE or DTLS fails
// or disconnects is dropped at once.
//
// A Stream is a byte stream on its own data channel, like a libp2p stream: the user frames
// messages. Its remote peer is the peer of the libp2p stream the PeerConnection was
// signalled over; the DTLS fingerprints that bind the PeerConnection to it travelled in the
// SDP over that authenticated stream, and pion checks them.
//
// # Signaling wire format
//
// The offerer (the node calling OpenStream) opens a libp2p stream with SignalID. Every
// message is a frame (internal/frame: an unsigned varint length, then the body) whose
// first body byte is the message type; the rest is UTF-8 text.
//
//	0x01 offer      SDP of the offer                          ≤ MaxSDP bytes of text
//	0x02 answer     SDP of the answer                         ≤ MaxSDP bytes of text
//	0x03 candidate  one ICE candidate ("candidate:…")         ≤ MaxCandidate bytes of text
//	0x04 end        end of candidates                         empty
//
// The offerer sends the offer at once (trickle ICE: it does not wait for gathering), then
// each local candidate as it is gathered, then end. The answerer reads the offer, replies
// with the answer, then its candidates and end likewise. Each side's first message is its
// description (offer, answer); a side sends at most MaxCandidates candidates, those
// embedded in its description (SDP a=candidate lines) and those it trickles together,
// and nothing after end. Anything else (an unknown type, a frame over its bound, text that
// is not UTF-8, an SDP pion refuses, a candidate past the cap) is a violation: the reader
// resets the stream, and the error it returns or logs wraps ErrSignaling.
//
// The whole exchange, and the ICE, DTLS and SCTP set-up that follows, has
// Config.ConnectTimeout, enforced as a deadline on the signaling stream. The side that
// sees its PeerConnection ready (the offerer: its first data channel open; the answerer:
// ICE and DTLS connected) closes the signaling stream; the other side ignores the end of
// the stream once it has the description. A side that fails resets the stream.
//
// The answerer handles at most MaxIncomingSetups set-ups at once (16), and a peer's share
// of them is one: a peer that floods signaling streams holds one slot and the rest of its
// streams are reset at once, before any PeerConnection is made, so that another peer
// still sets up. (Relayed set-ups have their own share per relaying peer; see Relayed
// signaling.) It takes MaxIncomingSetups peer identities to fill them. An offerer makes
// at most one set-up per remote peer at a time: a second OpenStream to the same peer waits
// for the first's.
//
// # Remote candidates
//
// A remote candidate makes this node send packets to its address (ICE checks: STUN
// binding requests, carrying the ICE credentials of the signaling; then DTLS and SCTP to
// the pair that answered). So a peer's candidates are capped (MaxCandidates, counting
// every candidate line, refused ones included) and filtered, trickled or embedded alike:
// this side's descriptions never embed candidates (it trickles), but a remote's may, and
// pion adds embedded ones to the ICE agent as it applies the description, so the
// description is stripped of refused lines first. A refused candidate is dropped, not a
// violation; the others may do. Refused:
//
//   - a line pion cannot parse as a candidate (garbage), and port 0;
//   - an address that is not an IP literal: mDNS names (.local; DefaultSettingEngine
//     disables mDNS, and a remote's names are refused even with a SettingEngine that
//     enables it) and any other host name, which would mean a DNS lookup the peer chose;
//   - unspecified (0.0.0.0, ::) and 0.0.0.0/8 addresses;
//   - multicast (224.0.0.0/4, ff00::/8, link-local multicast included), the IPv4
//     broadcast address and the rest of the reserved 240.0.0.0/4;
//   - link-local unicast (169.254.0.0/16, home of cloud metadata services, and fe80::/10).
//
// An IPv4-mapped IPv6 address is judged as the IPv4 one. Loopback and private addresses
// (10/8, 172.16/12, 192.168/16, fc00::/7) are kept: two nodes on one machine and LANs use
// them. What a peer can still steer is bounded: at most MaxCandidates addresses per
// set-up, checked with STUN only, within ConnectTimeout.
//
// # Relayed signaling
//
// A client with no libp2p host reaches a node through a third party, a coordinator: the
// signaling messages above, in the same frames and the same order, travel client ⇄
// coordinator ⇄ node over whatever streams the coordinator provides (a WebSocket, a
// libp2p stream of its own protocol), seen here as a SignalStream. DialRelayed is the
// client's side, the offerer, needing no Transport or host; Transport.AcceptRelayed is
// the node's, the answerer. The exchange differs from one over SignalID in three ways.
//
// The signaling stream stays the caller's: on success neither side closes it, and each
// leaves it positioned right after the remote's end, with no deadline, so the
// coordinator's protocol can go on over it (a final result, say). So each side reads its
// frames without reading ahead and reads nothing after the remote's end, and a set-up is
// done only when all of these hold: its PeerConnection is ready (the offerer: its data
// channel open; the answerer: the client's first data channel arrived), it has sent its
// own end (at ready at the latest: candidates gathered after that are not needed and not
// sent) and it has read the remote's end. The end of the stream before the remote's
// end, or a failed write, is a failure. A side that fails resets the stream; the
// deadline (ConnectTimeout) covers it all, the wait for the remote's end included.
//
// There is no libp2p identity on the client's side: the DTLS fingerprints bind the
// PeerConnection to whoever sent the SDP through the coordinator, and the client knows
// the node only as far as it trusts the coordinator to relay to it. Whatever
// authentication the client needs is the coordinator's protocol's business.
//
// The PeerConnection is one-shot and outside the pool: not counted in MaxWarm, never
// swept as idle, never used by OpenStream, its stream never given to the stream handler.
// It carries one stream, the client's first data channel (any other is reset), and it
// has no peer ID (the empty ID in logs). The caller ends it with the release function it
// got: once the stream was closed or reset, release first waits for the remote to close
// its side too (at most drainTimeout), so that what was written before Close arrives;
// on a stream still open it closes at once. Transport.Close closes the node's relayed
// PeerConnections too. While being set up, a relayed exchange takes one of the
// MaxIncomingSetups slots; beyond them AcceptRelayed fails at once with ErrBusy. The
// relayed side has no peer ID of the client, so the share is per relaying peer, the
// coordinator that AcceptRelayed's caller names: at most a quarter of the slots (4) at
// once, so that a coordinator relaying many clients, or one that floods, leaves three
// quarters to others. Beyond its share AcceptRelayed fails at once with ErrBusy too.
//
// # Data channel wire format
//
// Each stream is one reliable, ordered data channel (label and protocol empty; a channel
// opened otherwise is closed at once). Every data channel message is binary, at most
// 16 KiB including its first byte, the message type:
//
//	0x00 data    the stream's bytes                (1 to 16383 bytes after the type)
//	0x01 fin     the sender will send no more data (empty after the type)
//	0x02 reset   the sender abandons the stream    (empty after the type)
//
// CloseWrite sends fin: the remote's Read returns io.EOF after every byte sent before it.
// Close sends fin (if not sent) and closes the data channel, which resets the SCTP
// outgoing stream after all data queued before it, then keeps reading and discarding what
// the remote still sends until the remote closes its side too (bounded by drainTimeout),
// since unread data would hold the receive window every stream of the PeerConnection
// shares. Reset sends reset in place of fin: the remote's Read and Write fail with ErrReset
// (once it reads up to the reset). A data channel that ends without fin or reset (the
// PeerConnection failed, the remote closed the channel abruptly) reads as ErrReset, never
// as io.EOF. A string message, an empty message, an unknown type or a message over 16 KiB
// is a violation; the reader resets the stream (and closes the PeerConnection for an
// oversized message, which would otherwise block the channel).
//
// Writes are flow controlled: a Write blocks while more than sendHighWater bytes of the
// stream are queued in SCTP unacknowledged, until the queue drains to sendLowWater or the
// write deadline passes.
//
// This package imports internal/frame and no other meshinfer package; it must never import
// mesh or node.
package webrtc
