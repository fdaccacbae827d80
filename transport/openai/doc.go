// Package openai serves the node's OpenAI-compatible HTTP API: any OpenAI client (an SDK,
// curl, a chat UI) sends a chat completion to a node, and the node's Dispatcher serves it
// locally, through a peer or in the cloud, streaming the tokens back as they are produced.
// A local-only request goes to the Local instead, and never to the Dispatcher.
//
// Its job ends at HTTP: decode and bound the request, resolve its preferences, hand it to the
// Local or the Dispatcher, and turn their tokens and one terminal outcome into OpenAI's
// response shapes. Routing is the Dispatcher's (node implements it with the router); serving
// local-only requests is the Local's (node passes an inference/localonly Gate).
//
// # Endpoints
//
//	GET  /v1/models            {"object":"list","data":[model…]}; each model is
//	                           {"id","object":"model","created":0,"owned_by":"meshinfer",
//	                            "meshinfer":{"warm":bool,"routes":["local","peer:<id>",…],
//	                                         "deterministic":bool}}
//	                           (deterministic: the same request gives the same tokens
//	                           wherever this node serves it, as the built-in models do;
//	                           another node using this one as its cloud relies on it to
//	                           resume a cut stream there)
//	GET  /v1/models/{id}       one model object, or 404 model_not_found
//	POST /v1/chat/completions  a chat completion, streaming or not (below)
//
// Any other path is a 404 and a known path with another method a 405 (with Allow), both as
// OpenAI error JSON with code invalid_request.
//
// # Requests
//
// The body is OpenAI's chat-completion JSON, decoded into inference.Request plus n,
// stream_options.include_usage and the meshinfer extension object (below); other fields are
// ignored, so future fields pass through harmlessly, as do unknown X-Meshinfer-* request
// headers. It is read through http.MaxBytesReader: a body over Limits.MaxBodyBytes (256 KiB by default)
// is refused with 413 after reading at most the limit plus one byte, or before reading
// anything when its Content-Length already exceeds the limit. The Content-Type is not
// checked: a body that parses is served (curl users forget the header). A body that is not
// JSON of the right shape is a 400; n must be 1 (one choice is all this API returns); then the
// preferences are resolved (below), and Request.Validate applies the Limits (it depends on the
// preferences: with route auto the model may be left out, or be "auto"). Requests that carry an Origin header other than a
// loopback one (http://localhost:…, http://127.0.0.1:…, http://[::1]:…) are refused with
// 403: because any Content-Type is accepted, a web page could otherwise make the visitor's
// browser use the API with a plain cross-origin form post. Programs send no Origin.
//
// # Preferences
//
// Each request has routing preferences (inference.Prefs), four fields with closed sets of
// values and a time limit:
//
//	privacy   local-only | mesh | any          where it may be served: this device only; this
//	                                           device or a peer; the cloud tier too
//	priority  cost | latency | balanced        what the router optimises among the tiers
//	route     auto | explicit                  whether the router may choose the model
//	transport libp2p | webrtc                  how this node reaches a serving peer: a libp2p
//	                                           stream, or a WebRTC data channel (falling back
//	                                           to libp2p)
//	timeout   a Go duration: 30s, 2m, 1m30s    the request's time limit, more than 0 and at
//	                                           most 1h (inference.ParseTimeout; a bare number
//	                                           is refused, not read as seconds); none when
//	                                           not given
//
// They come from, field by field, the first source that gives the field:
//
//  1. the body's "meshinfer" object: {"privacy":…,"priority":…,"route":…,"transport":…,
//     "timeout":…}; unknown keys in it are ignored (later versions add some), and a
//     missing, null or "" value is not given;
//  2. the headers X-Meshinfer-Privacy, X-Meshinfer-Priority, X-Meshinfer-Transport and
//     X-Meshinfer-Timeout (route has no header);
//  3. the node's defaults (WithDefaultPrefs: node passes its flags', which set no timeout);
//  4. inference.DefaultPrefs: mesh, balanced, explicit, libp2p, no timeout.
//
// So a body value beats a header, which beats the node's default. An unknown value in the
// body or in a header, or a timeout of another form or out of bounds, is a 400
// invalid_request whose message names the source, the value and the accepted values or
// form, even when a higher source sets the same field. A meshinfer member that is not an
// object of strings is a 400 like any malformed body ("timeout": 30 included). The resolved
// preferences are stored in Request.Prefs; they steer this node and never travel to a peer.
//
// A timeout applies to the whole request, counted from when the handler accepted it (before
// its body is read): the context passed to the Dispatcher or the Local has that deadline,
// and the Dispatcher's router counts the time left as its viability gate's budget (a cut
// stream is not moved by a way that would take more than half of it when the cloud can take
// over, mesh/route's Gate). When it passes, the request ends once with code timeout (504)
// and the message "the request's <limit> time limit passed", whatever the Dispatcher or
// the Local made of their cancellation: an ordinary JSON error before the first token, the
// stream's one error event after it (Streaming). A peer cut off by a request's own limit is
// not penalized for it.
//
// # Privacy gate
//
// After decoding and validation, and before anything else happens, a request whose resolved
// privacy is local-only is handed to the Local (WithLocal) and never to the Dispatcher, which
// does not see it at all: not its body, not its failure. Without a Local the answer is 503
// local_unavailable. The Local answers local_unavailable itself when this device cannot
// serve the request (no backend, a model it does not have, a backend that fails before the
// first token), and never falls back to the network. A request served by the Local is
// reported as route "local", one attempt. A body refused by decoding or the limits reaches
// neither.
//
// # Responses
//
// Non-streaming: 200 with {"id":"chatcmpl-<hex>","object":"chat.completion","created",
// "model","choices":[{"index":0,"message":{"role":"assistant","content"},"finish_reason"}],
// "usage","meshinfer":{"route","tier","attempts"}}, where content is every token's text in
// order and the meshinfer object says where the terminal outcome was served: route is
// "local", "peer:<peer id>" or "cloud", tier is "local", "mesh" or "cloud", and attempts
// counts the targets tried, that one included (a resumption counts). model is the request's,
// or "auto" when it named none (route auto).
//
// The headers X-Meshinfer-Route, X-Meshinfer-Tier and X-Meshinfer-Attempts (a decimal)
// carry the same on every answer for which a route is known: a success, and an error after
// a target was tried. An error before anything was tried (a refused body, no target, no
// Local) has none of them.
//
// # Streaming
//
// With "stream": true the answer is server-sent events (Content-Type: text/event-stream,
// Cache-Control: no-cache, and X-Accel-Buffering: no for reverse proxies), one event per
// token, each written and flushed as the token arrives: nothing is batched. The headers are
// written with the first token, the X-Meshinfer-* ones saying where that token was served; a
// request that fails before its first token gets an ordinary JSON error with its status (and
// the X-Meshinfer-* headers of its outcome when a target was tried), not a 200 stream.
// Events:
//
//	data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"…"},"finish_reason":null}],…}
//	data: {…"delta":{"content":"…"},"finish_reason":null…}           one per further token
//	data: {…"delta":{},"finish_reason":"stop"|"length"…,"meshinfer":{"route","tier","attempts"}}
//	data: {…"choices":[],"usage":{…}}                                 only with include_usage
//	data: [DONE]
//
// A successful stream with no token still sends the role chunk before the final one. The
// final chunk's meshinfer object says where the terminal outcome was served, which differs
// from the headers when the Dispatcher resumed the stream on another target.
//
// An error after the first token cannot change the status any more: the stream then ends
// with one event data: {"error":{"message","type","param":null,"code"}} and no [DONE], so a
// client never takes a cut stream for a complete one. (OpenAI's SDKs raise it as a stream
// error.) Invariant I1 of docs/reliability.md holds at this edge: every request that reaches the
// Dispatcher or the Local ends with exactly one terminal outcome, a finish reason or an
// error, and the last event of a stream is always a terminal one, unless the client itself
// went away.
//
// # Errors
//
// Every error is OpenAI's shape, {"error":{"message","type","param":null,"code"}}, where
// code is the typed inference code (inference.Codes) and the status is Code.HTTPStatus (413,
// 404, 405 and 403 above are HTTP-level refusals with code invalid_request). type follows
// the status: 429 (overloaded) is rate_limit_error, any other 4xx invalid_request_error, any
// 5xx server_error. An error of the Dispatcher or the Local that is not typed reads as
// unavailable (CodeOf).
//
// # Slow and greedy clients
//
// The server (transport.HTTPLimits) gives a request's header 5 s and the whole request 30 s
// from its first byte, closes a kept-alive connection idle for 2 min, answers a header over
// 32 KiB with 431, and holds at most 512 connections per client address (an IPv4 address,
// an IPv6 /64), loopback included: the one over it is closed on arrival, before TLS. A
// client trickling its request a byte at a time (slowloris) thus holds a connection for at
// most 5 s, and one address at most 512 of them; the coordinator's WebSocket connections
// count too, and have the gateway's own deadlines once upgraded.
//
// # Lifecycle
//
// The handler passes the request's context, with the timeout's deadline when it has one, to
// the Dispatcher or the Local: a client that disconnects cancels its generation. Each write has a deadline (writeTimeout), so a client
// that stops reading does too. Close lets requests in flight finish for a grace period, then
// cancels the rest, which end with shutting_down, and closes every connection; it returns
// once no handler runs. The listener is loopback-only unless WithPublic(true): the API has
// no authentication.
//
// # Imports
//
// Standard library, go-log, package inference and package transport (its loopback check
// and server limits). As part of transport it must not import mesh, node or testnet: node
// connects them through the Dispatcher and Local interfaces declared here. This package is
// on the local-only path, so it must not depend, even indirectly, on libp2p, pion,
// multiformats or the mesh's peer protocol either (transport/infer, internal/frame);
// testnet/deps_test.go enforces both.
package openai
