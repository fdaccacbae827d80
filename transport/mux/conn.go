package mux

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
)

// ID is the protocol ID the libp2p upgrader negotiates for this multiplexer.
const ID = "/meshinfer/mux/1.0.0"

// Limits and defaults (see the package doc).
const (
	hdrSize       = 10
	MaxPayload    = 64 << 10
	Window        = 256 << 10
	MaxStreams    = 4096
	AcceptBacklog = 256
	// maxCredit bounds a stream's send window: credit beyond it is a protocol error.
	maxCredit = 1 << 30
	// maxControl bounds the control frames waiting for the control writer, in bytes; a
	// remote that makes more pile up (by pinging or opening streams faster than its side
	// of the connection takes the answers) loses the connection.
	maxControl = 1024 * hdrSize
	// writeTimeout bounds one write to the socket.
	writeTimeout = 10 * time.Second
	// DefaultKeepAlive is the idle time before a ping; three silent intervals close.
	DefaultKeepAlive = 15 * time.Second
	// DefaultCloseTimeout bounds how long a closed stream waits for the remote's FIN
	// before it is reset.
	DefaultCloseTimeout = 2 * time.Minute
)

// Frame types and flags (see the package doc).
const (
	typeData   byte = 0
	typeWindow byte = 1
	typePing   byte = 2
	typeGoAway byte = 3

	flagSYN byte = 0x01
	flagFIN byte = 0x02
	flagRST byte = 0x04
	flagACK byte = 0x08
)

// Transport is the network.Multiplexer. The zero value uses the defaults.
type Transport struct {
	// KeepAlive is the idle time before a ping (DefaultKeepAlive when zero, none when
	// negative).
	KeepAlive time.Duration
	// CloseTimeout bounds how long a closed stream waits for the remote's FIN
	// (DefaultCloseTimeout when zero).
	CloseTimeout time.Duration
}

var _ network.Multiplexer = (*Transport)(nil)

// NewConn starts multiplexing c. The dialer passes isServer false. Memory is not reserved
// from scope: windows are fixed, so what a connection buffers is bounded by its limits.
func (t *Transport) NewConn(c net.Conn, isServer bool, _ network.PeerScope) (network.MuxedConn, error) {
	return newConn(c, isServer, t), nil
}

// Conn is one multiplexed connection.
type Conn struct {
	nc           net.Conn
	keepAlive    time.Duration
	closeTimeout time.Duration

	// wlock serializes writes to nc (a channel so that a waiting writer can give up at
	// its deadline). wbuf and connDeadline belong to its holder.
	wlock        chan struct{}
	wbuf         []byte
	connDeadline time.Time

	mu      sync.Mutex
	streams map[uint32]*stream
	nextID  uint32 // the next ID this side opens
	err     error  // why the connection closed; set once, under mu

	// Streams the remote opened, waiting for AcceptStream (under mu): queued holds them in
	// order, ended ones included (AcceptStream skips those); backlog counts the live ones.
	queued      []*stream
	backlog     int
	acceptReady chan struct{} // signalled when queued grows
	unacked     chan struct{} // a slot per stream opened here and not yet accepted there
	done        chan struct{} // closed when the connection closes
	closeOnce   sync.Once
	closing     atomic.Bool // set first thing in shutdown: writers stop (done comes last)
	wg          sync.WaitGroup

	ctlMu     sync.Mutex
	ctl       []byte // control frames for the control writer
	ctlNotify chan struct{}

	frames atomic.Uint64 // frames received, for the keep-alive
}

var _ network.MuxedConn = (*Conn)(nil)

func newConn(nc net.Conn, isServer bool, t *Transport) *Conn {
	c := &Conn{
		nc:           nc,
		keepAlive:    t.KeepAlive,
		closeTimeout: t.CloseTimeout,
		wlock:        make(chan struct{}, 1),
		streams:      make(map[uint32]*stream),
		nextID:       1,
		acceptReady:  make(chan struct{}, 1),
		unacked:      make(chan struct{}, AcceptBacklog),
		done:         make(chan struct{}),
		ctlNotify:    make(chan struct{}, 1),
	}
	if isServer {
		c.nextID = 2
	}
	if c.keepAlive == 0 {
		c.keepAlive = DefaultKeepAlive
	}
	if c.closeTimeout <= 0 {
		c.closeTimeout = DefaultCloseTimeout
	}
	c.wg.Add(3)
	go c.recvLoop()
	go c.controlWriter()
	go c.janitor()
	return c
}

// OpenStream opens a stream: its SYN goes out before it returns, so the remote can accept
// it before anything is written. At most AcceptBacklog streams opened here wait for the
// remote's AcceptStream (its ACK); OpenStream blocks for a slot until ctx ends.
func (c *Conn) OpenStream(ctx context.Context) (network.MuxedStream, error) {
	select {
	case c.unacked <- struct{}{}:
	default:
		select {
		case c.unacked <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.done:
			return nil, c.closeErr()
		}
	}
	c.mu.Lock()
	var err error
	switch {
	case c.err != nil:
		err = c.err
	case len(c.streams) >= MaxStreams:
		err = fmt.Errorf("mux: %d streams open on the connection", MaxStreams)
	case c.nextID > 1<<32-3:
		err = errors.New("mux: stream IDs exhausted; open a new connection")
	}
	if err != nil {
		c.mu.Unlock()
		<-c.unacked
		return nil, err
	}
	s := newStream(c, c.nextID)
	s.slot = true
	c.nextID += 2
	c.streams[s.id] = s
	c.mu.Unlock()
	deadline, _ := ctx.Deadline()
	if err := c.writeFrame(s, typeWindow, flagSYN, 0, nil, deadline); err != nil {
		s.end()
		return nil, err
	}
	return s, nil
}

// AcceptStream returns the next stream the remote opened, after sending its ACK. Streams
// that ended while queued (the remote reset them) are skipped.
func (c *Conn) AcceptStream() (network.MuxedStream, error) {
	for {
		c.mu.Lock()
		var s *stream
		for s == nil && len(c.queued) > 0 {
			next := c.queued[0]
			c.queued[0] = nil
			c.queued = c.queued[1:]
			if next.queued { // still live
				next.queued = false
				c.backlog--
				s = next
			}
		}
		err := c.err
		c.mu.Unlock()
		if s == nil {
			if err != nil {
				return nil, err
			}
			select {
			case <-c.acceptReady:
			case <-c.done:
			}
			continue
		}
		if err := c.writeFrame(s, typeWindow, flagACK, 0, nil, time.Time{}); err != nil {
			if c.IsClosed() {
				return nil, c.closeErr()
			}
			continue
		}
		return s, nil
	}
}

// Close sends goAway (unless a write holds the connection) and closes it, then waits for
// its goroutines. Streams fail with an error wrapping network.ErrReset.
func (c *Conn) Close() error { return c.CloseWithError(network.ConnNoError) }

// CloseWithError is Close with the code the remote's streams report.
func (c *Conn) CloseWithError(code network.ConnErrorCode) error {
	c.shutdown(&network.ConnError{ErrorCode: code}, code, true)
	c.wg.Wait()
	return nil
}

// IsClosed reports whether the connection has closed.
func (c *Conn) IsClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// As supports no conversions.
func (c *Conn) As(any) bool { return false }

func (c *Conn) closeErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// shutdown closes the connection once, for err: optionally sends goAway with code, closes
// the socket, fails every stream, and only then reports closed (IsClosed, done), so that
// once closed no stream can write. It does not wait, so the goroutines may call it.
func (c *Conn) shutdown(err error, code network.ConnErrorCode, goAway bool) {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.err = err
		c.closing.Store(true)
		streams := c.streams
		c.streams = nil
		c.queued, c.backlog = nil, 0
		c.mu.Unlock()
		if goAway {
			select {
			case c.wlock <- struct{}{}:
				var h [hdrSize]byte
				putHeader(h[:], typeGoAway, 0, 0, uint32(code))
				c.nc.SetWriteDeadline(time.Now().Add(time.Second))
				c.nc.Write(h[:])
				<-c.wlock
			default: // a write holds the connection: the remote sees it close instead
			}
		}
		c.nc.Close()
		for _, s := range streams {
			s.abort(err) // those waiting for AcceptStream too: they are in the map
		}
		close(c.done)
	})
}

// fail closes the connection for a local failure (a write error, a protocol error).
func (c *Conn) fail(why error) {
	c.shutdown(&network.ConnError{TransportError: why}, 0, false)
}

func putHeader(b []byte, typ, flags byte, id, length uint32) {
	b[0], b[1] = typ, flags
	binary.BigEndian.PutUint32(b[2:], id)
	binary.BigEndian.PutUint32(b[6:], length)
}

// lock takes the write lock, giving up at deadline (when set) or when the connection
// closes.
func (c *Conn) lock(deadline time.Time) error {
	select {
	case c.wlock <- struct{}{}:
		return c.lockedOpen()
	default:
	}
	var expired <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return errDeadline
		}
		t := time.NewTimer(d)
		defer t.Stop()
		expired = t.C
	}
	select {
	case c.wlock <- struct{}{}:
		return c.lockedOpen()
	case <-expired:
		return errDeadline
	case <-c.done:
		return c.closeErr()
	}
}

// lockedOpen releases the lock just taken if the connection has closed.
func (c *Conn) lockedOpen() error {
	if c.closing.Load() {
		<-c.wlock
		return c.closeErr()
	}
	return nil
}

// writeLocked writes b to the socket; the caller holds the write lock. A failed write
// closes the connection.
func (c *Conn) writeLocked(b []byte) error {
	now := time.Now()
	if now.Add(writeTimeout / 2).After(c.connDeadline) {
		c.connDeadline = now.Add(writeTimeout)
		c.nc.SetWriteDeadline(c.connDeadline)
	}
	if _, err := c.nc.Write(b); err != nil {
		c.fail(fmt.Errorf("write: %w", err))
		return c.closeErr()
	}
	return nil
}

// writeFrame writes one frame of s in the caller's goroutine.
func (c *Conn) writeFrame(s *stream, typ, flags byte, length uint32, payload []byte, deadline time.Time) error {
	if err := c.lock(deadline); err != nil {
		return err
	}
	defer func() { <-c.wlock }()
	c.wbuf = append(c.wbuf[:0], make([]byte, hdrSize)...)
	putHeader(c.wbuf, typ, flags, s.id, length)
	c.wbuf = append(c.wbuf, payload...)
	err := c.writeLocked(c.wbuf)
	if cap(c.wbuf) > 2*(hdrSize+MaxPayload) {
		c.wbuf = nil
	}
	return err
}

// control queues a frame for the control writer.
func (c *Conn) control(typ, flags byte, id, length uint32) {
	c.ctlMu.Lock()
	if len(c.ctl)+hdrSize > maxControl {
		c.ctlMu.Unlock()
		c.fail(errors.New("control frames piling up: the remote does not read"))
		return
	}
	var h [hdrSize]byte
	putHeader(h[:], typ, flags, id, length)
	c.ctl = append(c.ctl, h[:]...)
	c.ctlMu.Unlock()
	select {
	case c.ctlNotify <- struct{}{}:
	default:
	}
}

// controlWriter writes the queued control frames, all waiting at once in one write.
func (c *Conn) controlWriter() {
	defer c.wg.Done()
	var out []byte
	for {
		select {
		case <-c.done:
			return
		case <-c.ctlNotify:
		}
		c.ctlMu.Lock()
		out = append(out[:0], c.ctl...)
		c.ctl = c.ctl[:0]
		c.ctlMu.Unlock()
		if len(out) == 0 {
			continue
		}
		if c.lock(time.Time{}) != nil {
			return
		}
		err := c.writeLocked(out)
		<-c.wlock
		if err != nil {
			return
		}
	}
}

// janitor pings once KeepAlive has passed without a frame from the remote (and again
// every KeepAlive after), closes the connection after three silent intervals, and resets
// streams closed here whose remote has not sent FIN within CloseTimeout.
func (c *Conn) janitor() {
	defer c.wg.Done()
	period := c.closeTimeout / 2
	if c.keepAlive > 0 {
		period = min(period, c.keepAlive)
	}
	t := time.NewTicker(period)
	defer t.Stop()
	last, active, pinged := c.frames.Load(), time.Now(), time.Time{}
	for {
		var now time.Time
		select {
		case <-c.done:
			return
		case now = <-t.C:
		}
		if n := c.frames.Load(); n != last {
			last, active = n, now
		}
		if silent := now.Sub(active); c.keepAlive > 0 && silent >= c.keepAlive {
			if silent >= 3*c.keepAlive {
				c.fail(fmt.Errorf("no frame from the remote in %v", silent.Round(time.Millisecond)))
				return
			}
			if now.Sub(pinged) >= c.keepAlive {
				pinged = now
				c.control(typePing, flagSYN, 0, uint32(silent/time.Millisecond))
			}
		}
		for _, s := range c.overdue(now) {
			s.ResetWithError(network.StreamNoError)
		}
	}
}

// overdue lists the streams closed here before now − CloseTimeout whose remote has not
// sent FIN.
func (c *Conn) overdue(now time.Time) []*stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	var late []*stream
	for _, s := range c.streams {
		if by := s.closeBy.Load(); by != 0 && now.UnixNano() >= by {
			late = append(late, s)
		}
	}
	return late
}

// errProtocol marks the remote's protocol errors.
var errProtocol = errors.New("mux protocol violation")

func violation(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errProtocol, fmt.Sprintf(format, args...))
}

// recvLoop reads frames until the connection fails. It never writes: what it must send
// goes to the control writer.
func (c *Conn) recvLoop() {
	defer c.wg.Done()
	var hdr [hdrSize]byte
	// Grown to the largest payload seen: most connections carry small frames only, and a
	// MaxPayload buffer on each would cost 64 KiB a connection.
	var payload []byte
	for {
		if _, err := io.ReadFull(c.nc, hdr[:]); err != nil {
			c.readFailed(err)
			return
		}
		c.frames.Add(1)
		typ, flags := hdr[0], hdr[1]
		id := binary.BigEndian.Uint32(hdr[2:])
		length := binary.BigEndian.Uint32(hdr[6:])
		var err error
		switch {
		case flags&^(flagSYN|flagFIN|flagRST|flagACK) != 0:
			err = violation("unknown flags %#x", flags)
		case typ == typeData:
			if length > MaxPayload {
				err = violation("data frame of %d bytes", length)
				break
			}
			payload = slices.Grow(payload[:0], int(length))[:length]
			if _, rerr := io.ReadFull(c.nc, payload); rerr != nil {
				c.readFailed(rerr)
				return
			}
			err = c.onStreamFrame(typ, flags, id, length, payload)
		case typ == typeWindow:
			err = c.onStreamFrame(typ, flags, id, length, nil)
		case typ == typePing:
			if flags&flagSYN != 0 {
				c.control(typePing, flagACK, 0, length)
			}
		case typ == typeGoAway:
			c.shutdown(&network.ConnError{Remote: true, ErrorCode: network.ConnErrorCode(length)}, 0, false)
			return
		default:
			err = violation("unknown frame type %d", typ)
		}
		if err != nil {
			log.Debugw("closing connection", "remote", c.nc.RemoteAddr(), "err", err)
			c.fail(err)
			return
		}
	}
}

// readFailed closes the connection after a read error: the remote's close, or a broken
// socket.
func (c *Conn) readFailed(err error) {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		c.shutdown(&network.ConnError{Remote: true, TransportError: io.EOF}, 0, false)
		return
	}
	c.fail(fmt.Errorf("read: %w", err))
}

// onStreamFrame delivers a data or window frame to its stream, opening it on SYN.
func (c *Conn) onStreamFrame(typ, flags byte, id, length uint32, payload []byte) error {
	if typ == typeData && flags&(flagRST|flagACK|flagSYN) != 0 {
		return violation("flags %#x on a data frame", flags)
	}
	var s *stream
	if flags&flagSYN != 0 {
		var err error
		if s, err = c.opened(id); s == nil {
			return err
		}
	} else {
		c.mu.Lock()
		s = c.streams[id]
		c.mu.Unlock()
		if s == nil {
			return nil // a stream already gone: late data or credit, nothing to do
		}
	}
	if flags&flagACK != 0 {
		s.releaseSlot()
	}
	if typ == typeData {
		if err := s.receive(payload); err != nil {
			return err
		}
	} else if flags&flagRST != 0 {
		s.remoteReset(network.StreamErrorCode(length))
		return nil
	} else if err := s.credit(length); err != nil {
		return err
	}
	if flags&flagFIN != 0 {
		s.remoteFin()
	}
	return nil
}

// opened registers a stream the remote opens and queues it for AcceptStream. Past the
// limits it is reset at once and the frame dropped (nil stream, nil error).
func (c *Conn) opened(id uint32) (*stream, error) {
	c.mu.Lock()
	switch {
	case c.err != nil:
		c.mu.Unlock()
		return nil, nil // closing: the frame goes nowhere
	case id%2 != c.nextID%2^1 || id == 0:
		c.mu.Unlock()
		return nil, violation("stream %d opened with this side's parity", id)
	case c.streams[id] != nil:
		c.mu.Unlock()
		return nil, violation("stream %d opened twice", id)
	}
	if len(c.streams) >= MaxStreams || c.backlog >= AcceptBacklog {
		c.mu.Unlock()
		c.control(typeWindow, flagRST, id, uint32(network.StreamResourceLimitExceeded))
		return nil, nil
	}
	s := newStream(c, id)
	s.queued = true
	c.streams[id] = s
	c.queued = append(c.queued, s)
	c.backlog++
	c.mu.Unlock()
	signal(c.acceptReady)
	return s, nil
}

// forget removes an ended stream; one still waiting for AcceptStream leaves the backlog.
func (c *Conn) forget(s *stream) {
	c.mu.Lock()
	delete(c.streams, s.id)
	if s.queued && c.err == nil { // after the close, the backlog is gone already
		s.queued = false
		c.backlog--
	}
	c.mu.Unlock()
}
