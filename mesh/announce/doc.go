// Package announce publishes this node's signed capability vector on the mesh's GossipSub
// topic and turns the vectors of other nodes into registry entries.
//
// Topic: /meshinfer/<mesh>/caps/2 (see Topic); sync protocol: /meshinfer/<mesh>/caps-sync/2.0.0.
// Each message is an ordinary signed GossipSub message whose data is one caps.Vector in its
// wire form (JSON), signed with the node's ed25519 identity: any GossipSub implementation
// (js-libp2p included) can join the topic and read the vectors.
//
// The version is the vector's shape: caps/2 is the design's (runtime, gpu object, battery
// fractions, net.type, app_state foreground/background-task/background). Nodes of caps/1 are
// on another topic and do not see these vectors, nor these nodes theirs. A vector in the
// caps/1 shape that does reach this topic is rejected like any malformed one, and the validator
// logs a warning naming its author, at most once per peer every oldShapeLogEvery, saying that
// the peer must upgrade.
//
// When this node publishes:
//   - at start, again when a peer joins the topic while none of this node's announcements
//     has reached a peer yet, and once more when it has announceReach (4) topic peers if
//     none reached that many yet, so a new node is visible within seconds instead of at the
//     next heartbeat (established nodes reach a newcomer through its sync instead);
//   - when Changed is called (one-slot coalescing trigger: many calls, one publish);
//   - every heartbeat (15 s by default), with a fresh seq, issued_at and expires_at.
//
// Publishes are at least MinGap apart; triggers inside the gap fold into one publish.
//
// What the topic validator does with an incoming message (in this order):
//
//	> MaxEncodedSize bytes, malformed JSON, out-of-bound values,  Reject
//	the caps/1 shape (also logged, see above)
//	bad, missing or foreign-key signature                          Reject
//	signed author of the pubsub message ≠ vector's peer_id         Reject (A announcing B)
//	expired, or issued more than 5 min ahead (clock_skew)          Ignore (may be a slow relay)
//	seq ≤ the highest seq accepted from that peer, or below the    Ignore (replay)
//	seq the registry holds for it (vectors pulled by sync)
//	a new identity past the forwarder's budget, or a peer found    Ignore (registry.Admit)
//	unreachable lately
//	the author's rate used up (rateBurst back to back, then        Ignore (rate_limited)
//	ratePerHeartbeat per heartbeat; see validator.go)
//	otherwise                                                      Accept
//
// The per-peer seq high-water mark lives here, not in GossipSub's seen-cache, so a replay is
// refused also after that cache (120 s) has forgotten the message. Only an accepted message
// changes any state. Ordering uses seq only, never the remote timestamps.
//
// Peer scoring (PeerScore, score.go; the node passes it to pubsub.WithPeerScore): a Reject
// above is also GossipSub's P4 "invalid message" against the peer that delivered the
// message, so a neighbour forwarding forged vectors is penalized by GossipSub itself, not
// only in reputation (which records the signed author). The score adds what a neighbour
// does for the topic (P1 time in the mesh, P2 first deliveries of valid vectors: at most
// 60 points), and subtracts invalid messages (P4), too many peers on one IP (P6) and the
// router's own behaviour penalties (P7); P3's delivery-rate floor is off. Below
// ScoreGossip a peer gets no gossip, below ScorePublish it is no target of our own publishes,
// below ScoreGraylist its RPCs are dropped unread; a peer under zero is also pruned from
// the mesh at the next GossipSub heartbeat. The figures: a peer is graylisted at its 7th
// invalid vector whatever its standing, and so is every identity of an IP with ten or more;
// an honest neighbour only gains. GossipSub leaves loopback addresses out of P6, so a
// testnet's nodes, all on 127.0.0.1, are not taken for one host's Sybils.
// Ignores cost nothing: expired, replayed, rate-limited and over-budget vectors may be a
// relay's honest timing, not its fault.
//
// Pull on join: when a peer joins the topic, the Announcer also pulls the vectors that peer
// knows over SyncProtocol (see sync.go), each checked like an announcement (signature,
// bounds, expiry, no rollback). A newcomer
// thereby learns the whole mesh from its first neighbours within a second, instead of from
// each node's next heartbeat, and a GossipSub message lost between mesh peers (GossipSub does
// not repair losses to mesh peers) is made good at the next join. A failed pull is tried again
// 2 s later, and during its first minute a node pulls from each joining peer a second time
// 2 s after the first: its first neighbours are still learning the mesh when it meets them.
//
// Contact: a vector that reaches this node through another peer (a forwarder, a sync
// answer) makes its author pending in the registry, not a routing candidate. Up to
// contactWorkers pending peers at a time are connected to through Params.Contact (the node
// passes discovery.Contact: the addresses its peerstore or its connected peers know, a dial
// of that peer only); one that answers becomes contacted. Once the node has ContactLowWater
// (8) connections, contacts under way included, a pending peer is contacted only if it
// offers a model no contacted peer offers (checked when queued and again before the dial):
// a node of a large mesh connects to enough peers and to every model, not to every peer it
// hears of (B6's bound of 32 connections a node). When Contact finds no way, Params.Lookup
// (the node's DHT-routed host: a Kademlia walk, which dials the peers on its way) is tried
// only for such a model, or on a peer's last attempt. Pending peers are queued again every
// heartbeat, and those never tried also when a contact ends or a connection closes with the
// node short of connections; one whose contact failed contactAttempts (3) times, a heartbeat
// apart, is dropped and refused for a while (registry.Unreachable), and its seq is kept in
// the high-water mark so a sync answer cannot bring its last vector back.
//
// The Announcer also watches libp2p connection events so the registry marks a clean
// disconnect at once, and sweeps forgotten peers every heartbeat (their seq, too, stays in
// the high-water mark).
package announce

// Topic returns the GossipSub topic for capability vectors of the named mesh.
func Topic(mesh string) string { return "/meshinfer/" + mesh + "/caps/2" }
