package openai

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	logging "github.com/ipfs/go-log/v2"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/transport"
)

var log = logging.Logger("transport/openai")

// DefaultAddr is where a node serves the API unless told otherwise (--api).
const DefaultAddr = "127.0.0.1:9337"

// Limits of the HTTP server (transport.HTTPLimits; the header's are transport's). None
// bounds a response: a stream lasts as long as its generation, and writeTimeout bounds each
// write instead. A connection upgraded to the gateway's WebSocket leaves these deadlines
// behind and has the gateway's own (transport/gateway), but still counts in connsPerIP.
const (
	// readTimeout bounds reading a whole request, header and body: a maximal body (256 KiB)
	// needs well under a second on any link this API should serve.
	readTimeout = 30 * time.Second
	// idleTimeout closes a keep-alive connection left unused this long.
	idleTimeout = 2 * time.Minute
	// connsPerIP bounds the connections one client address holds at once. On loopback every
	// local program shares 127.0.0.1; in front of a coordinator a household or an office
	// shares one NAT address, each thin client with its WebSocket and a few REST calls.
	// 512 is twice docs/reliability.md's L1 load (256 WebSocket clients on one machine,
	// `make soak`), while one address's slow connections hold at most 512 goroutines and
	// 512 × 40 KiB of header buffers.
	connsPerIP = 512
	// shutdownGrace is how long Close lets requests in flight finish on their own;
	// terminalGrace is how long it then gives them, cancelled, to write their shutting_down
	// terminal event before connections are closed. Together: Close's 2 s bound.
	shutdownGrace = 1500 * time.Millisecond
	terminalGrace = 500 * time.Millisecond
)

// ErrNotLoopback is returned by New for a non-loopback address without WithPublic(true).
var ErrNotLoopback = transport.ErrNotLoopback

// errShuttingDown is the cause with which Close cancels the requests still in flight; the
// handlers send it as their terminal error.
var errShuttingDown = inference.Errorf(inference.CodeShuttingDown, "node is shutting down")

// Option configures a Server (New) or a Handler.
type Option func(*config)

type config struct {
	http     transport.HTTPLimits
	public   bool
	limits   inference.Limits
	local    Local
	defaults inference.Prefs
	wrap     func(http.Handler) http.Handler
	tlsCert  string
	tlsKey   string
}

// httpLimits are the server's limits: the constants above and transport's shared ones.
func httpLimits() transport.HTTPLimits {
	l := transport.SharedHTTPLimits()
	l.ReadTimeout, l.IdleTimeout, l.ConnsPerIP = readTimeout, idleTimeout, connsPerIP
	return l
}

// withHTTPLimits replaces the server's limits (tests narrow them).
func withHTTPLimits(l transport.HTTPLimits) Option { return func(c *config) { c.http = l } }

// WithPublic allows a non-loopback listen address. The API serves anyone who can reach it,
// with no authentication: expose it on purpose only. Handler ignores it.
func WithPublic(public bool) Option { return func(c *config) { c.public = public } }

// WithLimits sets the request limits; zero fields mean inference's defaults (the default).
func WithLimits(l inference.Limits) Option { return func(c *config) { c.limits = l } }

// WithLocal sets where local-only requests go: the privacy gate hands them to l and never to
// the Dispatcher (node passes a localonly.Gate over its backend). Without it every local-only
// request is refused with local_unavailable.
func WithLocal(l Local) Option { return func(c *config) { c.local = l } }

// WithDefaultPrefs sets the node's preferences, which fill the fields a request leaves unset
// (node passes its flags'). Empty fields fall back to inference.DefaultPrefs. New refuses an
// unknown value; Handler, which cannot fail, logs it and drops p.
func WithDefaultPrefs(p inference.Prefs) Option { return func(c *config) { c.defaults = p } }

// WithWrap puts wrap around the API's handler, outermost: the coordinator's key check and
// extra routes (transport/gateway). Handler ignores it.
func WithWrap(wrap func(http.Handler) http.Handler) Option { return func(c *config) { c.wrap = wrap } }

// WithTLS serves HTTPS with the PEM certificate chain and key in these files (TLS 1.2 or
// newer). Handler ignores it.
func WithTLS(certFile, keyFile string) Option {
	return func(c *config) { c.tlsCert, c.tlsKey = certFile, keyFile }
}

// Server is the node's OpenAI-compatible HTTP server.
type Server struct {
	ln  net.Listener
	srv *http.Server
	// cancel ends the context every request's context derives from; Close calls it with
	// errShuttingDown for the requests that outlive shutdownGrace.
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup // the serve goroutine
	once   sync.Once

	// shutdownGrace and terminalGrace are the constants of the same names; tests shorten them.
	shutdownGrace, terminalGrace time.Duration

	mu       sync.Mutex
	closing  bool           // Close began: new requests get shutting_down
	handlers sync.WaitGroup // requests being handled; Add only under mu while !closing
}

// New listens on addr and serves d, and local-only requests on WithLocal's Local. A
// non-loopback addr is refused (ErrNotLoopback) unless WithPublic(true), and default
// preferences with an unknown value are refused too.
func New(addr string, d Dispatcher, opts ...Option) (*Server, error) {
	cfg := config{http: httpLimits()}
	for _, o := range opts {
		o(&cfg)
	}
	if err := CheckAddr(addr, cfg.public); err != nil {
		return nil, err
	}
	if err := cfg.defaults.Validate(); err != nil {
		return nil, fmt.Errorf("api default preferences: %w", err)
	}
	var tlsConf *tls.Config
	if cfg.tlsCert != "" || cfg.tlsKey != "" {
		cert, err := tls.LoadX509KeyPair(cfg.tlsCert, cfg.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("api TLS certificate %s and key %s: %w", cfg.tlsCert, cfg.tlsKey, err)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	tcp, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("api listen on %s: %w", addr, err)
	}
	// The per-client cap counts TCP connections, under TLS: a refused one costs no handshake.
	var ln net.Listener = cfg.http.Listener(tcp)
	if tlsConf != nil {
		ln = tls.NewListener(ln, tlsConf)
	}
	var h http.Handler = newHandler(d, cfg)
	if cfg.wrap != nil {
		h = cfg.wrap(h)
	}
	if !cfg.public {
		h = transport.LoopbackHosts(h) // no DNS rebinding: the Host must be this machine
	}
	base, cancel := context.WithCancelCause(context.Background())
	s := &Server{ln: ln, cancel: cancel, shutdownGrace: shutdownGrace, terminalGrace: terminalGrace}
	s.srv = cfg.http.Server(s.track(h))
	s.srv.BaseContext = func(net.Listener) context.Context { return base }
	// Serve returns when Close shuts the server down.
	s.wg.Go(func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Errorw("api stopped", "err", err)
		}
	})
	return s, nil
}

// Addr is the address the API listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server. Requests in flight get shutdownGrace to finish; those still running
// are then cancelled and end with a shutting_down error (a JSON error, or a final error event
// in a stream), and after terminalGrace every connection is closed. Close returns once the
// serve goroutine and every handler have returned, so the Dispatcher is never called after
// it; a Dispatcher that honours its context's cancellation keeps that within about 2 s.
// Idempotent.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		s.mu.Lock()
		s.closing = true
		s.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), s.shutdownGrace)
		graceful := s.srv.Shutdown(ctx) == nil
		cancel()
		if !graceful {
			s.cancel(errShuttingDown)
			// A handler's return is not its response's departure: net/http flushes what the
			// handler wrote after it returns. So Shutdown again, which returns once every
			// connection is idle, each response flushed; only after terminalGrace are the
			// connections still busy closed.
			ctx, cancel := context.WithTimeout(context.Background(), s.terminalGrace)
			if errors.Is(s.srv.Shutdown(ctx), context.DeadlineExceeded) {
				err = s.srv.Close()
			}
			cancel()
			s.handlers.Wait() // upgraded (WebSocket) connections, which Shutdown does not track
		}
		s.cancel(errShuttingDown) // releases the base context
		s.wg.Wait()
	})
	return err
}

// track counts the requests being handled, so that Close can wait for them, and refuses
// requests that arrive once Close began.
func (s *Server) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			w.Header().Set("Connection", "close")
			writeError(w, errShuttingDown)
			return
		}
		s.handlers.Add(1)
		s.mu.Unlock()
		defer s.handlers.Done()
		next.ServeHTTP(w, r)
	})
}

// CheckAddr returns an error for an address New would refuse: malformed, or not loopback
// while public is false. Callers use it to refuse a bad address before starting anything.
func CheckAddr(addr string, public bool) error {
	err := transport.CheckLoopback(addr)
	switch {
	case errors.Is(err, transport.ErrNotLoopback) && public:
		return nil
	case errors.Is(err, transport.ErrNotLoopback):
		return fmt.Errorf("api %w; use 127.0.0.1:PORT, or pass --api-public to expose it on purpose", err)
	case err != nil:
		return fmt.Errorf("api %w", err)
	}
	return nil
}
