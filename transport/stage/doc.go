// Package stage implements the stage protocol, /meshinfer/stage/1.0.0: a chain of stages
// that each run a contiguous range of a model's layers (inference.StageBackend) for one
// generation at a time, with hidden states flowing forward from stage to stage and the last
// stage's output going straight back to the head, which samples.
//
// Its job is that protocol and nothing else: Server (a stage) and Pipeline (the head's
// side, an inference.Layers). Which stages hold which layers is mesh/route's; what runs the
// layers is the backend's. It imports inference, internal/frame, internal/bandwidth (each
// step's frame is timed for the bandwidth estimates: WithServerTransfers,
// WithPipelineTransfers) and reputation, and never node or mesh.
//
// # Topology
//
//	        open (chain) ──▶           open ──▶                open ──▶
//	head ════════════════════ stage 0 ═══════════ stage 1 ═══ … ═══ stage k−1
//	  ▲         ◀── ready / error          ◀── ready / error               │
//	  └──────────────────────── return stream (head dials) ────────────────┘
//
// The head dials stage 0 and sends the open frame: the session and the whole chain. Each
// stage dials the next itself and sends it the open frame for the rest of the chain, so
// the chain is set up in one pass; each answers ready back once everything behind it is
// set up. The head then dials the last stage (its return stream) and attaches to the
// session. A step goes head → stage 0 → … → stage k−1 → head: k+1 one-way crossings, each
// stage sending straight to the next, never a round trip per stage; where the head runs
// beside stage 0, k one-way delays. The head only dials: it works behind NAT, needs no
// handler of its own, and knows whom each stream is from because it dialed it. The head is
// no stage of its own chain (a host does not dial itself): layers it holds it runs itself,
// before or after its Pipeline's Forward.
//
// # Wire format
//
// Every message is a frame (internal/frame): an unsigned varint length, then the body. The
// first body byte is the frame type. Integers in bodies are minimal unsigned varints.
//
//	0x01 open     previous hop → stage   JSON (below)                       ≤ MaxOpenFrame
//	0x02 hidden   forward                uvarint step, uvarint n,           ≤ 21 + 4·width·batch
//	                                     n × width float32 little-endian
//	0x03 ready    backward, and last     uvarint width [, flags]            ≤ MaxErrorFrame
//	              stage → head
//	0x04 error    either way             JSON {"stage","code","message"}    ≤ MaxErrorFrame
//	0x05 attach   head → last stage      16-byte session ID                 = 17 bytes
//	0x06 end      forward                nothing more                       = 1 byte
//	0x07 timed    forward, timed         uvarint step, uvarint n,           ≤ 21 + 650 + 4·width·batch
//	              sessions               uvarint k, k × uvarint ns,
//	                                     n × width float32 little-endian
//	0x08 receipts forward, receipted     uvarint k, k × (uvarint len,       ≤ 2 + k·(3 + MaxReceipt)
//	              sessions' end          len bytes)
//	0x09 leaving  forward, movable       uvarint stage                      ≤ 11 bytes
//	0x0a keep     forward, movable       nothing more                       = 1 byte
//	0x0b fetch    head → leaving stage   16-byte session ID                 = 17 bytes
//	0x0c load     head → replacement     16-byte session ID                 = 17 bytes
//	0x0d kv       fetch and load         uvarint pos, uvarint n,            ≤ 21 + MaxKVFrame
//	              streams                n × layers × 2 × width float32
//
// The open frame's JSON:
//
//	{"session": 32 lowercase hex digits (chosen at random by the head),
//	 "head": the head's peer ID, "model": the model, "max_positions": P ≥ 1,
//	 "max_batch": B in [1, P] (the most positions of one step the head sends),
//	 "index": the receiving stage's place in the chain (0 first),
//	 "hops": [{"peer", "lo", "hi", "addrs"}, …],
//	 "timing": true (optional: the head asks for the stages' times, below),
//	 "receipts": true (optional: the head asks for the stages' receipts, below),
//	 "moves": true (optional: the head can move a stage that leaves, below),
//	 "adopt", "positions" (a re-linked chain's only, below)}
//
// and a hop may carry "load": true (a re-linked chain's replacement, below).
//
// hops is the receiving stage's own hop (its layers [lo, hi)) followed by the rest of the
// chain: 1 to MaxStages − index hops, with contiguous non-empty ranges; addrs (at most
// MaxAddrsPerHop multiaddrs, optional) are the head's addresses for a hop, which a stage
// adds for its next hop only when it knows none (for TempAddrTTL). A stage passes the frame
// on with index + 1 and its own hop removed.
//
// Timed sessions. A head that wants to know what each stage's layers take per step sets
// "timing" in its open frame; a stage that reports times passes it on in its own open
// frame. A stage is timed when it was asked and it is the last stage or its next hop
// answered ready with the timed flag (flag 1 of the flags byte after the width, below); it
// then answers its previous hop ready with the flag too. So the chain is timed from end to
// end or not at all: a stage that predates timing ignores the field (JSON decoding ignores
// unknown fields), passes none on and answers without the flag, and every stage before it
// and the head stay untimed. In a timed session every stage writes timed frames instead of
// hidden frames: the step's hidden frame fields plus the times of the k stages so far, in
// chain order, each its layers' time (Forward) in that step in nanoseconds, at most
// MaxStageTime; stage i reads a timed frame with exactly i times (stage 0 reads the head's
// hidden frame), appends its own and writes k = i + 1. The head reads the last stage's
// timed frame with a time for every stage. The flag is an error where it was not asked
// for, and so is the attach's ready with it; a frame of the other kind, or with another
// count of times, is a protocol violation. Times are what stages say: a stage can
// misreport its own and those before it (they are for status, never for routing).
//
// A ready frame's flags byte, present only when a flag is set, says what the stage and
// every stage after it do of what the open asked: 1 timed, 2 receipted, 4 movable (any
// sum of them). A flag that was not asked for, or a zero byte, is a protocol violation.
//
// Receipted sessions. A head that wants each stage's signed receipt of its part (as a
// peer that served it a task sends a task receipt: mesh/receipts) sets "receipts" in its
// open frame; a stage that signs receipts (WithReceiptSigner) passes it on, and is
// receipted when it is the last stage or its next hop answered ready with the receipts
// flag; it answers with the flag then. So, as for times, the chain gives receipts from end
// to end or not at all: a stage that predates them, or signs none, ignores the field and
// passes none on, and every stage before it and the head go without. Receipts come at the
// end only, with the end frame: stage 0 reads the head's end frame; every later stage of a
// receipted session reads instead a receipts frame with the receipts of exactly the stages
// before it (k = its index), in chain order, each at most MaxReceipt bytes (empty: that
// stage has none, its signer failed). It appends its own, signed for the session as it
// ended (the time, steps and positions of its own report of the session), and writes the
// receipts frame on to its next hop, the last stage on the return stream. The head, after
// its end frame, reads the last stage's receipts frame with a receipt for every stage,
// within CloseTimeout, then closes its streams. A plain end frame where a receipts frame is
// due, a receipts frame where it is not, or one with another count, is a protocol
// violation. The receipts' content is opaque here: the head checks each against the stage's
// part of the session as it knows it (Part: the stage's peer as signer, its layers, the
// model, the session ID, the steps and positions the head ran, made out to the head) with
// the function the node gives (WithReceipts), and keeps those that hold (Receipts); one
// that does not is dropped and recorded against its stage as a protocol violation. A
// stage passes the receipts before it on unread, so a stage can drop or spoil the receipt
// of a stage before it, never forge one (it is signed, and names the session); what it
// spoils is blamed on the receipt's stage, as a fault it reports is believed as far as the
// chain's order allows.
//
// Bounds: a session's steps carry at most batch = min(B, P, MaxStepBytes / (4·width))
// positions, so every reader knows its hidden frames' bound before reading one; a longer
// Forward goes as several steps. A hidden frame must have step equal to the previous one
// + 1 (the first is 0), 1 ≤ n ≤ batch, and exactly 4·n·width bytes of values; the total
// positions stay ≤ P. Errors' messages are cut to 512 bytes.
//
// # Exchanges
//
// Set-up. The previous hop sends open and then nothing until it reads ready. The stage
// checks it (its own peer is the first hop's, the head opened stage 0, the layers exist,
// P fits the model's context), admits it against its limits, opens the backend session
// (refusing what it cannot hold: overloaded), opens the next hop and waits for its ready
// or error, then answers ready with the model's width, or an error frame and an orderly
// close. The last stage answers ready, then waits for the head's attach on a new stream
// (from the head named in the open frame, with its session ID), and answers ready on it.
// Each wait is bounded by OpenTimeout.
//
// Steps. The head writes hidden frames to stage 0; each stage reads one from its previous
// hop, runs its layers (Forward, appending to its KV cache), and writes the output as a
// hidden frame of the same step to its next hop; the last stage writes it on the return
// stream. The head writes the next step after it read the previous output.
//
// Failures travel both ways from where they are found, as an error frame naming the stage
// at fault (its index; −1 the head) with a code of inference's closed set (an unknown code
// reads as unavailable), followed by an orderly close: forward to the next hop (it passes
// it on, and the last stage to the head), backward to the previous hop (passed back to the
// head by stage 0). The side that broke is reset. A stage reports: its own layers' error,
// context_overflow past P, timeout after its idle time, shutting_down when it closes;
// peer_lost naming its previous or next hop when that stream breaks or breaks the
// protocol. Backward, only error frames may come, naming the sender or a stage after it,
// or the head (the last stage's report that the head's return stream broke: passed back,
// blaming no stage); forward, only a stage before the receiver. Whichever copy reaches the
// head first is the pipeline's error.
//
// End. The head ends a session in order with an end frame on its stream to stage 0, and
// closes its streams (in a receipted session, the return stream once the receipts came, or
// CloseTimeout passed). Each stage, on reading it between steps, writes it to its next hop
// (the last stage: on the return stream; in a receipted session, as a receipts frame),
// closes its streams and frees the session. An end frame is the only orderly end: a stream
// that ends without one (a closed connection reads the same) is the loss of that hop,
// peer_lost, except the head's return stream, which the head may close at any time (it
// writes nothing on it after attach). A session also ends when it is idle for the stage's
// session idle time (DefaultSessionIdle), when its stage closes, or on any failure; its
// backend session (the KV cache) is closed then, always.
//
// # Moves
//
// A stage that leaves with notice (its node pauses: battery, heat, withdrawal; or drains
// on SIGTERM: Server.HandOver) hands its part of a running generation over without a
// replay. The head re-links the chain around it at a step boundary, every other stage
// keeps its KV cache, and the leaving stage's rows (its layers only) go to the hops that
// replace it.
//
// Movable sessions. A head that can move stages (WithMoves) sets "moves" in its open; a
// stage whose backend session can give and take its rows (inference.StageMover, one
// position's rows within MaxKVFrame) passes it on, and answers ready with flag 4 when it
// is the last stage or its next hop did: as for times, movable from end to end or not at
// all.
//
// The notice. A leaving stage writes a leaving frame naming itself just before the output
// of its next step, once per session; every later stage passes a leaving frame of a stage
// before it on at once (each stage's at most once: a repeat is a protocol violation), and
// the last stage on the return stream, so the head reads it with that step's output. The
// leaving stage serves the session on for DefaultHandOverGrace and then ends it with
// shutting_down, as a stage that leaves without moves does at once: the head then replays
// the generation elsewhere as for any stage lost.
//
// The re-link. At its next Forward, before any step (every stage holds the same P
// positions), the head asks its Replacer for hops to hold the leaving stage's layers; none
// leaves the chain as it is. Else it writes a keep frame where an end frame would go: each
// stage moves its backend session to its kept table (keyed by head and session ID, counted
// against its limits as a running session, freed after DefaultKeepTimeout unless taken),
// passes the keep on and closes its streams; the last stage's keep on the return stream,
// within CloseTimeout, tells the head the chain kept. The head opens the re-linked chain
// with a new session ID: the same hops with the leaving one replaced, "adopt" the old
// session ID and "positions" P. A hop with "load" opens a fresh session; every other hop
// adopts the session it kept under (its head, adopt) with the same model, layers, P and
// max_positions, its KV cache and counts going on (none kept: unavailable). Only the head
// that opened a session can adopt it: the open's head names the table's key, and stage 0
// checks it is the peer that opened it (later stages trust their previous hop, as for any
// open). A re-linked chain must be movable throughout, and asks for no receipts.
//
// The rows. The head then dials the leaving stage with a fetch frame naming the old session:
// it answers the kept session's rows as kv frames from position 0 in order, each at most
// MaxKVFrame of values, then an end frame, and frees the session (outcome moved). The head
// dials each replacement with a load frame naming the new session and relays each kv frame
// to it, cut to its layers (a replacement of layers [a, b) of the leaving [lo, hi) gets
// the values of layers a − lo to b − lo: each layer's keys and values are contiguous),
// then an end frame. A replacement reads its load after it is linked and before its first
// step, loads the rows into its backend session (which checks their shape against the
// model: inference.KVRows.CheckLayers), requires exactly P positions, and answers ready,
// or an error frame naming the head. The head checks every kv frame as the replacement
// does (position, count, exact size) and refuses a move whose rows would pass MaxMoveBytes.
// Then the step runs on the re-linked chain, with step numbers from 0 again. The move is
// bounded throughout: the keep by CloseTimeout, the set-up by OpenTimeout, the rows by
// DefaultStepTimeout; any failure once the chain kept breaks the pipeline with a retryable
// error naming the leaving stage (its kept sessions are freed as they expire, or with the
// broken chain that adopted them), and the caller replays.
//
// # Rules, bounds and deadlines
//
//   - Every read is bounded before its body: the open or attach frame by MaxOpenFrame,
//     backward frames by MaxErrorFrame, hidden frames by the session's bound, a receipts
//     frame by its count's (under 129 KiB, for MaxStages receipts). A frame over its
//     bound, or of the wrong type or content for its place, is a protocol violation:
//     the stream is reset and the peer recorded (Observer: reputation.MalformedFrame or
//     ProtocolViolation).
//   - A stage admits at most DefaultMaxSessions sessions and DefaultMaxSessionsPerPeer per
//     previous hop, optionally a KV budget; each session's frame bound is reserved in its
//     stream's resource scope (service ServiceName), and a refusal is overloaded. Nothing
//     queues.
//   - The first frame of a stream must come within OpenTimeout. A stage's layers and its
//     write of their output are bounded by its forward timeout (DefaultStepTimeout); its
//     wait for the next step by the session idle time.
//   - The head bounds each step by its step timeout: 30 s for a step of several positions
//     (a prefill, DefaultStepTimeout), 5 s for a step of one (a decode step,
//     DefaultDecodeStepTimeout, which is transport/infer's inter-token timeout: a stage
//     frozen mid-generation, its streams open, stalls the pipeline's client no longer than
//     a frozen peer stalls a peer's). No output in time is timeout. A stage's failure
//     comes back as an error frame or a reset within it, never a hang. A step timeout, a
//     failure or a cancelled context breaks the pipeline: its streams are reset and every
//     stage frees its session, and the requester's executor resumes the stream on another
//     plan. A stage's own forward timeout stays at 30 s for every step: it guards the
//     stage against its own layers, while a frozen neighbour is the head's to find.
//   - The head believes what comes back only within the step it sent: the output's step
//     number and position count must be those of the step, and an error frame can only
//     name a stage of its chain. It cannot check the values (a stage could lie about its
//     layers' output; verification is another layer's job).
package stage
