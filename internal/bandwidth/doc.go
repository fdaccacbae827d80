// Package bandwidth measures the bandwidth between this node and each of its peers from the
// transfers that really happen between them, and keeps a per-peer estimate that follows a
// change within a few transfers and forgets with age. The viability gate of a migration
// (issue 17) is to weigh moving a session's state by it once live transfer is built, and
// the capability vector announces the node's downlink from it (net.downlink_mbps): a
// measured value, never a configured one.
//
// # What a sample is
//
// A sample is one transfer of at least MinBytes (64 KiB) that its sender wrote as fast as
// the link took it: a prefill step of the stage protocol (one hidden frame), a peer
// inference request frame, a capability sync answer, a bandwidth probe (transport/bwprobe),
// later a KV state transfer. A smaller transfer says more about latency and per-message
// costs than about bandwidth. A stream its sender paces says how fast the sender produced
// it, not how fast the link carries it: a token stream, written a token at a time as the
// model makes them, is no sample however many bytes it moves.
//
// The receiver times a transfer, with a Meter under its reader: from the first byte it
// reads to the last. The time before the first byte (the request's way there, the sender's
// work, the path's latency) is no part of the link's rate and is left out; so are the bytes
// of that first read, which had all arrived by then (counting them over the time after
// would overstate the rate, most for a transfer that had arrived whole before the reader
// looked). A transfer the reader paced, spending less than half of its time waiting in
// reads and the rest working on what it had read (checking signatures, say), says how fast
// the reader was and is no sample either: it is dropped, never taken as a lower bound.
//
// Directions are this node's: Down is what it received from the peer, Up what the peer
// received from it. Every passive sample is Down, timed where the bytes arrive; a sender's
// own write times end when its buffers took the bytes, not when they arrived, so Up comes
// only from the bandwidth probe, which times its upload until the peer's acknowledgement
// and takes off the round trip it measured in the same exchange.
//
// # The estimate
//
// Per peer and direction, an exponentially weighted geometric mean of the samples' rates:
// a sample of rate r taken at t moves the estimate E, last moved at t0, to
//
//	E' = E^w · r^(1−w),   w = PastWeight · 2^(−(t − t0) / HalfLife)
//
// PastWeight (0.4) is the weight the estimate keeps against a sample taken right after it:
// after three samples at a new rate, what is left of the old one is 0.4³ = 6.4 % of the mix
// (in logarithms), so a tenfold change is tracked within 16 % (figure M3 asks for 25 %),
// while one odd sample moves the estimate only 60 % of the way (in logarithms). HalfLife
// (2 min) forgets a rate measured long ago faster: a sample after a quarter of an hour
// without any counts almost alone, as a path unused for that long may have changed. The
// mean is geometric because rates span orders of magnitude: a halving and a doubling weigh
// alike, and one sample from a fast LAN path does not swamp ten from a slow one.
//
// The node's downlink (Downlink; the vector's net.downlink_mbps) is the lower median of the
// peers' Down estimates moved within Recent (10 min): what a typical peer gets through to
// this node, not swayed by one LAN neighbour or one slow peer; 0 while no peer has a recent
// one.
//
// Bounds: the Estimator keeps at most MaxPeers peers, forgetting the one measured least
// recently to take a new one; a Meter holds a few counters whatever passes through it.
//
// Like every package under internal/, it imports nothing of the project, only the standard
// library (testnet/deps_test.go enforces it).
package bandwidth
