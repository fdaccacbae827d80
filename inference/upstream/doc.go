// Package upstream is an inference.Backend that forwards each request to an OpenAI-compatible
// chat-completions server: llama.cpp's llama-server, Ollama, vLLM, a cloud API, or another
// meshinfer node's API. The node then serves, and announces to the mesh, models it does not
// compute itself.
//
// Its job is translation, nothing more: an inference.Request becomes one streaming
// POST {base}/v1/chat/completions, the server-sent events that come back become
// inference.Tokens, and every way the exchange can fail becomes one typed *inference.Error.
// It keeps no state between requests and starts no long-lived goroutines: its timers'
// callbacks only cancel a context, and net/http's connection goroutines belong to the
// http.Client (Close releases the idle connections of the backend's own client).
//
// # Requests
//
// The body carries model, messages, max_tokens, temperature, top_p, seed and stop, with
// stream true and stream_options.include_usage true. max_tokens is always sent, as
// Request.EffectiveMaxTokens: a request without one gets inference's budget
// (DefaultCompletionTokens), not the upstream's, which is often unbounded. temperature, top_p
// and seed are sent only when the request sets them; OpenAI's defaults are inference's, so
// an upstream that follows OpenAI's API reads an absent field the same way. Requests are
// checked with Request.Validate (meaning only, no size limits: those are the API's) and a
// model outside the configured list is model_not_found, both without contacting the
// upstream. An optional API key is sent as "Authorization: Bearer <key>".
//
// # Streaming
//
// The response is read line by line (internal/sse), each line bounded by maxLine (1 MiB); a
// longer line fails the request. Only "data:" lines matter (comments, event:, id: and retry:
// lines are ignored, and each data line is one event: OpenAI-compatible servers never split
// an event's JSON over several lines). Every non-empty delta.content of choice 0 is emitted as Tokens
// with ID −1 and contiguous indices from 0; a delta longer than maxTokenText (1 KiB) is cut
// at UTF-8 boundaries into several Tokens, so that one token always fits the peer protocol's
// token frame.
//
// finish_reason "stop" and "length" map to FinishStop and FinishLength; any other non-null
// reason ("content_filter", "tool_calls", "eos", …) ends the completion normally and maps to
// FinishStop, the reason closest to "the upstream chose to stop". A stream may carry usage
// in any chunk (OpenAI sends it in a last chunk with no choices, vLLM in the final one); the
// last usage seen is the Result's. Without one the usage is counted: CompletionTokens is the
// number of content deltas received and PromptTokens is 0 (unknown).
//
// The stream succeeds once it has carried a finish reason or "data: [DONE]" (either one; a
// [DONE] without a finish reason reads as FinishStop). A stream that ends with neither was
// cut: unavailable, the tokens already emitted standing.
//
// # Timeouts
//
// firstToken (DefaultFirstTokenTimeout) bounds the wait from sending the request to the first
// token, response headers included: it covers the upstream's queue, cold load and prompt
// processing. idle (DefaultIdleTimeout) then bounds every gap between two tokens and between
// the last token and the end of the stream. Either one passing is a timeout. Deltas that carry
// no content (a role chunk, a reasoning model's reasoning_content) do not count as tokens.
// The clocks stop while emit runs: a slow consumer downstream is not the upstream's delay.
//
// # Errors
//
// Before the response:
//
//	dial error (connection refused, no route, DNS)   unavailable
//	other transport error                            unavailable, or timeout if it is one
//	ctx done                                         wraps ctx.Err() (a deadline reads as timeout)
//	first-token or idle timeout                      timeout
//
// HTTP status of the response (the body, read through a 64 KiB limit, is parsed as OpenAI's
// error JSON {"error":{"message","type","code"}}, and also accepted as {"error":"message"}):
//
//	400 about the context window                     context_overflow
//	other 400, 413, 422 and other 4xx not below      invalid_request
//	401, 403 (a bad or missing API key)              unavailable: the node's setup, not the request
//	404 about a model                                model_not_found
//	other 404 (a wrong base URL)                     unavailable
//	408                                              timeout
//	429                                              overloaded
//	5xx (503 and all others)                         unavailable
//
// "About the context window" is code "context_length_exceeded" (OpenAI) or "context_overflow"
// (meshinfer), type "exceed_context_size_error" (llama-server), or a message mentioning
// "context length", "maximum context" or "context size" (vLLM, llama-server). "About a model"
// is code "model_not_found" or a message mentioning "model" (Ollama, vLLM).
//
// In the stream, an event data: {"error":{…}} (OpenAI's and meshinfer's way to fail after
// the status line) ends the request with the code it carries when ParseCode accepts it, else
// unavailable. A line over the limit, an event that is not JSON, or a read error is
// unavailable.
//
// # Models
//
// Models answers with the configured names, in their order, at once and without failing: it
// marks a model warm when the upstream's latest GET {base}/v1/models (bounded by
// DefaultModelsTimeout, 2 s, and a 4 MiB body) listed it. A listing (or the failure to get one) is
// reused for 3 s (listingTTL); an older one is refreshed in the background, one request at
// a time, so that the node's router, which asks on every request, never waits on the
// upstream, even one whose /v1/models hangs. Before the first listing every model is cold. An upstream that does not answer, or whose answer does not
// parse, leaves every model cold rather than absent: the node keeps announcing what it is
// configured to serve, requests then fail with unavailable, and reputation cools the node
// down on its peers, which is the mechanism built for exactly that. (Ollama lists every
// installed model, loaded or not, so there warm means "installed".)
//
// # Imports
//
// Standard library and package inference only (testnet/deps_test.go enforces it).
package upstream
