package dispatch

import (
	"context"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/transport/infer"
	"github.com/meshinfer/meshinfer/transport/webrtc"
)

// Mesh attempts over WebRTC data channels, for requests whose transport preference is
// webrtc (the meshinfer object, X-Meshinfer-Transport, or the node's --webrtc default):
//
//   - the channel comes from a warm PeerConnection to the peer when there is one, else a
//     cold set-up within the transport's connect timeout;
//   - a set-up that fails or times out, or a channel that breaks before the first token,
//     sends the request over a libp2p stream to the same peer instead, counted in
//     /api/status "webrtc.fallbacks";
//   - a channel that breaks after tokens were sent is a failure of the attempt like any
//     other: the failover and resumption rules apply.

// DirectPaths opens WebRTC streams to peers (transport/webrtc's Transport).
type DirectPaths interface {
	OpenStream(ctx context.Context, p peer.ID) (webrtc.Stream, bool, error)
}

// StreamGenerator runs a request over a stream already open to a peer (infer.Client).
type StreamGenerator interface {
	GenerateOn(ctx context.Context, st infer.Stream, p peer.ID, req *inference.Request, emit func(inference.Token) error) (inference.Result, error)
}

// viaWebRTC runs req on peer p over a data channel, falling back to a libp2p stream when
// the channel cannot be set up or breaks before the first token (see above). via, when not
// nil, is set to the transport the request ended up on.
func (d *Executor) viaWebRTC(ctx context.Context, p peer.ID, req *inference.Request, emit func(inference.Token) error, via *inference.Transport) (inference.Result, error) {
	fallback := func() (inference.Result, error) {
		d.stats.rtcFallbacks.Add(1)
		if via != nil {
			*via = inference.TransportLibp2p
		}
		return d.cfg.Peers.Generate(ctx, p, req, emit)
	}
	st, _, err := d.cfg.WebRTC.OpenStream(ctx, p)
	if err != nil {
		if ctx.Err() != nil {
			return inference.Result{}, fmt.Errorf("webrtc to %s: %w", p, ctx.Err())
		}
		log.Debugw("no WebRTC path; the request goes over libp2p", "peer", p, "err", err)
		return fallback()
	}
	got := 0
	res, err := d.cfg.Streams.GenerateOn(ctx, st, p, req, func(tok inference.Token) error {
		got++
		return emit(tok)
	})
	if err == nil {
		d.stats.rtcDispatched.Add(1)
		return res, nil
	}
	if got > 0 || ctx.Err() != nil || !brokenPath(err) {
		return res, err
	}
	log.Debugw("WebRTC channel broke before the first token; the request goes over libp2p", "peer", p, "err", err)
	return fallback()
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
