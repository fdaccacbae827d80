// Package infer implements the peer inference protocol, /meshinfer/infer/1.0.0: one request
// per stream, answered by a stream of tokens and exactly one terminal frame; and
// /meshinfer/infer/1.1.0 (ReuseID), the same exchange repeated on one stream. Both carry a
// live handover of a running generation from a leaving server to a replacement.
//
// # Wire format
//
// Every message is a frame (internal/frame): an unsigned varint length, then the body. The
// first body byte is the frame type.
//
//	client → server   0x01 request   JSON of inference.Request, with     ≤ MaxRequestFrame
//	                                 "replay", "handover", "resume"
//	                                 (below)
//	                  0x05 request   the same, asking for a signed receipt
//	                  then nothing (but a resumption's frames, below): the client keeps
//	                  its write side open until the terminal frame; closing or
//	                  resetting it earlier cancels the request
//	server → client   0x02 token     uvarint index, uvarint id+1, text  ≤ MaxTokenFrame
//	                  0x06 kv        uvarint pos, uvarint n, values     ≤ MaxKVFrame
//	                                 (handover only, below)
//	                  0x03 done      JSON {"finish_reason", "usage",     ≤ MaxTerminalFrame
//	                                       "replayed" (when > 0),
//	                                       "receipt" (0x05 only)}
//	                  0x04 error     JSON {"code", "message"}           ≤ MaxTerminalFrame
//	                  0x07 moved     JSON {"positions", "tokens"}       ≤ MaxTerminalFrame
//	                                 (handover only, below)
//
// A request that continues a cut stream carries "replay": the ids of the tokens its client
// already has (inference.Request.Replay). The server's backend may prefill them with the
// prompt instead of generating them again, and then says how many it replayed ("replayed"
// in the done frame, inference.Result.Replayed; absent when it generated them again, and
// from a server older than the field, which may have replayed them); either way the answer
// is the whole completion from index 0. The client holds "replayed" to the ids it sent. A
// client leaves replay out when it would push the frame past MaxRequestFrame; a server
// checks it like the rest of the request (fewer ids than max_tokens, none negative; the
// backend checks them against its vocabulary).
//
// A kv frame carries rows of a generation's KV cache (inference.KVRows): positions
// [pos, pos+n) of every layer, their keys then their values, as little-endian float32; their
// count is implied by the frame's length, a multiple of 4, more than 0 and at most
// inference.MaxKVRowsBytes, and a whole number of 2 × n rows.
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
// # Handing a generation over
//
// A node that must leave while it serves a generation (its owner paused it, it drains for a
// restart) hands the generation's KV cache, through its requester, to a replacement that
// goes on with the very tokens it would have generated (inference/handover.go has the
// contract). On the wire, from the leaving server A through the requester H to the
// replacement B:
//
//   - H's request to A says "handover": true (H set inference.Request.Move). When A leaves
//     (Server.HandOver) the generation sends its cache in kv frames between its tokens,
//     rows in order from position 0, then ends with the moved frame: the positions and
//     tokens it sent. A non-streaming answer's batched token frames go out before each kv
//     frame, in order. A backend that cannot hand over runs on to its end.
//   - H passes the rows to Move.Send as they come and checks them: a kv frame or a moved
//     frame without handover asked, rows that do not start where the last ended, more than
//     MaxMoveBytes of them, or a moved frame whose counts are not what H received (a server
//     lying about what it sent) is a protocol violation. Generate returns *inference.Moved.
//
// Then H opens a fresh stream to B (never pooled, never reused) and sends the request with
// "resume": true and no replay, then the rows and its tokens (Client.Resume):
//
//	client → server   0x01/0x05 request   "resume": true, no "replay"
//	server → client   0x09 ready          JSON {"shape": inference.ModelShape} ≤ MaxTerminalFrame
//	                  (or 0x04 error: B cannot resume (unavailable), the request is refused)
//	client → server   0x06 kv             rows in order from position 0, any number ≤ MaxKVFrame
//	                  0x08 go             JSON {"replay": [ids]}               ≤ MaxRequestFrame
//	server → client   the answer of a request, tokens from index 0 (the replayed ones too)
//
// B checks the request as any other, admits it (the slot is held from the request to the
// answer's end) and readies the generation (inference.Resumer) before the ready frame; it
// loads each kv frame's rows, checks the go frame's replay as a request's replay and
// prefills what it was not sent. Rows B's backend refuses, or a bad replay, get an error
// frame with its code in answer to the go frame: H writes its rows without reading, so B
// reads on to the go frame (dropping the rows after a refusal) rather than leave H's writes
// blocked on a full stream window.
// The transfer phase, from the request frame to the go frame, is bounded by
// TransferTimeout; any other frame in it, or a request frame with "resume" and "replay",
// is a protocol violation (the stream is reset). A resumption ends its stream: B closes it
// after the terminal frame on 1.1.0 too. A resumption may ask "handover" itself: B then
// hands it over as A did. A transfer cut halfway still resumes: the rows B
// did not get are prefilled from the replay, so a partial transfer degrades to a replay,
// never to a hang.
//
// Kv frames of at least 64 KiB are transfers timed from first byte to last
// (internal/bandwidth), as request frames are: B reports those it reads
// (WithServerTransfers), H those from A (WithClientTransfers).
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
//     opened gives unavailable, and so does one not open within the open timeout
//     (DefaultOpenTimeout, 10 s: the dial, and the DHT walk for a peer's addresses when
//     the dial fails): a peer that left answers no dial, and a request routed to it
//     before its peers see it stale goes on to another candidate instead of waiting out
//     every dial timeout. Token indices are checked to be contiguous. A handover's
//     kv frames are frames like the others for both deadlines; a resumption's ready frame
//     must come within the first-token timeout, and so must the first token after its go
//     frame (B prefills the prompt and the replay not loaded).
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
