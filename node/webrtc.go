package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	pionwebrtc "github.com/pion/webrtc/v4"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/transport/infer"
	"github.com/meshinfer/meshinfer/transport/webrtc"
)

// WebRTC direct paths.
//
// Every node runs a webrtc.Transport: a peer may ask it for a data channel over libp2p
// signaling, and the node answers each channel with its inference server, as it answers a
// libp2p stream. Its dispatcher uses a data channel for a mesh attempt when the request's
// transport preference is webrtc (the meshinfer object, X-Meshinfer-Transport, or
// --webrtc as the node's default):
//
//   - the channel comes from a warm PeerConnection to the peer when there is one, else a
//     cold set-up within Config.WebRTCConnectTimeout (webrtc.DefaultConnectTimeout);
//   - a set-up that fails or times out, or a channel that breaks before the first token,
//     sends the request over a libp2p stream to the same peer instead, counted in
//     /api/status "webrtc.fallbacks";
//   - a channel that breaks after tokens were sent is a failure of the attempt like any
//     other: the router's failover and resumption rules apply.

// TURN credentials for ICEServers with a turn: or turns: URL come from these environment
// variables, so that they stay off the command line.
const (
	EnvTURNUsername   = "MESHINFER_TURN_USERNAME"
	EnvTURNCredential = "MESHINFER_TURN_CREDENTIAL"
)

// iceServers turns the configured URLs into pion's ICE servers, with TURN credentials from
// the environment.
func iceServers(urls []string) ([]pionwebrtc.ICEServer, error) {
	var out []pionwebrtc.ICEServer
	for _, u := range urls {
		s := pionwebrtc.ICEServer{URLs: []string{u}}
		switch {
		case strings.HasPrefix(u, "stun:") || strings.HasPrefix(u, "stuns:"):
		case strings.HasPrefix(u, "turn:") || strings.HasPrefix(u, "turns:"):
			s.Username, s.Credential = os.Getenv(EnvTURNUsername), os.Getenv(EnvTURNCredential)
			if s.Username == "" {
				return nil, fmt.Errorf("ICE server %q: a TURN server needs %s and %s in the environment", u, EnvTURNUsername, EnvTURNCredential)
			}
		default:
			return nil, fmt.Errorf("ICE server %q: use stun:host:port or turn:host:port", u)
		}
		out = append(out, s)
	}
	return out, nil
}

// startWebRTC starts the node's WebRTC transport; its data channels are served by the
// inference server, when the node has one.
func (n *Node) startWebRTC() error {
	servers, err := iceServers(n.cfg.ICEServers)
	if err != nil {
		return err
	}
	t, err := webrtc.New(n.dialer, webrtc.Config{
		ICEServers: servers, ConnectTimeout: n.cfg.WebRTCConnectTimeout,
		SettingEngine: n.cfg.WebRTCSettingEngine, Now: n.cfg.Now,
	})
	if err != nil {
		return fmt.Errorf("webrtc: %w", err)
	}
	n.rtc = t
	n.closers = append(n.closers, t.Close) // before the inference server closes
	if srv := n.infer; srv != nil {
		t.SetStreamHandler(func(from peer.ID, s webrtc.Stream) { srv.ServeStream(from, s) })
	}
	return nil
}

// directPaths opens WebRTC streams to peers (webrtc.Transport).
type directPaths interface {
	OpenStream(ctx context.Context, p peer.ID) (webrtc.Stream, bool, error)
}

// streamGenerator runs a request over a stream already open to a peer (infer.Client).
type streamGenerator interface {
	GenerateOn(ctx context.Context, st infer.Stream, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error)
}

// viaWebRTC runs req on peer p over a data channel, falling back to a libp2p stream when
// the channel cannot be set up or breaks before the first token (see above).
func (d *dispatcher) viaWebRTC(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	st, _, err := d.rtc.OpenStream(ctx, p)
	if err != nil {
		if ctx.Err() != nil {
			return inference.Result{}, fmt.Errorf("webrtc to %s: %w", p, ctx.Err())
		}
		d.rtcStats.fallbacks.Add(1)
		log.Debugw("no WebRTC path; the request goes over libp2p", "peer", p, "err", err)
		return d.peers.Generate(ctx, p, req, emit)
	}
	got := 0
	res, err := d.direct.GenerateOn(ctx, st, p, req, func(tok inference.Token) error {
		got++
		return emit(tok)
	})
	if err == nil {
		d.rtcStats.dispatched.Add(1)
		return res, nil
	}
	if got > 0 || ctx.Err() != nil || !brokenPath(err) {
		return res, err
	}
	d.rtcStats.fallbacks.Add(1)
	log.Debugw("WebRTC channel broke before the first token; the request goes over libp2p", "peer", p, "err", err)
	return d.peers.Generate(ctx, p, req, emit)
}

// brokenPath reports whether err is the path failing (the channel lost or silent) rather
// than the peer answering with an error of its own.
func brokenPath(err error) bool {
	var e *inference.Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Code == inference.CodePeerLost || e.Code == inference.CodeTimeout || e.Code == inference.CodeUnavailable
}

// webrtcStatus is the "webrtc" object of /api/status.
func (n *Node) webrtcStatus() *console.WebRTC {
	if n.rtc == nil {
		return nil
	}
	st := n.rtc.Stats()
	out := &console.WebRTC{
		Open: st.Open, Streams: st.Streams, WarmHits: st.WarmHits, ColdSetups: st.ColdSetups,
		Accepted: st.Accepted, Relayed: st.RelayedAccepted, SetupFailures: st.SetupFailures, IdleClosed: st.IdleClosed,
	}
	if d := n.router; d != nil {
		out.Dispatched, out.Fallbacks = d.rtcStats.dispatched.Load(), d.rtcStats.fallbacks.Load()
	}
	return out
}
