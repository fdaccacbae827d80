// Package gateway is the coordinator's door for thin clients (issue 7): the API keys that
// admit them, the middleware that checks a key on every request, and the meter that records
// what each key used. Not built yet: the WebSocket endpoint, dispatch and verification; node
// mounts these pieces in front of the coordinator's API.
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
// characters; absent is ""); a session is the key plus the device (Session.ID). The handler
// behind RequireKey finds the Session with SessionFrom and never sees the key: both key
// headers are removed from its request. Nothing in this package logs a key.
//
// # Metering
//
// Meter records one MeterEvent per task in UsageFile ("usage.jsonl") in the data dir, mode
// 0600: JSON Lines, one event per line of at most MaxUsageLine bytes:
//
//	{"time":"2026-05-01T12:00:03.25Z","key_id":"key_3fa09c12","model":"synth-tiny",
//	 "peer":"12D3KooW…","tokens_in":12,"tokens_out":64,"duration_ms":840,"verified":true,
//	 "outcome":"completed"}
//
// (shown wrapped). time is when the task ended, UTC; outcome is "completed" or the task's
// error code. A task that failed verification is metered as zero: its caller records it
// with outcome "verification_failed" (OutcomeVerificationFailed) and Record writes it with
// zero tokens; sums (Usage.Add) count no tokens for such a line whatever it says. Each
// Record writes its line with one write and syncs before returning. A crash mid-write can
// leave a torn last line: OpenMeter and ReadUsage skip it (ReadUsage reports it in a
// *BadLinesError), and the next Record starts on a fresh line. UsageHandler serves the
// calling key's totals at GET /v1/usage:
//
//	{"object":"meshinfer.usage","key":{"id":"key_3fa09c12","name":"alice-laptop"},
//	 "usage":{"requests":3,"completed":2,"failed":1,"tokens_in":22,"tokens_out":96,"duration_ns":1500000000}}
//
// # Imports
//
// Standard library and package inference only: no libp2p, no mesh, no node. node wires the
// store, the middleware and the meter to the coordinator's listener and dispatcher.
package gateway
