// Package bwprobe implements the bandwidth probe, /meshinfer/bwprobe/1.0.0: a bounded
// transfer each way on a stream of its own, timed by this node, for when the bandwidth
// with a peer is wanted (the viability gate of a migration) and no recent transfer
// measured it (internal/bandwidth keeps the estimates; the transfers a node makes anyway,
// stage prefills and the like, feed it without any probe).
//
// Its job is that protocol: Server answers probes, Client sends them (Probe) and decides
// when one is needed (Measure). It imports inference (error codes), internal/bandwidth and
// internal/frame, and never node or mesh.
//
// # Wire format
//
// Control messages are frames (internal/frame): an unsigned varint length, then the body,
// whose first byte is the frame type. Integers in bodies are minimal unsigned varints.
// Payload bytes are raw: their count is known from the request.
//
//	client → server   0x01 request    uvarint up, uvarint down          ≤ MaxRequestFrame
//	server → client   0x02 accept     nothing more                      = 1 byte
//	                  0x03 refuse     an error code of inference's set  ≤ MaxAnswerFrame
//	client → server   up payload bytes (any content: the client sends zeros)
//	server → client   0x04 received   nothing more                      = 1 byte
//	server → client   down payload bytes (zeros)
//
// The client sends the request and waits for the answer; on accept it sends up bytes and
// waits for received, which the server writes once it has read them all; the server then
// writes down bytes and closes the stream; the client reads them and closes its side. A
// refusal is followed by the server's close: invalid_request for a request over the bounds,
// overloaded when the server is busy or the client probes too often, policy_paused when
// the server's participation policy has it paused. An unknown code reads as unavailable.
//
// # Timing
//
// The client times everything itself and believes no figure of the server's:
//
//   - rtt: from sending the request to reading the answer (tiny frames, both ways);
//   - up: from its first payload byte sent to reading received, less rtt (received
//     crosses the path once after the last byte arrived, and the first byte once before
//     it). What remains is the time the bytes took to cross, with an error of the
//     difference between the two round trips; a probe whose up time is not above rtt is
//     no sample;
//   - down: a Down transfer timed by a bandwidth.Meter from the first payload byte read to
//     the last.
//
// The server also learns the client's up rate as a Down transfer of its own (the up
// payload, metered as it reads it), and adds it to its estimator: a probe measures both
// sides.
//
// # Bounds and limits
//
//   - up + down ≤ MaxProbeBytes (1 MiB): the server refuses a request over it before any
//     payload moves, and reads at most the up bytes it accepted (it never reads past them).
//     The client sends DefaultProbeBytes (512 KiB) each way.
//   - Server: the request must come within RequestTimeout (5 s) of the stream opening, the
//     whole exchange within ProbeTimeout (30 s: 1 MiB at 300 kbit/s); one probe at a time
//     per peer, a probe per peer every ServeInterval (10 s) at most, MaxServing (4) at once
//     in all. A refused probe costs the server the request frame only.
//   - Client: a peer is probed at most once every ProbeInterval (1 min), and at most
//     ProbeBurst (4) probes start in any ProbeWindow (1 min) in all: probes cost a node at
//     most 4 MiB a minute (about 0.56 Mbit/s) however often Measure is called. A refusal by
//     those limits is ErrRateLimited; a failed probe counts against them too.
//   - Measure probes only when the peer has no sample within FreshFor (2 min, one
//     internal/bandwidth half-life) in either direction, and returns what is known
//     otherwise.
package bwprobe
