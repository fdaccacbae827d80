// Package client is the Go client of a coordinator's gateway (issue 7), for programs that
// embed a thin client: no libp2p node, only an API key and the coordinator's URL.
//
//	c := client.New("https://coordinator.example:9337", key, client.WithDevice(deviceID))
//	defer c.Close()
//	res, err := c.Chat(ctx, map[string]any{"model": "synth-tiny", "messages": msgs},
//		func(t client.Token) { fmt.Print(t.Text) })
//
// # Transport
//
// Chat calls share one WebSocket connection to baseURL + /v1/gateway (package gateway
// documents the wire format), opened at the first Chat and kept, with pings, until Close or
// until it dies; another is dialled when requests are waiting. When the upgrade is answered 404, 405, 426 or 501 (a coordinator without the
// endpoint, or a proxy that does not pass WebSocket through), the client falls back to REST,
// POST /v1/chat/completions with server-sent events, for the rest of its life; WithForceREST
// chooses REST from the start. A refused key (401) or request (other 4xx) is returned as an
// *Error; so is any failure of the very first connection, so that a wrong URL fails fast.
//
// # Keepalive and reconnection
//
// Every PingInterval (10 s by default) the client sends a ping. Any message from the
// coordinator shows the connection is alive; when three pings in a row went unanswered, at
// the next tick, the connection is declared dead and closed. The client then dials again
// after a jittered exponential backoff: before redial n (from 0) it waits d/2 plus a uniform
// draw in [0, d/2), where d = 200 ms · 2^n capped at 10 s. After 8 failed redials in a row
// the requests waiting fail with unavailable.
//
// # Exactly one completion
//
// Each Chat call sends its request with an id and a fresh random idempotency key. When the
// connection is lost, every request in flight is resubmitted on the next connection with the
// same key: the coordinator answers with the stored result, or attaches it to the run still
// going, and never runs it twice; either way it replays the tokens from index 0. The client
// delivers each index once: an index already delivered is skipped after checking that its
// text is the same, and a replay that differs, or ends early, fails the call with
// ErrReplayMismatch rather than splicing two outputs. So a Chat call returns one completion,
// its tokens each delivered once and in order, or an error.
//
// A request whose connection died waits at most DefaultLostTimeout (4 s; WithLostTimeout)
// for a new connection to resubmit it on; then its Chat call returns an *Error with code
// coordinator_lost, once, whatever comes later, and the request is not sent again: it may
// have run and been billed, or not. A coordinator that crashed and restarted within that
// time on the same address gets the request back with its key: it replays the result it
// recorded before the crash, runs afresh a request that had not completed, or answers
// coordinator_lost for one it billed without keeping its output (package gateway, "Across
// a restart"); never a second run billed.
//
// An error outcome of peer_lost or unavailable before any token was delivered is retried
// once: the coordinator routes every submission afresh, so the retry may reach another peer.
// Over REST the same single retry applies; a REST stream cut midway is not resumed.
//
// # Lifecycle
//
// New starts nothing; the first Chat starts the connection loop, which owns the connection
// and its reader and pinger goroutines. Close closes the connection (1000) and returns once
// they all ended; Chat calls then return ErrClosed. No package state.
//
// # Imports
//
// Standard library, github.com/coder/websocket, package inference (codes and usage) and
// package gateway (the endpoint's path, header and bounds). No libp2p.
package client
