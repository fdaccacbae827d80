package node

import (
	"fmt"
	"os"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	pionwebrtc "github.com/pion/webrtc/v4"

	"github.com/meshinfer/meshinfer/node/console"
	"github.com/meshinfer/meshinfer/transport/webrtc"
)

// WebRTC direct paths.
//
// Every node runs a webrtc.Transport, to send requests over data channels: the executor
// (node/dispatch) uses one for a mesh attempt when the request's transport preference is
// webrtc, falling back to a libp2p stream when the channel cannot be set up within
// Config.WebRTCConnectTimeout (webrtc.DefaultConnectTimeout) or breaks before the first
// token.
//
// Only a node with Config.WebRTCAccept answers peers' set-ups: it registers the signaling
// protocol (webrtc.SignalID) and, when it serves models, direct tasks (infer.DirectID).
// A node without it registers neither, so a peer's set-up fails as soon as the protocol is
// negotiated and the peer's request goes over libp2p. Either way the node answers each
// channel a peer opens on a PeerConnection with its inference server, as it answers a
// libp2p stream: without WebRTCAccept, those are only PeerConnections it set up itself.

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
		Accept:     n.cfg.WebRTCAccept,
		ICEServers: servers, ConnectTimeout: n.cfg.WebRTCConnectTimeout,
		SettingEngine: n.cfg.WebRTCSettingEngine, Now: n.cfg.Now, Observer: n.rep,
	})
	if err != nil {
		return fmt.Errorf("webrtc: %w", err)
	}
	n.rtc = t
	n.closers = append(n.closers, t.Close) // before the inference server closes
	if srv := n.infer; srv != nil {
		t.SetStreamHandler(func(from peer.ID, s webrtc.Stream) { srv.ServeStream(from, n.part.traffic.stream(s)) })
	}
	return nil
}

// webrtcStatus is the "webrtc" object of /api/status.
func (n *Node) webrtcStatus() *console.WebRTC {
	if n.rtc == nil {
		return nil
	}
	st := n.rtc.Stats()
	out := &console.WebRTC{
		Accepting: n.cfg.WebRTCAccept, Open: st.Open, Streams: st.Streams, WarmHits: st.WarmHits, ColdSetups: st.ColdSetups,
		Accepted: st.Accepted, Relayed: st.RelayedAccepted, SetupFailures: st.SetupFailures, IdleClosed: st.IdleClosed,
	}
	if n.exec != nil {
		out.Dispatched, out.Fallbacks = n.exec.WebRTCCounts()
	}
	return out
}
