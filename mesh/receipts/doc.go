// Package receipts keeps the signed, append-only log of the tasks this node served for other
// peers, so that its owner can prove what the node contributed. It stores what was served, for
// whom and how it ended; never a prompt or any output.
//
// # File
//
// The log is File ("receipts.jsonl") in the node's data dir, mode 0600: JSON Lines, one
// receipt per line, each line at most MaxLineSize bytes including its newline:
//
//	{"time":"2026-05-01T12:00:03.25Z","requester":"12D3KooW…","model":"synth-tiny",
//	 "tokens_in":12,"tokens_out":64,"duration_ms":840,"outcome":"completed",
//	 "server":"12D3KooW…","seq":7,"sig":"ed25519:…"}
//
// (shown wrapped; a line has no whitespace). A task whose requester asked for a receipt has
// "result":"sha256:…" (the digest of the output sent, inference.Digest) after outcome. A
// pipeline stage's part of a task has, after model,
//
//	"stage":{"lo":0,"hi":8,"steps":9,"positions":20,"session":"5f0c…"}
//
// the layers [lo, hi) it ran, its steps and the positions run over them (its KV cache's
// length at the end), and the pipeline session's ID (32 lowercase hex digits; absent from
// lines written before it existed); its requester is the pipeline's head and its token
// counts are 0 (a stage sees hidden states, not tokens). Other receipts have no stage
// member, so lines written before it existed read and verify as they always did. time
// is when the task ended, RFC 3339 in UTC;
// requester and server are peer IDs; outcome is "completed" or the task's error code
// (peer_lost, timeout, client_disconnected, …); seq numbers the lines of one node's log 1, 2,
// 3, … with no repeats and no gaps.
//
// # Signature
//
// sig is "ed25519:" followed by the standard (padded) base64 of an ed25519 signature by the
// node's identity key over
//
//	Domain + body
//
// where Domain is "meshinfer/receipt/v1\n" and body is the canonical encoding of the receipt
// without sig: encoding/json's output for the Receipt struct with sig left out, that is
// the fields in the order above (stage, when present, after model; its members in the
// order shown), no whitespace, time in RFC 3339 with the fraction's trailing
// zeros removed and a "Z" zone. Every line is exactly body with its closing "}" replaced by
// `,"sig":"ed25519:…"}`, so another tool verifies a line with no JSON re-encoding:
//
//  1. cut the line at its last `,"sig":"`: the part before it, plus "}", is body; the part
//     after it, less the final `"}`, is the sig value;
//  2. base58btc-decode the server field: 38 bytes, 0x00 0x24 0x08 0x01 0x12 0x20 (an identity
//     multihash of a libp2p ed25519 public key) followed by the 32-byte ed25519 public key;
//  3. verify the base64-decoded signature over "meshinfer/receipt/v1\n" + body with that key.
//
// The domain keeps a receipt signature from ever verifying as another use of the same key
// (a capability vector, a libp2p record), and the other way round.
//
// # Reading
//
// Read streams a log and reports, line by line, a verified Receipt or a *LineError: a line
// too long (ErrTooLong; never loaded whole), one that does not decode or is not canonical,
// which includes a line torn by a crash mid-write (ErrMalformed), one whose signature does not
// verify for its server (ErrBadSignature), and one whose seq repeats or goes back, as a line
// copied to inflate the log would (ErrSequence). When a line's seq skips ahead by more than
// the lines reported since the last good receipt (each may have held one of the seqs
// skipped), receipts were removed: that is an ErrSequence error for the line, and the line
// itself still counts.
//
// # Crashes
//
// Append writes each line with one write and syncs the file before returning: a receipt
// Append returned nil for survives a crash. A crash during a write can leave a torn last line;
// Read reports it, Open ignores it when it continues the numbering, and the next Append starts
// on a fresh line. The torn line is kept, not repaired: the log is append-only.
//
// # Task receipts
//
// The receipt a requester asked for travels with the task's result: the same fields with
// result and without seq, signed the same way, one line without newline (SignTask,
// ParseTask). The requester countersigns it (Countersign, VerifyCountersig), so both sides
// hold a record the other signed. See task.go.
//
// # Stage receipts
//
// A pipeline stage's receipt of its part travels to the head when the head closes the
// pipeline in order (transport/stage): the same fields with the stage member and neither
// result, tokens nor seq, signed the same way, one line without newline (SignStage,
// ParseStage). The head checks it against the session it ran (CheckStage: signed by that
// stage's peer, made out to the head, the model, the layers, steps, positions and session
// it expects, completed) and countersigns it like a task receipt (Countersign,
// VerifyStageCountersig). The stage's log line of the session carries the same time and
// stage member. See stage.go.
//
// This package may import the standard library and go-libp2p's core crypto and peer packages,
// nothing else of the project (not transport, not node).
package receipts
