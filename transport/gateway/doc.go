// Package gateway is the coordinator's door for thin clients (issue 7): the API keys that
// admit them, the middleware that checks a key on every request, the meter that records
// what each key used, and the WebSocket endpoint that multiplexes a client's requests over
// one connection. node mounts these pieces in front of the coordinator's API; the Go client
// of the endpoint is package gateway/client. Dispatch and verification are node's.
//
// # API keys
//
// A key is KeyPrefix ("msk_live_") and the 32 random bytes of its secret in RFC 4648 base32,
// lower case, unpadded: 52 characters of a-z and 2-7, 61 in all (KeyLen), for example
//
//	msk_live_abcdefghijklmnopqrstuvwxyz234567abcdefghijklmnopqrsa
//
// The key is shown once, by KeyStore.Create; the store keeps its SHA-256 only. 256 random
// bits make an unsalted hash safe: there is nothing to search. Each key also has an ID,
// KeyIDPrefix and 8 hex digits of separate random bytes ("key_3fa09c12"), which reveals
// nothing about the secret and is what logs, tables, sessions and the meter name, and a
// name chosen by the operator, unique among live keys.
//
// Check takes the presented key, checks its form (ErrKeyMissing, ErrKeyMalformed), hashes
// it and compares the hash with every stored hash in constant time without stopping at a
// match (ErrKeyUnknown, or a *RevokedError for a revoked key). Before that it stats the
// file: when the file changed on disk since it was read (another file, size or modification
// time; every write replaces it by rename and changes its size), it is read again. A key
// revoked by `meshinfer keys revoke` is thus refused by a running coordinator from its next
// request. If the file cannot be read or parsed, Check fails and the request is refused.
//
// # Key store file
//
// KeysFile ("keys.json") in the data dir, mode 0600, dir 0700:
//
//	{
//	  "version": 1,
//	  "keys": [
//	    {
//	      "id": "key_3fa09c12",
//	      "name": "alice-laptop",
//	      "sha256": "80fcbae7ce3dc3f26840ce0e5efdb0c59986aac9b6a4ceae1682fdcbe0a3813a",
//	      "created_at": "2026-05-01T12:00:00Z",
//	      "revoked_at": null
//	    }
//	  ]
//	}
//
// sha256 is the lower-case hex SHA-256 of the whole key, prefix included; revoked_at is null
// while the key is live, then the time of revocation (RFC 3339, UTC). Keys are in creation
// order. Reading is strict: unknown fields, another version, repeated ids or hashes, two
// live keys of one name, or more than MaxKeys keys make the file invalid. Create and Revoke
// write a temporary file, sync it and rename it over keys.json, so a crash leaves the old
// store or the new one; they hold an flock on "keys.lock" beside it around the read, change
// and write, so two `meshinfer keys` commands never lose each other's change.
//
// # Authentication
//
// RequireKey wraps a handler. The key comes as "Authorization: Bearer <key>" or in an
// X-Api-Key header. A missing, malformed, unknown or revoked key gets 401 with OpenAI's
// error shape and a WWW-Authenticate: Bearer challenge:
//
//	{"error":{"message":"unknown API key: …; create one with: meshinfer keys create --name NAME (on the coordinator)",
//	 "type":"invalid_request_error","param":null,"code":"invalid_api_key"}}
//
// A client names its device with X-Meshinfer-Device (1 to MaxDeviceID visible ASCII
// characters; absent is ""; anything else, or the header twice, gets 400 invalid_request
// saying what a device id is); a session is the key plus the device (Session.ID), and the
// meter records the device with each task. Any stable id will do (a UUID); meshinfer chat
// sends one derived from its machine, "dev_" and 32 lower-case hex digits: a salted hash of
// the hardware facts the capability vector announces, the salt kept on the client's machine
// (node.LoadOrCreateDevice), so the id tells nothing about the hardware. The handler
// behind RequireKey finds the Session with SessionFrom and never sees the key: both key
// headers are removed from its request. Nothing in this package logs a key.
//
// # Metering
//
// Meter records one MeterEvent per task in UsageFile ("usage.jsonl") in the data dir, mode
// 0600: JSON Lines, one event per line of at most MaxUsageLine bytes:
//
//	{"time":"2026-05-01T12:00:03.25Z","key_id":"key_3fa09c12","device":"dev_5c1e…","model":"synth-tiny",
//	 "peer":"peer:12D3KooW…","tokens_in":12,"tokens_out":64,"duration_ms":840,"verified":true,
//	 "outcome":"completed","verification":"passed","receipt":"{…,\"sig\":\"ed25519:…\"}",
//	 "countersig":"ed25519:…","coordinator":"12D3KooW…"}
//
// (shown wrapped). time is when the task ended, UTC; device is the client's
// X-Meshinfer-Device (absent when it sent none); outcome is "completed" or the task's
// error code; verification is the verdict of a sampled verification (absent when not
// sampled); receipt is the serving peer's signed task receipt (mesh/receipts, opaque here),
// countersig the coordinator's countersignature of it, coordinator its peer ID. A task a
// pipeline served (peer "pipeline:<peer>[0-7],…") has no receipt but
// "stage_receipts":[{"receipt":"{…}","countersig":"ed25519:…"},…]: its stages' signed
// receipts of their parts that held (mesh/receipts' stage receipts), each countersigned by
// the coordinator, the pipeline's head. A task that failed verification is metered as zero: its caller records it
// with outcome "verification_failed" (OutcomeVerificationFailed) and Record writes it with
// zero tokens; sums (Usage.Add) count no tokens for such a line whatever it says. Each
// Record writes its line with one write and syncs before returning. A crash mid-write can
// leave a torn last line: OpenMeter and ReadUsage skip it (ReadUsage reports it in a
// *BadLinesError), and the next Record starts on a fresh line. UsageHandler serves the
// calling key's totals at GET /v1/usage and, when the request names a device, that device's
// part of them (device is absent otherwise):
//
//	{"object":"meshinfer.usage","key":{"id":"key_3fa09c12","name":"alice-laptop"},
//	 "usage":{"requests":3,"completed":2,"failed":1,"tokens_in":22,"tokens_out":96,"duration_ns":1500000000},
//	 "device":{"id":"dev_5c1e…","usage":{"requests":2,"completed":2,"failed":0,"tokens_in":12,"tokens_out":64,"duration_ns":800000000}}}
//
// # WebSocket endpoint
//
// GET /v1/gateway (WebSocketPath) on the coordinator's API listener, behind RequireKey: the
// upgrade request carries the key ("Authorization: Bearer <key>") and optionally
// X-Meshinfer-Device; a missing, unknown or revoked key gets the 401 above and no upgrade.
// A plain GET gets 426, a browser page of another origin 403 unless WithOriginPatterns
// names it (origins.go: node's --gateway-origin, with CORS for the REST endpoints). A coordinator without the endpoint answers 404: clients then fall back to
// POST /v1/chat/completions. Each request on a connection is run through the coordinator's
// OpenAI handler in-process, exactly as POST /v1/chat/completions with "stream": true would
// be (transport/openai documents the request object, limits and errors), under the
// connection's session: the same decoding, limits, privacy gate, routing and metering.
//
// Messages are JSON objects in text frames, each at most MaxMessageBytes (320 KiB: the API's
// 256 KiB body cap plus the envelope). Unknown fields are ignored. Client to server:
//
//	{"type":"request","id":"r1","idempotency_key":"4f1c…","body":{…},"headers":{"X-Meshinfer-Privacy":"mesh"}}
//	{"type":"cancel","id":"r1"}
//	{"type":"ping","ts":17}
//	{"type":"direct","id":"d1","body":{…}} and {"type":"signal",…}: see Direct requests
//
// id is 1 to MaxRequestID (64) bytes, unique among the connection's requests in flight; it
// is free again once its done or error arrived. idempotency_key (optional, at most
// MaxIdempotencyKey, 128 bytes) names the request across connections of one session (key
// and device). body is the chat completion request object as POST /v1/chat/completions
// takes it; "stream" and "stream_options.include_usage" are forced on. headers (optional, at
// most 8) may set X-Meshinfer-* request headers other than X-Meshinfer-Device, each at most
// 256 printable ASCII characters. ts is any integer. Server to client:
//
//	{"type":"token","id":"r1","index":0,"text":"Hello"}
//	{"type":"done","id":"r1","finish_reason":"stop","usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21},
//	 "meshinfer":{"route":"peer:12D3KooW…","tier":"mesh","attempts":1}}
//	{"type":"error","id":"r1","error":{"code":"overloaded","message":"…"}}
//	{"type":"pong","ts":17}
//
// (done shown wrapped.) A request gets its tokens, indices 0, 1, … in order, then exactly
// one done or error; code is a typed inference code (inference.Codes), invalid_request for a
// request refused before it ran. Messages of different requests interleave. A ping is
// answered by a pong with its ts.
//
// Errors that concern one request are error messages for its id and leave the connection
// and its other requests alone: a body or headers the API or the rules above refuse
// (invalid_request, the API's own code otherwise), an idempotency key already used for
// another request (invalid_request), more than MaxInFlight (32) requests in flight
// (overloaded, at once), a key store that cannot be read (unavailable), a coordinator
// shutting down (shutting_down). Errors of the connection itself close it, and with it
// every request on it:
//
//	1009 message too big       a message over MaxMessageBytes
//	1007 invalid payload       not a JSON object; an unknown type; a request or cancel
//	                           without an id or with one over 64 bytes; an idempotency key
//	                           over 128 bytes; a ping without an integer ts
//	1003 text messages only    a binary message
//	1008 request id already in flight
//	1008 API key revoked       a request after the connection's key was revoked (every
//	                           request checks it, as RequireKey does over REST; a new
//	                           upgrade then gets 401)
//	1001 shutting down         the coordinator is stopping
//
// A connection from which no message arrived for IdleTimeout (60 s) is closed without a
// close frame; clients ping more often than that. So is one whose message, once its first
// frame's header arrived, is not complete within MessageTimeout (10 s): a client that
// starts a message and stalls, or trickles it (slowloris), holds its connection no longer.
// The upgrade request itself has the API server's deadlines, and every connection counts in
// its per-client cap (transport/openai: 512 connections per address).
//
// A client's cancel ends its request with an error message (unavailable, "cancelled by the
// client") unless the outcome came first.
//
// # Direct requests
//
// A client can have its tokens come straight from the serving peer over a WebRTC data
// channel (transport/gateway/client/direct is the Go client; a browser does the same with
// its RTCPeerConnection), the coordinator only routing, relaying the channel's set-up and
// metering the task from the peer's receipt:
//
//	{"type":"direct","id":"d1","body":{…}}                          client: the request
//	{"type":"signal","id":"d1","frame":"<base64>"}                  either way: one signaling message
//	{"type":"direct_done","id":"d1","peer":"peer:12D3KooW…","finish_reason":"stop",
//	 "usage":{…},"receipt":"{…}","countersig":"ed25519:…"}           server: the task ended, metered
//
// body is the chat completion request object; of its "meshinfer" preferences the
// coordinator keeps timeout and refuses privacy local-only (the task runs on a mesh
// peer). The client then sends the offer of a PeerConnection with one data channel, its
// ICE candidates and an end marker, each as a signal message whose frame is a
// transport/webrtc signaling message (type byte and text, at most MaxSignalFrame bytes),
// without waiting for ICE gathering; the coordinator relays them to the peer it chose and
// relays the peer's answer, candidates and end back. On the data channel
// (transport/webrtc's stream messages) the peer then writes the answer as transport/infer
// frames: tokens and one terminal frame, the client sending nothing. Once the peer
// reports the task to the coordinator, the client gets direct_done with the metered
// record, or an error message (the request's typed error, or why no channel could be set
// up). A direct request counts in the connection's MaxInFlight; cancel ends it. Signal
// messages for no request in flight are ignored; more than 40 waiting for the relay end
// the request.
//
// # Idempotency and resubmission
//
// A request with an idempotency key is a run of its session: resubmitting the key, on this
// connection or another of the same key and device, never runs it twice.
//
//   - Completed: the result (every token, then done) is kept for 10 minutes (at most 1,024
//     results and 32 MiB); a resubmission is answered by replaying it, without running or
//     metering it again.
//   - Running: the resubmission attaches to the run, which replays the tokens so far from
//     index 0 and continues live. The client skips the indices it has already delivered.
//   - Failed (an error outcome), or never seen: it runs afresh.
//
// The key names one request: its body (with "stream" forced) and headers. The same key with
// another request is refused with invalid_request rather than answered with the first
// one's result.
//
// A run whose connection died (or whose forwarders all ended) keeps running for DetachGrace
// (10 s) with nobody attached, waiting for a resubmission; then it is cancelled, like a
// request without an idempotency key at once. A run a client cancelled is cancelled at once
// when no other connection is attached to it.
//
// # Across a restart
//
// node opens the endpoint WithRecords: the idempotency of a completed request outlives a
// crash and restart of the coordinator, so that no request is billed twice.
//
// Before a completed result is published (before its done message is queued for anyone),
// it is appended to IdempotencyFile ("idempotency.jsonl") in the data dir, mode 0600, an
// internal/jsonlog log, and synced:
//
//	{"time":"2026-05-01T12:00:03.25Z","run":"<64 hex>","digest":"<64 hex>","tokens":["Hel","lo"],
//	 "finish":"stop","usage":{…},"meshinfer":{…}}
//
// (shown wrapped). run is the hex SHA-256 of the session and the idempotency key (never the
// key itself), digest that of the request as run. A result whose line would exceed 128 KiB
// is recorded without its tokens ("dropped":true). The file is bounded like the result
// cache: at start, and whenever an append would take it past 32 MiB, it is rewritten (a
// temporary file renamed over it) with the live records only: completed within the last 10
// minutes (not in the future), the newest 1,024, at most 16 MiB, a run's last record
// winning. Lines that cannot be read, a torn last line from a crash mid-write above all,
// are dropped; reading never fails on the content, only on I/O. A record that cannot be
// written is given up (the client still gets its result).
//
// The live records are put back in the result cache at start: a resubmission is replayed
// from them without running or metering it (Restored counts them). The meter is the other
// half: the event of a task with an idempotency key names its run (MeterEvent.Idempotency),
// in the same synced line as its tokens, and Meter.Billed remembers the runs it metered as
// ended with their result (the newest 16,384, for 10 minutes). A resubmission with no
// record whose run the meter holds completed (the result was too large to keep, or the
// crash came between the meter's line and the record's: the executor meters in the
// background as the result streams) is answered
//
//	{"type":"error","id":"r1","error":{"code":"coordinator_lost","message":"this request completed and was billed …"}}
//
// and not run again. A request in flight at the crash was neither completed nor metered:
// its resubmission runs afresh and is metered once. What a crash can still cost is on the
// coordinator's side: a result recorded but not yet metered is replayed unbilled, and a
// verification cut by the crash never meters its task.
//
// # Imports
//
// Standard library, package inference and github.com/coder/websocket (no dependencies of its
// own) only: no libp2p, no mesh, no node. node wires the store, the middleware, the meter
// and the WebSocket endpoint to the coordinator's listener and dispatcher.
package gateway
