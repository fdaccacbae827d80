// Package infer implements the peer inference protocol, /meshinfer/infer/1.0.0: one request
// per stream, answered by a stream of tokens and exactly one terminal frame; and
// /meshinfer/infer/1.1.0 (ReuseID), the same exchange repeated on one stream.
//
// # Wire format
//
// Every message is a frame (internal/frame): an unsigned varint length, then the body. The
// first body byte is the frame type.
//
//	client → server   0x01 request   JSON of inference.Request, with     ≤ MaxRequestFrame
//	                                 "replay" (below)
//	                  0x05 request   the same, asking for a signed receipt
//	                  then nothing: the client keeps its write side open until the
//	                  terminal frame; closing or resetting it earlier cancels the request
//	server → client   0x02 token     uvarint index, uvarint id+1, text  ≤ MaxTokenFrame
//	                  0x03 done      JSON {"finish_reason", "usage",     ≤ MaxTerminalFrame
//	                                       "receipt" (0x05 only)}
//	                  0x04 error     JSON {"code", "message"}           ≤ MaxTerminalFrame
//
// A request that continues a cut stream carries "replay": the ids of the tokens its client
// already has (inference.Request.Replay). The server's backend may prefill them with the
// prompt instead of generating them again; either way the answer is the whole completion
// from index 0. A client leaves replay out when it would push the frame past
// MaxRequestFrame; a server checks it like the rest of the request (fewer ids than
// max_tokens, none negative; the backend checks them against its vocabulary).
//
// A receipt (0x05; a coordinator asks on every request) is the server's signed task receipt
// (mesh/receipts: its peer ID, the requester's, the model, token counts, and the digest of
// the token frames it wrote, inference.Digest), made by the server's Signer; a server without
// one sends none. The requester checks it against what it received.
//
// A response is zero or more token frames with indices 0, 1, … n−1, then exactly one done or
// error frame, then the server closes the stream (1.0.0; see below for 1.1.0). Anything else is a protocol violation: the
// reader resets the stream. The error codes are inference's closed set; an unknown code
// reads as unavailable.
//
// # Reused streams (1.1.0)
//
// On a ReuseID stream the exchange above repeats: after the terminal frame the server
// leaves the stream open and reads the next request frame. A request that ends any other
// way (the client's reset or close before the terminal frame, a failed write) ends the
// stream, and so does a frame from the client before the terminal frame (a protocol error:
// the running request is cancelled, the stream reset). The client ends a stream it no
// longer wants by closing its write side after a terminal frame; the server closes one
// that stays idle for the session idle time (DefaultSessionIdle, 60 s), and one it has
// while shutting down.
//
// Clients open streams asking for 1.1.0 first, then 1.0.0, and keep up to 4 idle 1.1.0
// streams per peer for 30 s (half the server's idle time). A request sent on a pooled
// stream that turns out to have ended before any answer came back (closed by the server,
// which then never read it) is sent again on a new stream; nothing of it ran.
//
// A client believes nothing a server says about its own work: more token frames than the
// request's max_tokens, or more text than inference.Request.MaxCompletionBytes, is a
// protocol error (the stream is reset, peer_lost), and the usage it reports is its own
// count of the tokens received with the server's prompt count bounded by
// inference.Request.BoundUsage.
//
// # Server rules
//
//   - The request must arrive within RequestTimeout of the stream opening (slow senders are
//     reset), and is read through a reader that refuses frames over MaxRequestFrame after
//     reading at most the varint.
//   - Admission is decided before any work: at most MaxInFlight requests per node and
//     MaxInFlightPerPeer per requesting peer; an excess request gets an overloaded error frame
//     at once. Nothing queues.
//   - Each frame write has a WriteTimeout: a client that stops reading is reset.
//   - Token frames of a streaming request (stream true) are written as each token is
//     produced. Those of a non-streaming one may be batched: written together, with the
//     terminal frame or with the first token produced 100 ms or more after the previous
//     write, so that a gap the client sees is at most the backend's own plus 100 ms.
//   - If the client resets or closes the stream before the terminal frame (it cancelled), the
//     server's reading side sees it and cancels the generation at once; it is counted as
//     client_disconnected.
//   - Close (shutting down) cancels every generation; their clients get a shutting_down error
//     frame where the stream still allows it.
//
// # Client rules
//
//   - The client resets the stream when its context ends (context.AfterFunc), so cancelling
//     a request stops the server's work.
//   - Two deadlines bound a silent server (a hung process, SIGSTOP, a machine swapping to
//     a halt: nothing closes, so only a clock can tell). The first frame must arrive
//     within the first-token timeout (DefaultFirstTokenTimeout, 30 s) of the request
//     being sent (for a direct task, of ReadAnswer's start): the server may be loading a
//     cold model and processing the prompt, a resumed request's replay with it. Every
//     frame after the first token, the terminal one included, must arrive within the
//     inter-token timeout (DefaultInterTokenTimeout, 5 s) of the previous one: a token
//     takes milliseconds to hundreds of them, the batching of a non-streaming answer adds
//     at most 100 ms to a gap, and the time the caller takes with a token does not count.
//     Past either the client resets the stream (the server cancels the generation) and
//     returns timeout. The first wait is not derived from the router's estimate of the
//     peer's time to first token: that estimate guesses a peer's cold start, and a
//     deadline a healthy peer misses costs it a cooldown and the request a restart.
//   - A stream that ends without a terminal frame gives peer_lost, a stream that cannot be
//     opened gives unavailable. Token indices are checked to be contiguous.
//   - The requester's executor (node/dispatch) treats a timeout mid-stream as any cut
//     stream: it resumes the stream on another peer where it can, so a frozen peer stalls
//     its client for the inter-token timeout and then the stream goes on. A batched
//     answer's tokens still held by the frozen server are regenerated there.
//
// # Direct tasks
//
// DirectID (/meshinfer/infer-direct/1.0.0) carries a task a coordinator sends for a thin
// client whose WebRTC data channel gets the answer (direct.go has the frames): the same
// answer on the channel, ServeRequest and ReadAnswer on either end.
package infer
