package bwprobe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	logging "github.com/ipfs/go-log/v2"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/internal/bandwidth"
	"github.com/meshinfer/meshinfer/internal/frame"
	"github.com/meshinfer/meshinfer/internal/window"
)

var log = logging.Logger("transport/bwprobe")

// stream is what a probe exchange needs of a stream; a libp2p stream is one.
type stream interface {
	io.ReadWriter
	SetDeadline(time.Time) error
	SetReadDeadline(time.Time) error
}

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithClock sets the clock the server dates its samples and rate-limits peers with
// (time.Now). Deadlines and transfer times are on the monotonic clock regardless.
func WithClock(now func() time.Time) ServerOption { return func(s *Server) { s.now = now } }

// WithAdmission sets a check made before a probe is accepted: a non-nil error refuses it
// with its code (inference.CodeOf), policy_paused for a node that does not contribute now.
func WithAdmission(admit func(from peer.ID) error) ServerOption {
	return func(s *Server) { s.admit = admit }
}

// ServerStats counts what a server did.
type ServerStats struct {
	Served  uint64 // probes answered to the end
	Refused uint64 // requests refused: over the bounds, the limits or the admission
}

// Server answers bandwidth probes on a host, and adds what it measures of each client's
// upload to an estimator.
type Server struct {
	h     host.Host
	est   *bandwidth.Estimator
	now   func() time.Time
	admit func(peer.ID) error

	ctx    context.Context // cancelled by Close: every exchange is reset
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per stream being handled

	served, refused atomic.Uint64

	mu      sync.Mutex
	closed  bool
	busy    map[peer.ID]bool      // peers with a probe running: at most MaxServing, one each
	started window.Keyed[peer.ID] // when each peer's latest accepted probe started
}

// NewServer answers ID on h, adding the transfers it times to est. Close removes the
// handler and ends the exchanges running.
func NewServer(h host.Host, est *bandwidth.Estimator, opts ...ServerOption) *Server {
	s := newServer(est, opts...)
	s.h = h
	h.SetStreamHandler(ID, s.handle)
	return s
}

// newServer is a Server on no host: its exchanges are run by handle or, in tests, serve.
func newServer(est *bandwidth.Estimator, opts ...ServerOption) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{est: est, now: time.Now, ctx: ctx, cancel: cancel, busy: make(map[peer.ID]bool),
		started: window.Keyed[peer.ID]{Length: ServeInterval, Max: 1, Cap: maxPeersRemembered}}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Close stops answering probes, resets the exchanges running and waits for their
// handlers. Idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	first := !s.closed
	s.closed = true
	s.mu.Unlock()
	if !first {
		return nil
	}
	if s.h != nil {
		s.h.RemoveStreamHandler(ID)
	}
	s.cancel()
	s.wg.Wait()
	return nil
}

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{Served: s.served.Load(), Refused: s.refused.Load()}
}

// handle serves one probe stream: reset when it breaks, closed when it ends in order (a
// refusal included).
func (s *Server) handle(st network.Stream) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		st.Reset()
		return
	}
	s.wg.Add(1) // under mu: Close's Wait starts after every Add it has to wait for
	s.mu.Unlock()
	defer s.wg.Done()
	from := st.Conn().RemotePeer()
	if err := st.Scope().SetService(ServiceName); err != nil {
		log.Debugw("probe refused by the resource manager", "peer", from, "err", err)
		st.Reset()
		return
	}
	stop := context.AfterFunc(s.ctx, func() { st.Reset() })
	defer stop()
	if err := s.serve(from, st); err != nil {
		log.Debugw("probe failed", "peer", from, "err", err)
		st.Reset()
		return
	}
	st.Close()
}

// serve runs the server's side of one exchange with from on st (see the package doc).
// A refusal is an orderly end (nil); an error means st broke or broke the protocol.
func (s *Server) serve(from peer.ID, st stream) error {
	opened := time.Now()
	// Deadline first: the request soon, the whole exchange within ProbeTimeout.
	if err := st.SetDeadline(opened.Add(ProbeTimeout)); err != nil {
		return err
	}
	if err := st.SetReadDeadline(opened.Add(RequestTimeout)); err != nil {
		return err
	}
	body, err := frame.ReadOne(st, MaxRequestFrame)
	if err != nil {
		return fmt.Errorf("read request: %w", err)
	}
	up, down, err := decodeRequest(body)
	if err != nil {
		return err
	}
	if err := st.SetReadDeadline(opened.Add(ProbeTimeout)); err != nil {
		return err
	}
	if code := s.acquire(from, up, down); code != "" {
		s.refused.Add(1)
		log.Debugw("probe refused", "peer", from, "err", code)
		return frame.Write(st, encodeRefuse(code))
	}
	defer s.release(from)
	if err := frame.Write(st, []byte{frameAccept}); err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	// Exactly the bytes accepted are read, through a meter: the client's upload, this
	// node's Down.
	m := bandwidth.NewMeter(st)
	buf := make([]byte, chunk)
	if err := discard(m, buf, up); err != nil {
		return fmt.Errorf("read payload: %w", err)
	}
	if s.est != nil {
		s.est.Observe(from.String(), m.Take(), s.now())
	}
	if err := frame.Write(st, []byte{frameReceived}); err != nil {
		return fmt.Errorf("received: %w", err)
	}
	if err := send(st, buf, down); err != nil {
		return fmt.Errorf("send payload: %w", err)
	}
	s.served.Add(1)
	return nil
}

// acquire admits a probe of up and down bytes from p, or returns the code to refuse it
// with. An admitted probe must be released.
func (s *Server) acquire(p peer.ID, up, down uint64) inference.Code {
	if !withinBounds(up, down) {
		return inference.CodeInvalidRequest
	}
	if s.admit != nil {
		if err := s.admit(p); err != nil {
			return inference.CodeOf(err)
		}
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.busy) >= MaxServing || s.busy[p] || !s.started.Allow(p, now) {
		return inference.CodeOverloaded
	}
	s.started.Add(p, now)
	s.busy[p] = true
	return ""
}

func (s *Server) release(p peer.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.busy, p)
}

// discard reads exactly n bytes from r into buf, chunk by chunk, and nothing more.
func discard(r io.Reader, buf []byte, n uint64) error {
	for n > 0 {
		k := min(n, uint64(len(buf)))
		if _, err := io.ReadFull(r, buf[:k]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		n -= k
	}
	return nil
}

// send writes n bytes of buf's (zeros) to w, chunk by chunk.
func send(w io.Writer, buf []byte, n uint64) error {
	clear(buf)
	for n > 0 {
		k := min(n, uint64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
