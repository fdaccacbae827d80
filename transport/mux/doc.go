// Package mux is meshinfer's stream multiplexer for libp2p connections over TCP,
// negotiated as /meshinfer/mux/1.0.0 ahead of yamux, which stays as the fallback for peers
// that do not offer it. It implements go-libp2p's network.Multiplexer, so everything above
// it (the swarm, the resource manager, the protocols) is unchanged.
//
// # Why not yamux
//
// yamux hands every frame to a send goroutine over a channel. A token written on a stream
// therefore wakes that goroutine before it reaches the socket, and on a small machine the
// wake-up costs far more than the write. Here a stream's Write frames the bytes and writes
// them to the connection in the caller's goroutine, under the connection's write lock; only
// the receiving side hands over, from the connection's receive loop to the reader.
// BenchmarkCrossing times a 100-byte write, 2 ms after the previous one, over TLS on TCP
// loopback: on the 2-core development VM a stream of this package takes 1.1-2.0 × the bare
// TLS connection's one-way delay (p50, 28-86 µs), a yamux stream 3.0-7.9 ×.
//
// # Wire format
//
// Every frame starts with a 10-byte header:
//
//	type (1) | flags (1) | stream ID (4, big endian) | length (4, big endian)
//
// Types:
//
//	0 data    length bytes of payload follow (at most MaxPayload, 64 KiB)
//	1 window  no payload; length is credit: the sender may send that many more bytes
//	2 ping    stream 0, no payload; length is an opaque value the reply echoes
//	3 goAway  stream 0, no payload; length is the connection error code; the sender closes
//
// Flags (any other bit is a protocol error):
//
//	0x01 SYN  on a window frame: the sender opens the stream
//	0x02 FIN  the sender's last frame on the stream: the receiver reads io.EOF after it
//	0x04 RST  on a window frame: the stream is reset; length is the stream error code
//	0x08 ACK  on a window frame: the receiver accepted the stream; on a ping: the reply
//
// The dialer opens odd stream IDs, the listener even ones. OpenStream sends a window frame
// with SYN (and no credit) before it returns; AcceptStream answers with a window frame
// with ACK. At most AcceptBacklog streams wait for their ACK: OpenStream blocks for a
// slot, as yamux's does, so a busy acceptor slows openers down instead of resetting
// their streams. Streams opened at once from several goroutines may arrive out of order;
// SYN on a stream that is open is a protocol error.
//
// # Flow control
//
// Each direction of each stream has a window of Window bytes (256 KiB, yamux's initial
// window). The sender never has more than the window unacknowledged; the receiver grants
// credit back once its reader has consumed half the window. A frame beyond the credit
// granted is a protocol error. What a stream buffers is therefore bounded by the window,
// and what a connection buffers by the window times its streams, at most MaxStreams (4,096)
// open and AcceptBacklog (256) not yet accepted: a stream opened beyond the backlog is
// reset at once.
//
// # Errors and ends
//
// A protocol error (an unknown type or flag, a payload over MaxPayload, data beyond the
// credit, SYN on an open stream or with the wrong parity) closes the connection: its streams fail with an error
// wrapping network.ErrReset. A reset stream fails Read and Write with a
// *network.StreamError carrying the code, Remote telling which side reset. Data that
// arrives for a stream after its reset, its FIN, or a local CloseRead is discarded (after
// CloseRead it is credited back, so the remote's Write does not stall).
//
// The connection pings after KeepAlive (15 s) without a frame from the remote and closes
// after three such intervals. A stream closed here whose remote sends no FIN within
// CloseTimeout (2 min) is reset. Writes to the socket have a 10 s deadline; a write that
// misses it closes the connection.
//
// # Goroutines
//
// Each connection runs three, all ending when it closes: the receive loop, which reads
// frames and never writes (so a peer that stops reading cannot stall it); the control
// writer, which sends what the receive loop must answer (pong, credit for discarded data,
// the reset of a stream over the backlog); and the janitor, a ticker for the keep-alive
// and the close timeout. Close waits for them. Everything else runs in the goroutines of
// the callers of Read, Write and the rest.
package mux
