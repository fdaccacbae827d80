// Package inference holds the domain types of one chat-completion request as it travels
// through the mesh, and the Backend interface that serves it.
//
// Its job is to be the shared vocabulary of the data plane: the HTTP API decodes a Request
// and checks it with Validate; the router and the peer protocol carry the Request, the Token
// events and exactly one terminal outcome (a Result or an *Error) between nodes; a Backend
// (the built-in synthetic transformer in package synth, or an OpenAI-compatible upstream)
// produces the tokens. Nothing here does I/O, starts goroutines or keeps state.
//
// # Types
//
//   - Request and Message follow OpenAI's chat-completion JSON (model, messages,
//     max_tokens, temperature, top_p, seed, stop, stream), so a body sent by any OpenAI
//     client decodes into a Request directly. Limits bounds what Validate accepts.
//   - Token is one streamed piece of output with its index; Usage and FinishReason close a
//     successful stream.
//   - Code is the closed set of terminal errors; Error carries a Code and a message. Every
//     failure that crosses a package boundary in the data plane is an *Error or is mapped
//     to one with CodeOf. Code.HTTPStatus and Code.Retryable are the single source for how
//     the API and the router treat each code.
//   - Backend is what a node runs inference with: list models with their warm or cold
//     state, and generate one stream. Its contract (below and on the interface) is what
//     keeps the mesh's invariants.
//
// # Invariants
//
// These are the data-plane invariants I1 and I2 of docs/reliability.md as they apply to one
// backend call; every layer above relies on them.
//
//   - Exactly one terminal outcome: Generate returns exactly once, either a Result whose
//     FinishReason is FinishStop or FinishLength, or a non-nil error. It never calls emit
//     after it has returned, and never calls emit concurrently.
//   - Stream integrity: the Token indices passed to emit are contiguous, 0, 1, …, n−1,
//     in order, without gaps or duplicates.
//   - The error set is closed: ParseCode accepts only the twelve codes declared here, and
//     CodeOf maps every error (including foreign ones) into that set.
//
// # Imports
//
// This package is a leaf of the dependency graph (docs/architecture.md): standard library only.
// It must not import other meshinfer packages, libp2p or pion; the test in
// testnet/deps_test.go enforces it. Its subpackages (synth, and upstream, the client of an
// OpenAI-compatible server) follow the same rule, except that they may import this package
// and the project's internal/ leaves (standard library only themselves: upstream reads its
// event stream with internal/sse).
package inference
