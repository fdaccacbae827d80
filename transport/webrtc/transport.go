package webrtc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/pion/ice/v4"
	"github.com/pion/webrtc/v4"

	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/reputation"
)

// Defaults of Config.
const (
	// DefaultConnectTimeout bounds a cold set-up: signaling, ICE, DTLS and SCTP. On a direct
	// path they take about seven round trips (offer and answer over the libp2p connection,
	// an ICE check and its nomination, the DTLS and SCTP handshakes; B4 measures six with
	// signaling on loopback): 1.4 s at a 200 ms intercontinental RTT. 5 s leaves room for a
	// lost DTLS flight (pion resends after 1 s), pion's 200 ms ICE check period and STUN
	// gathering, yet gives up on a peer that cannot be reached directly long before infer's
	// 30 s first-token timeout, so the caller can still fall back to a libp2p stream.
	DefaultConnectTimeout = 5 * time.Second
	// DefaultIdleClose: a connected PeerConnection costs a UDP socket per local address, an
	// ICE keepalive every 2 s and about twenty goroutines. Two minutes spans the think time
	// between the turns of a conversation, so its next request goes out warm, and frees an
	// abandoned PeerConnection soon after.
	DefaultIdleClose = 2 * time.Minute
	// DefaultMaxWarm: a node sends its requests to the few peers the router ranks best;
	// eight PeerConnections keep those warm at a bounded cost in sockets and goroutines.
	DefaultMaxWarm = 8
	// maxIncomingPerConn bounds the streams a remote may have open on one PeerConnection
	// (16): a peer's inference server admits 8 requests per requester, and a requester has
	// no use for more channels than that at once; twice leaves room for channels closing.
	// Beyond it a new channel is closed at once.
	maxIncomingPerConn = 16
	// maxStreams bounds the streams open over every PeerConnection together (256): each
	// holds a goroutine and buffers (up to maxMessage read, sendHighWater queued).
	maxStreams = 256
	// maxConnsPerPeer bounds the PeerConnections kept to one peer: two when both peers set
	// up at once; a third would never be used (OpenStream picks the most recently used).
	// The bound is lower on a small pool (warmShare): one peer must not take the whole
	// pool by setting up again and again.
	maxConnsPerPeer = 2
	// maxRelayedPerRelay bounds the relayed set-ups one relaying peer (a coordinator) has
	// under way at once (4): a quarter of MaxIncomingSetups, so that a flooding
	// coordinator leaves the other three quarters to other coordinators and to peers
	// signalling over SignalID. A coordinator relays many clients' tasks, hence more than
	// a libp2p peer's one; a set-up lasts about seven round trips, so four at a time
	// still sets up dozens a second.
	maxRelayedPerRelay = MaxIncomingSetups / 4
	// maxSweepInterval bounds the idle sweep's period; it runs 4 times per IdleClose, so a
	// PeerConnection is closed at most a quarter of IdleClose late.
	maxSweepInterval = 30 * time.Second
	// maxOpenAttempts bounds how many PeerConnections one OpenStream tries when the one it
	// picked dies (or runs out of data channel IDs) while the stream opens.
	maxOpenAttempts = 3
)

// ErrSetupTimeout is returned (wrapped) by OpenStream when ICE, DTLS or SCTP did not
// connect within Config.ConnectTimeout, or ICE failed before it.
var ErrSetupTimeout = errors.New("webrtc set-up timed out")

// ErrSignaling is returned (wrapped) by OpenStream when the signaling exchange failed: the
// peer does not speak SignalID, refused the set-up, reset the stream or sent a bad message.
var ErrSignaling = errors.New("webrtc signaling failed")

// ErrBusy is returned (wrapped, with ErrSignaling) by AcceptRelayed when
// MaxIncomingSetups set-ups are already under way, or the relaying peer's share of them;
// a libp2p offerer sees the same refusal as a reset signaling stream. The client may try
// another peer.
var ErrBusy = errors.New("too many webrtc set-ups in progress")

// ErrNotAccepting is returned (wrapped, with ErrSignaling) by AcceptRelayed on a
// Transport whose Config.Accept is off. A libp2p offerer sees the same refusal as a peer
// that does not support SignalID.
var ErrNotAccepting = errors.New("webrtc set-ups not accepted here")

// ErrTooManyStreams refuses a data channel beyond maxIncomingPerConn on its PeerConnection,
// beyond maxStreams in all, or past the peer's limits in the host's resource manager.
var ErrTooManyStreams = errors.New("too many webrtc streams")

// ErrClosed is returned once the Transport is closed.
var ErrClosed = errors.New("webrtc transport closed")

// Config configures a Transport. The zero value is usable: each zero field takes its
// default.
type Config struct {
	// Accept makes the Transport answer set-ups that peers offer: it registers SignalID on
	// the host and AcceptRelayed serves relayed ones. Off (the default), peers cannot make
	// this node set up a PeerConnection: it only offers (OpenStream), and the remote may
	// still open streams on a PeerConnection this node set up, which go to the stream
	// handler as any others.
	Accept bool
	// ICEServers are the STUN and TURN servers ICE may use. None are needed on a LAN or on
	// loopback (default none: host candidates only).
	ICEServers []webrtc.ICEServer
	// ConnectTimeout bounds a cold set-up (DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// IdleClose closes a PeerConnection with no open stream for this long
	// (DefaultIdleClose).
	IdleClose time.Duration
	// MaxWarm is the most PeerConnections kept, either direction (DefaultMaxWarm).
	MaxWarm int
	// SettingEngine configures pion (for tests: a virtual network, timeouts, candidate
	// filters). nil means DefaultSettingEngine(); start from it to change a setting. The
	// Transport copies it and always enables detached data channels; a nil LoggerFactory
	// becomes the one routing pion's logs into go-log.
	SettingEngine *webrtc.SettingEngine
	// Now is the clock of idle accounting (time.Now).
	Now func() time.Time
	// Observer, when set, records a peer whose signaling breaks the protocol (a malformed
	// or oversized message, too many candidates) in its score.
	Observer Observer
}

// Observer records a peer's protocol violations in its score; reputation.Store is one.
type Observer interface {
	Observe(peer string, e reputation.Event, now time.Time)
}

// violated records err against p when it is the peer's protocol violation: a signaling
// message that does not parse or breaks its bounds. Network failures and timeouts say
// nothing about integrity and are not recorded.
func (t *Transport) violated(p peer.ID, err error) {
	if t.cfg.Observer == nil || p == "" {
		return
	}
	switch {
	case errors.Is(err, frame.ErrTooLarge), errors.Is(err, frame.ErrMalformed):
		t.cfg.Observer.Observe(p.String(), reputation.MalformedFrame, t.cfg.Now())
	case errors.Is(err, errSignalMessage):
		t.cfg.Observer.Observe(p.String(), reputation.ProtocolViolation, t.cfg.Now())
	}
}

func (c *Config) validate() error {
	switch {
	case c.ConnectTimeout < 0:
		return fmt.Errorf("negative connect timeout %v", c.ConnectTimeout)
	case c.IdleClose < 0:
		return fmt.Errorf("negative idle close %v", c.IdleClose)
	case c.MaxWarm < 0:
		return fmt.Errorf("negative max warm %d", c.MaxWarm)
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.IdleClose == 0 {
		c.IdleClose = DefaultIdleClose
	}
	if c.MaxWarm == 0 {
		c.MaxWarm = DefaultMaxWarm
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// DefaultSettingEngine returns the SettingEngine a Transport uses when
// Config.SettingEngine is nil.
func DefaultSettingEngine() *webrtc.SettingEngine {
	se := &webrtc.SettingEngine{LoggerFactory: loggerFactory{}}
	se.DetachDataChannels()
	// pion leaves out loopback host candidates (ICE forbids them). Two nodes on one
	// machine, and a machine whose only interface up is loopback, need them; go-libp2p's
	// WebRTC transport includes them too.
	se.SetIncludeLoopbackCandidate(true)
	// mDNS candidates hide a browser's addresses from the page; between nodes they only
	// cost a multicast socket and lookups.
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	// With trickle ICE a peer's check can arrive before the candidate it comes from, as a
	// peer-reflexive candidate: use it at once rather than after pion's default 1 s.
	se.SetPrflxAcceptanceMinWait(0)
	// The DTLS cookie exchange guards a server against handshakes from spoofed addresses.
	// pion's ICE only passes on DTLS from remote candidates it has checked with the ICE
	// credentials that came over the authenticated signaling stream, so the cookie adds
	// nothing here but a round trip to every cold set-up.
	se.SetDTLSInsecureSkipHelloVerify(true)
	return se
}

// Stats counts what a Transport did.
type Stats struct {
	Open            int    `json:"open"`             // connected PeerConnections kept, either direction (relayed ones are not)
	Relayed         int    `json:"relayed"`          // relayed PeerConnections (AcceptRelayed) being set up or not yet closed
	Streams         int    `json:"streams"`          // streams not yet ended, relayed ones included (a closed one ends when the remote closes too, or after drainTimeout)
	WarmHits        uint64 `json:"warm_hits"`        // OpenStream calls served by a PeerConnection already connected
	ColdSetups      uint64 `json:"cold_setups"`      // PeerConnections this node offered and connected
	Accepted        uint64 `json:"accepted"`         // PeerConnections a remote peer offered over SignalID and this node connected
	RelayedAccepted uint64 `json:"relayed_accepted"` // AcceptRelayed calls that returned a stream
	SetupFailures   uint64 `json:"setup_failures"`   // set-ups that failed, either direction, relayed ones included, after signaling started (an incoming one: after its offer was read)
	IdleClosed      uint64 `json:"idle_closed"`      // PeerConnections closed for having no stream for IdleClose
	Evicted         uint64 `json:"evicted"`          // PeerConnections closed to stay within MaxWarm or the per-peer bound
}

// Transport opens and accepts WebRTC data-channel streams to and from peers of a libp2p
// host.
type Transport struct {
	h   host.Host // nil in the Transport DialRelayed makes for its one PeerConnection
	cfg Config
	api *webrtc.API

	ctx    context.Context // cancelled by Close: set-ups in progress end
	cancel context.CancelFunc
	// wg counts every goroutine the Transport runs or waits for: OpenStream and
	// AcceptRelayed calls and signaling handlers while they run, stream handlers, drains,
	// PeerConnection closes and the sweep loop. Add only under mu while !closed.
	wg sync.WaitGroup

	warmHits, coldSetups, accepted, relayedAccepted, setupFailures, idleClosed, evicted atomic.Uint64

	mu          sync.Mutex
	closed      bool
	handler     func(peer.ID, Stream)
	conns       []*peerConn            // connected PeerConnections, at most MaxWarm
	relayed     map[*peerConn]struct{} // relayed PeerConnections, from creation until closed
	pending     map[peer.ID]*setup     // outgoing set-ups in progress
	incoming    map[peer.ID]struct{}   // incoming set-ups in progress over SignalID
	relaySetups int                    // AcceptRelayed set-ups in progress
	relaying    map[peer.ID]int        // AcceptRelayed set-ups in progress, by relaying peer
	streams     int                    // streams not yet ended, over every PeerConnection
}

// setup is an outgoing set-up in progress; later OpenStream calls to its peer wait for it.
type setup struct {
	done chan struct{} // closed when it ends
	err  error         // its outcome, written before done is closed
}

// New returns a Transport on h. With Config.Accept it registers the signaling handler on
// h; Close removes it.
func New(h host.Host, cfg Config) (*Transport, error) {
	t, err := assemble(h, cfg)
	if err != nil {
		return nil, err
	}
	t.wg.Add(1)
	go t.sweepLoop() // ends when Close cancels ctx
	if t.cfg.Accept {
		h.SetStreamHandler(SignalID, t.handleSignal)
	}
	return t, nil
}

// assemble returns a Transport that runs nothing yet: no sweep, no handler on h (which
// may be nil).
func assemble(h host.Host, cfg Config) (*Transport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var se webrtc.SettingEngine
	if cfg.SettingEngine != nil {
		se = *cfg.SettingEngine
	} else {
		se = *DefaultSettingEngine()
	}
	se.DetachDataChannels()
	if se.LoggerFactory == nil {
		se.LoggerFactory = loggerFactory{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Transport{
		h: h, cfg: cfg, api: webrtc.NewAPI(webrtc.WithSettingEngine(se)),
		ctx: ctx, cancel: cancel,
		relayed: make(map[*peerConn]struct{}), relaying: make(map[peer.ID]int),
		pending: make(map[peer.ID]*setup), incoming: make(map[peer.ID]struct{}),
	}, nil
}

// SetStreamHandler sets the function called with each stream a peer opens, on a goroutine
// of its own. The handler owns the stream: it must Close or Reset it, and return once the
// stream fails (Close waits for running handlers). With no handler (nil), incoming streams
// are reset.
func (t *Transport) SetStreamHandler(fn func(from peer.ID, s Stream)) {
	t.mu.Lock()
	t.handler = fn
	t.mu.Unlock()
}

// OpenStream opens a new stream to p. It uses a PeerConnection to p that is already
// connected (warm is true) or sets one up, signalled over a libp2p stream to p (warm is
// false; a concurrent call to the same peer waits for the set-up under way rather than
// making another). Set-up failures wrap ErrSetupTimeout or ErrSignaling; when ctx ends
// first, its error is returned (wrapped).
func (t *Transport) OpenStream(ctx context.Context, p peer.ID) (s Stream, warm bool, err error) {
	if p == t.h.ID() {
		return nil, false, errors.New("open webrtc stream to self")
	}
	if !t.enter() {
		return nil, false, ErrClosed
	}
	defer t.wg.Done()

	waited := false
	var lastErr error
	for attempt := 0; attempt < maxOpenAttempts; {
		c, su, mine := t.lookup(p)
		switch {
		case c != nil:
			attempt++
			s, err := c.openStream(ctx)
			if err == nil {
				if !waited {
					t.warmHits.Add(1)
				}
				return s, !waited, nil
			}
			if err := t.ctxErr(ctx, p); err != nil {
				return nil, false, err
			}
			log.Debugw("warm peer connection unusable", "peer", p, "err", err)
			lastErr = err
			t.retire(c)
		case mine:
			attempt++
			s, err := t.dialAndAdd(ctx, p, su)
			if err != nil {
				return nil, false, err
			}
			return s, false, nil
		default:
			select {
			case <-su.done:
			case <-ctx.Done():
				return nil, false, fmt.Errorf("webrtc set-up with %s: %w", p, ctx.Err())
			}
			waited = true
			// The set-up's own failures apply to this call too; a caller's cancellation does
			// not: then this call sets up on its next turn.
			if errors.Is(su.err, ErrSetupTimeout) || errors.Is(su.err, ErrSignaling) {
				return nil, false, su.err
			}
		}
	}
	return nil, false, fmt.Errorf("webrtc stream to %s after %d attempts: %w", p, maxOpenAttempts, lastErr)
}

// lookup returns a connected PeerConnection to p, or else the set-up in progress to p
// (mine when this call registered it and must run it).
func (t *Transport) lookup(p peer.ID) (c *peerConn, su *setup, mine bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, pc := range t.conns {
		if pc.peer == p && !pc.retired && (c == nil || pc.lastUsed.After(c.lastUsed)) {
			c = pc
		}
	}
	if c != nil {
		return c, nil, false
	}
	if su := t.pending[p]; su != nil {
		return nil, su, false
	}
	su = &setup{done: make(chan struct{})}
	t.pending[p] = su
	return nil, su, true
}

// dialAndAdd runs the set-up su registered for p and adds its PeerConnection to the pool.
func (t *Transport) dialAndAdd(ctx context.Context, p peer.ID, su *setup) (*stream, error) {
	start := time.Now()
	c, s, err := t.dial(ctx, p)
	t.mu.Lock()
	delete(t.pending, p)
	// Added before done is closed (under the same lock), so a waiter finds it.
	if err == nil && !t.addLocked(c) {
		err = ErrClosed
	}
	su.err = err
	close(su.done)
	t.mu.Unlock()
	if err != nil {
		if c != nil {
			c.close(err)
		}
		t.setupFailures.Add(1)
		return nil, err
	}
	t.coldSetups.Add(1)
	log.Debugw("webrtc set-up", "peer", p, "dur", time.Since(start))
	return s, nil
}

// addLocked adds a connected PeerConnection to the pool and schedules the closing of those
// beyond the bounds. It reports false when c may not be added (closed Transport, dead c).
func (t *Transport) addLocked(c *peerConn) bool {
	if t.closed || c.dead {
		return false
	}
	c.lastUsed = t.cfg.Now()
	t.conns = append(t.conns, c)
	views := make([]connView, len(t.conns))
	for i, pc := range t.conns {
		views[i] = pc.viewLocked()
	}
	out := evictions(views, len(t.conns)-1, t.cfg.MaxWarm, warmShare(t.cfg.MaxWarm))
	victims := make([]*peerConn, len(out))
	for i, j := range out {
		victims[i] = t.conns[j]
	}
	for _, v := range victims {
		v.dead = true
		t.removeLocked(v)
		t.evicted.Add(1)
		t.goLocked(func() { v.close(errEvicted) })
	}
	return true
}

// removeLocked takes c out of the pool, if it is there.
func (t *Transport) removeLocked(c *peerConn) {
	for i, pc := range t.conns {
		if pc == c {
			t.conns = append(t.conns[:i], t.conns[i+1:]...)
			return
		}
	}
}

// retire stops c from serving new streams (it failed to open one); it closes when idle.
func (t *Transport) retire(c *peerConn) {
	t.mu.Lock()
	c.retired = true
	t.mu.Unlock()
}

// enter counts a caller in wg unless the Transport is closed.
func (t *Transport) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	return true
}

// goLocked runs fn on a goroutine counted in wg, unless the Transport is closed (then the
// caller, or Close, does the work). t.mu must be held.
func (t *Transport) goLocked(fn func()) bool {
	if t.closed {
		return false
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		fn()
	}()
	return true
}

// goAsync is goLocked for callers not holding t.mu.
func (t *Transport) goAsync(fn func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.goLocked(fn)
}

// ctxErr returns the error for an operation ended by ctx or by Close, else nil.
func (t *Transport) ctxErr(ctx context.Context, p peer.ID) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("webrtc stream to %s: %w", p, err)
	}
	if t.ctx.Err() != nil {
		return ErrClosed
	}
	return nil
}

// dispatch hands an incoming stream to the handler on a goroutine of its own.
func (t *Transport) dispatch(from peer.ID, s *stream) {
	t.mu.Lock()
	fn := t.handler
	ok := fn != nil && t.goLocked(func() { fn(from, s) })
	t.mu.Unlock()
	if !ok {
		s.Reset()
	}
}

// Stats returns a snapshot of the counters.
func (t *Transport) Stats() Stats {
	t.mu.Lock()
	open, relayed, streams := len(t.conns), len(t.relayed), t.streams
	t.mu.Unlock()
	return Stats{
		Open: open, Relayed: relayed, Streams: streams,
		WarmHits: t.warmHits.Load(), ColdSetups: t.coldSetups.Load(), Accepted: t.accepted.Load(),
		RelayedAccepted: t.relayedAccepted.Load(), SetupFailures: t.setupFailures.Load(),
		IdleClosed: t.idleClosed.Load(), Evicted: t.evicted.Load(),
	}
}

// Close removes the signaling handler, ends set-ups in progress (relayed ones included),
// closes every PeerConnection, relayed ones too (their streams fail with ErrReset), and
// waits for every goroutine the Transport started, stream handlers included. Data a closed
// stream had not yet delivered is lost. Idempotent.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	conns := t.conns
	t.conns = nil
	for c := range t.relayed {
		conns = append(conns, c)
	}
	t.mu.Unlock()

	if t.h != nil && t.cfg.Accept {
		t.h.RemoveStreamHandler(SignalID)
	}
	t.cancel()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() { c.close(ErrClosed) })
	}
	wg.Wait()
	t.wg.Wait()
	return nil
}
