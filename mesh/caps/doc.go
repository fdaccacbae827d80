// Package caps defines the capability vector a node announces to the mesh, its documented value
// bounds, and how it is signed and verified.
//
// A vector is JSON shaped like the design card (runtime, cpu, gpu, npu, ram, battery, thermal,
// app_state, net, models, load) plus peer_id, seq, issued_at, expires_at and sig. The signature
// is "ed25519:<base64>" over Domain followed by the canonical encoding: the vector marshalled
// by encoding/json with sig empty (struct fields in declaration order, no insignificant
// whitespace). A receiver re-derives the canonical bytes from the decoded struct, so a signature
// made over any other byte layout (reordered keys, extra fields, whitespace) does not verify.
//
// Verify accepts a vector only when
//   - it decodes strictly (unknown fields are refused) from at most MaxEncodedSize bytes,
//   - every value is within the bounds of Validate,
//   - the signature verifies with the ed25519 key embedded in peer_id,
//   - it has not expired at the receiver's now, and was not issued too far in the future.
//
// Ordering between vectors of one peer uses seq only, never the remote timestamps; the seq
// high-water mark is kept by the receiver (mesh/announce).
//
// This package is pure: no network, no clock reads (time is passed in), no goroutines. It may
// import go-libp2p's core crypto and peer packages and nothing else of the project.
package caps
