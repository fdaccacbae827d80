package testnet

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/meshinfer/meshinfer/node"
)

// Links with faults (Options.Links). Every node listens on TCP only, on a loopback address
// of its own (127.0.0.(i+1), as with DistinctHosts), and announces (node.Config.AnnounceAddrs)
// not that listener but a proxy in front of it, on the same address with another port. So
// every node-to-node connection crosses exactly one proxy: the one in front of the node
// dialed. A proxy tells which node dialed by the source address (libp2p dials from its
// listen address, port reuse), and dials the node behind it from that same address, so the
// node still sees each peer on its own host (verification voters, per-IP limits).
//
// Knowing both ends, a proxy applies faults per ordered pair of nodes, whichever of the two
// dialed: the bytes node i sends node j cross LinkFaults (i, j), those j sends i cross
// (j, i). Tests change them while the nodes run (Testnet.Link, LinksOf, Between).
//
// Why not Shopify's toxiproxy (v2.5.0 builds with our Go): its toxics apply to every
// connection of a proxy, so per-link faults would take a proxy per ordered pair, and a node
// can announce only one address to all its peers; and it dials its upstream from the
// default source address, so every peer would look to a node like one host, 127.0.0.1.
// It also brings Prometheus, zerolog, gorilla/mux and tomb for what is ~300 lines here.

// LinkFaults are the faults on the link from one node to another: on the bytes it sends.
type LinkFaults struct {
	// Delay is added to every byte (toxiproxy's latency toxic without jitter): a chunk read
	// at t is delivered at t+Delay, chunks keep their order, and throughput is unchanged.
	// Delays on both directions add up to the round trip.
	Delay time.Duration
	// KBPerSec caps the throughput in KB/s (1000 bytes, toxiproxy's bandwidth unit); 0: no cap.
	KBPerSec int
	// Down blackholes the link: nothing is delivered (held, not dropped: TCP would
	// retransmit it) until it is up again, and a new connection that needs it is accepted
	// and then hangs, so a dial times out as across a real partition.
	Down bool
}

// Link buffering. A proxy reads a connection in chunks of at most linkChunk bytes and holds
// at most linkQueue chunks per direction (2 MiB) before it stops reading, so a blackholed
// or slow link holds bounded memory and pushes back on the sender as TCP would.
const (
	linkChunk = 32 << 10
	linkQueue = 64
	// linkPace is the most a capped link sends in one write, in time at its rate: small
	// enough that a 1 KB/s link does not deliver 32 KiB bursts 32 s apart.
	linkPace = 100 * time.Millisecond
	// linkDialTimeout bounds a proxy's dial of the node behind it (loopback).
	linkDialTimeout = 5 * time.Second
)

// ErrNoLinks is returned by link methods on a testnet started without Options.Links.
var ErrNoLinks = errors.New("testnet: links are direct (Options.Links is off)")

// linkState is the fault state of every ordered pair of nodes, shared by all proxies.
type linkState struct {
	mu     sync.Mutex
	faults map[[2]int]LinkFaults
	// changed is closed and replaced on every change of faults: held transfers wait on it.
	changed chan struct{}
	conns   map[*linkConn]struct{} // open proxied connections, for Reset and Close
}

func newLinkState() *linkState {
	return &linkState{faults: map[[2]int]LinkFaults{}, changed: make(chan struct{}), conns: map[*linkConn]struct{}{}}
}

// get returns the faults of the link from a to b and the channel closed at their next change.
func (s *linkState) get(a, b int) (LinkFaults, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults[[2]int{a, b}], s.changed
}

// update applies fn to the faults of each pair and wakes every held transfer.
func (s *linkState) update(pairs [][2]int, fn func(*LinkFaults)) {
	s.mu.Lock()
	for _, p := range pairs {
		f := s.faults[p]
		fn(&f)
		if f == (LinkFaults{}) {
			delete(s.faults, p)
		} else {
			s.faults[p] = f
		}
	}
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// clear removes every fault and wakes every held transfer.
func (s *linkState) clear() {
	s.mu.Lock()
	clear(s.faults)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// waitUp waits until the link from a to b is up and returns its faults; false when done
// closed first.
func (s *linkState) waitUp(a, b int, done <-chan struct{}) (LinkFaults, bool) {
	for {
		f, changed := s.get(a, b)
		if !f.Down {
			return f, true
		}
		select {
		case <-changed:
		case <-done:
			return f, false
		}
	}
}

// reset closes every open connection between the nodes of a pair, with an RST.
func (s *linkState) reset(pairs [][2]int) {
	want := map[[2]int]bool{}
	for _, p := range pairs {
		want[p] = true
	}
	var cut []*linkConn
	s.mu.Lock()
	for c := range s.conns {
		if want[[2]int{c.src, c.dst}] || want[[2]int{c.dst, c.src}] {
			cut = append(cut, c)
		}
	}
	s.mu.Unlock()
	for _, c := range cut {
		c.close(true)
	}
}

// linkProxy forwards the TCP connections other nodes dial to node dst, through the faults.
type linkProxy struct {
	dst   int
	ln    *net.TCPListener
	state *linkState
	// ready is closed once upstream, the node's own listen address, is known (after
	// node.New returns: peers may dial the announced proxy during New, and wait).
	ready    chan struct{}
	upstream string
	stop     chan struct{} // closed by close: ends the accept loop and every held transfer
	wg       sync.WaitGroup
}

// newLinkProxy listens on ip (port chosen by the OS) for node dst.
func newLinkProxy(dst int, ip string, state *linkState) (*linkProxy, error) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.ParseIP(ip)})
	if err != nil {
		return nil, fmt.Errorf("link proxy for node %d: %w", dst, err)
	}
	p := &linkProxy{dst: dst, ln: ln, state: state, ready: make(chan struct{}), stop: make(chan struct{})}
	// The accept loop ends when close closes the listener.
	p.wg.Go(p.accept)
	return p, nil
}

// multiaddr is the proxy's address as node dst announces it.
func (p *linkProxy) multiaddr() string {
	a := p.ln.Addr().(*net.TCPAddr)
	return fmt.Sprintf("/ip4/%s/tcp/%d", a.IP, a.Port)
}

// setUpstream tells the proxy where node dst listens; once.
func (p *linkProxy) setUpstream(addr string) {
	p.upstream = addr
	close(p.ready)
}

func (p *linkProxy) accept() {
	for {
		c, err := p.ln.AcceptTCP()
		if err != nil {
			return
		}
		// Each connection's goroutines end when either side closes it, or at close.
		p.wg.Go(func() { p.serve(c) })
	}
}

// nodeOf is the node a loopback source address belongs to (127.0.0.(i+1) is node i), or -1.
func nodeOf(a net.Addr) int {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return -1
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return -1
	}
	if ip = ip.Unmap(); !ip.Is4() {
		return -1
	}
	b := ip.As4()
	if b[0] != 127 || b[1] != 0 || b[2] != 0 || b[3] == 0 {
		return -1
	}
	return int(b[3]) - 1
}

func (p *linkProxy) serve(client *net.TCPConn) {
	src := nodeOf(client.RemoteAddr())
	select {
	case <-p.ready:
	case <-p.stop:
		client.Close()
		return
	}
	// A connection needs both directions to set up: hold it while either is down.
	for _, dir := range [][2]int{{src, p.dst}, {p.dst, src}} {
		if _, ok := p.state.waitUp(dir[0], dir[1], p.stop); !ok {
			client.Close()
			return
		}
	}
	d := net.Dialer{Timeout: linkDialTimeout, LocalAddr: &net.TCPAddr{IP: client.RemoteAddr().(*net.TCPAddr).IP}}
	up, err := d.Dial("tcp", p.upstream)
	if err != nil {
		client.Close()
		return
	}
	c := &linkConn{src: src, dst: p.dst, client: client, server: up.(*net.TCPConn), done: make(chan struct{})}
	p.state.mu.Lock()
	p.state.conns[c] = struct{}{}
	p.state.mu.Unlock()
	select {
	case <-p.stop: // close closes stop before it cuts the registered connections
		c.close(false)
	default:
	}
	var wg sync.WaitGroup
	wg.Go(func() { c.pipe(p.state, c.client, c.server, src, p.dst) })
	wg.Go(func() { c.pipe(p.state, c.server, c.client, p.dst, src) })
	wg.Wait()
	c.close(false)
	p.state.mu.Lock()
	delete(p.state.conns, c)
	p.state.mu.Unlock()
}

// close stops accepting, cuts every connection through the proxy and waits for its
// goroutines.
func (p *linkProxy) close() {
	close(p.stop)
	p.ln.Close()
	var cut []*linkConn
	p.state.mu.Lock()
	for c := range p.state.conns {
		if c.dst == p.dst {
			cut = append(cut, c)
		}
	}
	p.state.mu.Unlock()
	for _, c := range cut {
		c.close(false)
	}
	p.wg.Wait()
}

// linkConn is one proxied connection: client is the dialing node's side, server the
// connection the proxy dialed to node dst.
type linkConn struct {
	src, dst       int
	client, server *net.TCPConn
	once           sync.Once
	done           chan struct{} // closed by close: ends both pipes' waits
}

// close closes both sides once; with rst, so that both nodes see a reset (SO_LINGER 0).
func (c *linkConn) close(rst bool) {
	c.once.Do(func() {
		close(c.done)
		if rst {
			c.client.SetLinger(0)
			c.server.SetLinger(0)
		}
		c.client.Close()
		c.server.Close()
	})
}

// chunk is bytes read from one side, to be delivered at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies from one side to the other through the faults of the link from a to b. A
// reader goroutine stamps each chunk with its delivery time; this one delivers them. On
// the source's EOF the destination gets a FIN once everything is delivered; on any error
// the whole connection is closed.
func (c *linkConn) pipe(s *linkState, from, to *net.TCPConn, a, b int) {
	chunks := make(chan chunk, linkQueue)
	var wg sync.WaitGroup
	defer wg.Wait()
	// The reader ends on the source's EOF or error, or when the connection is closed.
	wg.Go(func() {
		defer close(chunks)
		for {
			buf := make([]byte, linkChunk)
			n, err := from.Read(buf)
			if n > 0 {
				f, _ := s.get(a, b)
				select {
				case chunks <- chunk{b: buf[:n], due: time.Now().Add(f.Delay)}:
				case <-c.done:
					return
				}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					c.close(false)
				}
				return
			}
		}
	})
	for ch := range chunks {
		if !c.deliver(s, to, ch, a, b) {
			c.close(false) // the reader's Read fails or its send sees done: wg.Wait ends
			return
		}
	}
	to.CloseWrite()
}

// deliver writes one chunk when it is due and the link is up, paced by its bandwidth cap;
// false when the connection closed or a write failed.
func (c *linkConn) deliver(s *linkState, to *net.TCPConn, ch chunk, a, b int) bool {
	if !wait(time.Until(ch.due), c.done) {
		return false
	}
	for rest := ch.b; len(rest) > 0; {
		f, ok := s.waitUp(a, b, c.done)
		if !ok {
			return false
		}
		n := len(rest)
		if f.KBPerSec > 0 {
			n = min(n, max(1, int(int64(f.KBPerSec)*1000*int64(linkPace)/int64(time.Second))))
		}
		if _, err := to.Write(rest[:n]); err != nil {
			return false
		}
		rest = rest[n:]
		if f.KBPerSec > 0 && !wait(time.Duration(int64(n)*int64(time.Second)/(int64(f.KBPerSec)*1000)), c.done) {
			return false
		}
	}
	return true
}

// wait waits d, or until done is closed (false).
func wait(d time.Duration, done <-chan struct{}) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// Links is a set of links (ordered pairs of nodes) whose faults change together.
type Links struct {
	state *linkState
	pairs [][2]int
	err   error
}

// Link is the link from node i to node j: the bytes i sends j.
func (t *Testnet) Link(i, j int) Links {
	n := t.Len()
	if i < 0 || j < 0 || i >= n || j >= n || i == j {
		return Links{err: fmt.Errorf("testnet: no link from node %d to node %d of %d", i, j, n)}
	}
	return t.links([][2]int{{i, j}})
}

// LinksOf is every link to and from node i: LinksOf(i).Partition() cuts node i off.
func (t *Testnet) LinksOf(i int) Links {
	var others []int
	for j := range t.Len() {
		if j != i {
			others = append(others, j)
		}
	}
	return t.Between([]int{i}, others)
}

// Between is every link between a node of a and a node of b, both ways:
// Between(a, b).Partition() splits the mesh into a and b.
func (t *Testnet) Between(a, b []int) Links {
	n := t.Len()
	var pairs [][2]int
	for _, i := range a {
		for _, j := range b {
			if i < 0 || j < 0 || i >= n || j >= n || i == j {
				return Links{err: fmt.Errorf("testnet: no link between node %d and node %d of %d", i, j, n)}
			}
			pairs = append(pairs, [2]int{i, j}, [2]int{j, i})
		}
	}
	return t.links(pairs)
}

func (t *Testnet) links(pairs [][2]int) Links {
	if t.linkState == nil {
		return Links{err: ErrNoLinks}
	}
	return Links{state: t.linkState, pairs: pairs}
}

func (l Links) update(fn func(*LinkFaults)) error {
	if l.err != nil {
		return l.err
	}
	l.state.update(l.pairs, fn)
	return nil
}

// Delay sets the delay the links add (0: none). It applies to bytes read from now on.
func (l Links) Delay(d time.Duration) error {
	return l.update(func(f *LinkFaults) { f.Delay = d })
}

// Bandwidth caps the links at kbPerSec KB/s each (0: no cap).
func (l Links) Bandwidth(kbPerSec int) error {
	return l.update(func(f *LinkFaults) { f.KBPerSec = kbPerSec })
}

// Partition blackholes the links (LinkFaults.Down) until Heal.
func (l Links) Partition() error {
	return l.update(func(f *LinkFaults) { f.Down = true })
}

// Heal brings the links up again; held bytes flow, delays and caps stay.
func (l Links) Heal() error {
	return l.update(func(f *LinkFaults) { f.Down = false })
}

// Clear removes every fault of the links.
func (l Links) Clear() error {
	return l.update(func(f *LinkFaults) { *f = LinkFaults{} })
}

// Reset cuts every open connection between the links' nodes with a TCP reset, as a
// middlebox dropping the flow would (toxiproxy's reset_peer); new connections go through.
func (l Links) Reset() error {
	if l.err != nil {
		return l.err
	}
	l.state.reset(l.pairs)
	return nil
}

// tcpListenAddr is where node n listens on TCP, as host:port: the proxy's upstream.
func tcpListenAddr(n *node.Node) (string, error) {
	for _, a := range n.Host().Network().ListenAddresses() {
		if na, err := manet.ToNetAddr(a); err == nil {
			if ta, ok := na.(*net.TCPAddr); ok {
				return ta.String(), nil
			}
		}
	}
	return "", errors.New("no TCP listen address")
}
