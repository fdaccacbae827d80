// Package openai serves the node's OpenAI-compatible HTTP API: any OpenAI client (an SDK,
// curl, a chat UI) sends a chat completion to a node, and the node's Dispatcher serves it
// locally, through a peer or in the cloud, streaming the tokens back as they are produced.
//
// Its job ends at HTTP: decode and bound the request, hand it to the Dispatcher, and turn
// the Dispatcher's tokens and its one terminal outcome into OpenAI's response shapes. Routing
// is the Dispatcher's (node implements it with the router).
//
// # Endpoints
//
//	GET  /v1/models            {"object":"list","data":[model…]}; each model is
//	                           {"id","object":"model","created":0,"owned_by":"meshinfer",
//	                            "meshinfer":{"warm":bool,"routes":["local","peer:<id>",…]}}
//	GET  /v1/models/{id}       one model object, or 404 model_not_found
//	POST /v1/chat/completions  a chat completion, streaming or not (below)
//
// Any other path is a 404 and a known path with another method a 405 (with Allow), both as
// OpenAI error JSON with code invalid_request.
//
// # Requests
//
// The body is OpenAI's chat-completion JSON, decoded into inference.Request plus n and
// stream_options.include_usage; other fields are ignored, so the meshinfer request extension
// object and future fields pass through harmlessly, as do X-Meshinfer-* request headers. It
// is read through http.MaxBytesReader: a body over Limits.MaxBodyBytes (256 KiB by default)
// is refused with 413 after reading at most the limit plus one byte, or before reading
// anything when its Content-Length already exceeds the limit. The Content-Type is not
// checked: a body that parses is served (curl users forget the header). A body that is not
// JSON of the right shape is a 400; then Request.Validate applies the Limits, and n must be 1
// (one choice is all this API returns). Requests that carry an Origin header other than a
// loopback one (http://localhost:…, http://127.0.0.1:…, http://[::1]:…) are refused with
// 403: because any Content-Type is accepted, a web page could otherwise make the visitor's
// browser use the API with a plain cross-origin form post. Programs send no Origin.
//
// # Responses
//
// Non-streaming: 200 with {"id":"chatcmpl-<hex>","object":"chat.completion","created",
// "model","choices":[{"index":0,"message":{"role":"assistant","content"},"finish_reason"}],
// "usage","meshinfer":{"route"}}, where content is every token's text in order and route is
// where the terminal outcome was served: "local", "peer:<peer id>" or "cloud". The header
// X-Meshinfer-Route carries the route too (also on an error, when one was tried).
//
// # Streaming
//
// With "stream": true the answer is server-sent events (Content-Type: text/event-stream,
// Cache-Control: no-cache, and X-Accel-Buffering: no for reverse proxies), one event per
// token, each written and flushed as the token arrives: nothing is batched. The headers,
// X-Meshinfer-Route from the first token's route among them, are written with the first
// token, so a request that fails before its first token gets an ordinary JSON error with its
// status, not a 200 stream. Events:
//
//	data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"…"},"finish_reason":null}],…}
//	data: {…"delta":{"content":"…"},"finish_reason":null…}           one per further token
//	data: {…"delta":{},"finish_reason":"stop"|"length"…,"meshinfer":{"route":…}}
//	data: {…"choices":[],"usage":{…}}                                 only with include_usage
//	data: [DONE]
//
// A successful stream with no token still sends the role chunk before the final one. The
// final chunk's meshinfer object names the route of the terminal outcome, which can differ
// from the header's when the Dispatcher failed over mid-stream.
//
// An error after the first token cannot change the status any more: the stream then ends
// with one event data: {"error":{"message","type","param":null,"code"}} and no [DONE], so a
// client never takes a cut stream for a complete one. (OpenAI's SDKs raise it as a stream
// error.) Invariant I1 of RELIABILITY.md holds at this edge: every request that reaches the
// Dispatcher ends with exactly one terminal outcome, a finish reason or an error, and the last
// event of a stream is always a terminal one, unless the client itself went away.
//
// # Errors
//
// Every error is OpenAI's shape, {"error":{"message","type","param":null,"code"}}, where
// code is the typed inference code (inference.Codes) and the status is Code.HTTPStatus (413,
// 404, 405 and 403 above are HTTP-level refusals with code invalid_request). type follows
// the status: 429 (overloaded) is rate_limit_error, any other 4xx invalid_request_error, any
// 5xx server_error. A Dispatcher error that is not typed reads as unavailable (CodeOf).
//
// # Lifecycle
//
// The handler passes the request's context to the Dispatcher: a client that disconnects
// cancels its generation. Each write has a deadline (writeTimeout), so a client that stops
// reading does too. Close lets requests in flight finish for a grace period, then cancels the
// rest, which end with shutting_down, and closes every connection; it returns once no handler
// runs. The listener is loopback-only unless WithPublic(true): the API has no authentication.
//
// # Imports
//
// Standard library, go-log and package inference. As part of transport it must not import
// mesh, node or testnet (testnet/deps_test.go enforces it): node connects them through the
// Dispatcher interface declared here.
package openai
