package testnet

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/node/console"
)

// Nodes as processes. Procs runs each node as its own `meshinfer node` process, started
// and configured the way a user would (flags, a consent recorded with `meshinfer consent`,
// a participation --config), so that faults are real signals: SIGKILL is a crash (the
// kernel resets its TCP connections; over QUIC, UDP, nothing tells its peers, so to them it
// is frozen until their timeouts: see ProcOptions.NoQUIC), SIGSTOP a frozen peer (nothing
// closes: its peers notice only by their timeouts), SIGTERM the node's own drain and
// shutdown (node.Drain). The parent talks to a child only
// through its real interfaces: the banner it prints at start (listen, API and console
// addresses), its console (/api/status, /api/peers) and its OpenAI API.
//
// Node i listens on 127.0.0.(i+1) with OS-chosen ports for libp2p (TCP and QUIC), the API
// and the console, so runs in parallel never collide and each node is a host of its own.
// Node 0 has the bootstrap role; every other node bootstraps to it. Nodes run with
// --loopback (see node.Config.Loopback) and --no-mdns, in a mesh of their own (a random
// name unless ProcOptions.Mesh), so no other testnet on the machine joins.
//
// No child outlives the testnet: each runs in a process group of its own (a Ctrl-C in the
// terminal reaches the parent only, which then stops the children in order) and, on Linux,
// with the parent-death signal SIGKILL, so that even a parent killed with SIGKILL takes its
// children with it. Close, a failed StartProcs and Kill wait for every child they end.
// The nodes' data dirs live under one temporary directory ($TMPDIR) that Close removes; a
// parent killed with SIGKILL leaves it behind.

// ProcOptions configures a testnet of node processes.
type ProcOptions struct {
	// Binary is the meshinfer executable every node runs (required): `meshinfer testnet
	// --procs` passes itself, tests a binary built once with go build.
	Binary string
	Nodes  int    // how many nodes to start (at least 1)
	Mesh   string // mesh name; a random one when empty
	// ModelsFor returns the synthetic models node i serves; DefaultModels when nil. An empty
	// list serves nothing (--model none): the node only routes.
	ModelsFor func(i int) []string
	// MemoryBudget is every node's --memory-budget; DefaultMemoryBudget when 0.
	MemoryBudget int64
	Heartbeat    time.Duration // --heartbeat; the node's default when 0
	// NoQUIC makes the nodes listen on TCP only. A SIGKILLed node's TCP connections are
	// reset by the kernel, so its peers notice at once; over QUIC (UDP) nothing tells them,
	// and a killed node looks like a frozen one until their idle timeouts.
	NoQUIC bool
	// Coordinator gives node 0 the coordinator role too (--role bootstrap,coordinator): a
	// gateway for thin clients, with the API keys of its data dir (Proc.DataDir; create
	// them with gateway.OpenKeys there: a running coordinator reads new keys at once).
	Coordinator bool
	// StableAPI makes Restart bind a node's API to the address it had, so that clients of
	// a restarted coordinator reconnect where they were; otherwise it gets a new port.
	StableAPI bool
	// Logs receives every child's stderr (its logs), prefixed with its index; discarded
	// when nil. Env is added to the children's environment (e.g. GOLOG_LOG_LEVEL=info).
	Logs io.Writer
	Env  []string
}

// procStartTimeout bounds how long a child may take to print its banner: a node starts in
// well under a second; 30 s is a wedged binary, not a slow machine.
const procStartTimeout = 30 * time.Second

// ProcCloseGrace is how long Close lets the children stop on SIGTERM before it kills them:
// a node drains for up to node.DefaultDrainTimeout, then bounds its Close at 10 s
// (cmd/meshinfer), plus a margin.
const ProcCloseGrace = node.DefaultDrainTimeout + 12*time.Second

// Proc is one node process.
type Proc struct {
	Index   int
	PID     int
	ID      string   // peer ID, from the banner
	P2P     []string // listen multiaddrs ending in /p2p/<ID>, from the banner
	API     string   // host:port of the OpenAI API
	Console string   // host:port of the console
	DataDir string   // the node's --data-dir

	cmd  *exec.Cmd
	args []string // the command line after the binary, for Restart
	// exited is closed once the process has been waited for; err is its exit error then.
	exited chan struct{}
	err    error
}

// Exited is closed once the process has ended and been reaped.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Err is how the process ended (nil: exit status 0); valid once Exited is closed.
func (p *Proc) Err() error {
	<-p.exited
	return p.err
}

// Procs is a testnet of node processes.
type Procs struct {
	opts ProcOptions
	tmp  string
	// wg owns each child's reaper goroutine (one per child, ending when the child has
	// exited and its output is read to the end).
	wg sync.WaitGroup

	mu    sync.Mutex
	procs []*Proc
}

// StartProcs starts opts.Nodes node processes and returns once each has printed its
// banner (not converged: see WaitConverged). On error, every child started so far is
// killed and reaped. ctx bounds the start only.
func StartProcs(ctx context.Context, opts ProcOptions) (*Procs, error) {
	if opts.Nodes < 1 || opts.Nodes > 254 {
		return nil, fmt.Errorf("testnet needs 1 to 254 node processes (one loopback address each), got %d", opts.Nodes)
	}
	if opts.Binary == "" {
		return nil, errors.New("testnet of processes: no meshinfer binary given")
	}
	if opts.ModelsFor == nil {
		opts.ModelsFor = DefaultModels
	}
	if opts.Mesh == "" {
		opts.Mesh = "testnet-" + rand.Text()[:10]
	}
	dir, err := os.MkdirTemp("", "meshinfer-procs-")
	if err != nil {
		return nil, err
	}
	ps := &Procs{opts: opts, tmp: dir}
	p0, err := ps.start(ctx, 0, nil)
	if err != nil {
		ps.Close()
		return nil, err
	}
	errs := make([]error, opts.Nodes)
	var wg sync.WaitGroup
	for i := 1; i < opts.Nodes; i++ {
		wg.Go(func() { _, errs[i] = ps.start(ctx, i, p0.P2P) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		ps.Close()
		return nil, err
	}
	return ps, nil
}

// start prepares node i's data dir as a user would (consent, participation config) and
// runs it, bootstrapped to boot.
func (ps *Procs) start(ctx context.Context, i int, boot []string) (*Proc, error) {
	dataDir := filepath.Join(ps.tmp, fmt.Sprintf("node%d", i))
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, err
	}
	// A testnet stands for machines whose owners said yes to everything...
	consent := exec.CommandContext(ctx, ps.opts.Binary, "consent", "--data-dir", dataDir,
		"--run-local", "yes", "--contribute", "yes", "--cloud", "yes")
	consent.Env = append(os.Environ(), ps.opts.Env...)
	if out, err := consent.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("node %d: meshinfer consent: %w: %s", i, err, out)
	}
	// ...and drives many requests a minute through a few nodes: no task rate limit.
	config := filepath.Join(dataDir, "participation.json")
	if err := os.WriteFile(config, []byte(`{"max_tasks_per_min": 0}`), 0o600); err != nil {
		return nil, err
	}
	ip := fmt.Sprintf("127.0.0.%d", i+1)
	args := []string{"node", "--data-dir", dataDir, "--mesh", ps.opts.Mesh, "--config", config,
		"--listen", "/ip4/" + ip + "/tcp/0",
		"--api", ip + ":0", "--console", ip + ":0", "--no-mdns", "--loopback",
		"--memory-budget", strconv.FormatInt(cmp.Or(ps.opts.MemoryBudget, DefaultMemoryBudget), 10) + "B"}
	if !ps.opts.NoQUIC {
		args = append(args, "--listen", "/ip4/"+ip+"/udp/0/quic-v1")
	}
	if ps.opts.Heartbeat > 0 {
		args = append(args, "--heartbeat", ps.opts.Heartbeat.String())
	}
	models := ps.opts.ModelsFor(i)
	if len(models) == 0 {
		models = []string{"none"}
	}
	for _, m := range models {
		args = append(args, "--model", m)
	}
	switch {
	case i == 0 && ps.opts.Coordinator:
		args = append(args, "--role", "bootstrap,coordinator")
	case i == 0:
		args = append(args, "--role", "bootstrap")
	}
	for _, b := range boot {
		args = append(args, "--bootstrap", b)
	}
	return ps.run(ctx, i, dataDir, args)
}

// run starts the child and reads its banner. The child's stdout is read to its end by the
// reaper goroutine, which then waits for the process.
func (ps *Procs) run(ctx context.Context, i int, dataDir string, args []string) (*Proc, error) {
	cmd := exec.Command(ps.opts.Binary, args...)
	cmd.Env = append(os.Environ(), ps.opts.Env...)
	cmd.SysProcAttr = childAttr()
	logs := ps.opts.Logs
	if logs == nil {
		logs = io.Discard
	}
	cmd.Stderr = &prefixWriter{w: logs, prefix: fmt.Sprintf("node%d: ", i)}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("node %d: %w", i, err)
	}
	p := &Proc{Index: i, PID: cmd.Process.Pid, DataDir: dataDir, cmd: cmd, args: args, exited: make(chan struct{})}
	ps.mu.Lock()
	for len(ps.procs) <= i {
		ps.procs = append(ps.procs, nil)
	}
	ps.procs[i] = p
	ps.mu.Unlock()

	banner := make(chan error, 1)
	ps.wg.Go(func() { // ends when the child has exited: its stdout reaches EOF, Wait returns
		sc := bufio.NewScanner(stdout)
		banner <- p.readBanner(sc)
		for sc.Scan() {
		}
		io.Copy(io.Discard, stdout) // a line past the scanner's limit stopped Scan
		p.err = cmd.Wait()
		close(p.exited)
	})
	timer := time.NewTimer(procStartTimeout)
	defer timer.Stop()
	select {
	case err = <-banner:
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = fmt.Errorf("no banner within %v", procStartTimeout)
	}
	if err != nil {
		cmd.Process.Kill()
		<-p.exited
		return nil, fmt.Errorf("node %d: %w (exit: %v)", i, err, p.err)
	}
	return p, nil
}

// readBanner reads what `meshinfer node` prints at start, up to its last line: the peer
// ID, the listen addresses, the API and console URLs.
func (p *Proc) readBanner(sc *bufio.Scanner) error {
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "Ctrl-C stops the node"):
			if p.ID == "" || p.API == "" || p.Console == "" || len(p.P2P) == 0 {
				return fmt.Errorf("banner lacks the peer ID, listen, API or console address")
			}
			return nil
		case len(fields) >= 4 && fields[0] == "meshinfer" && fields[2] == "node":
			p.ID = fields[3]
		case len(fields) >= 2 && fields[0] == "listen":
			p.P2P = append(p.P2P, fields[1])
		case len(fields) >= 2 && (fields[0] == "api" || fields[0] == "gateway"): // a coordinator's API is its gateway
			p.API = strings.TrimSuffix(strings.TrimPrefix(fields[1], "http://"), "/v1")
		case len(fields) >= 2 && fields[0] == "console":
			p.Console = strings.TrimSuffix(strings.TrimPrefix(fields[1], "http://"), "/api/status")
		}
	}
	return fmt.Errorf("exited before its banner ended: %v", sc.Err())
}

// Len is the number of node slots, running or not.
func (ps *Procs) Len() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return len(ps.procs)
}

// Proc returns node i, or nil when i is out of range. A killed node is still returned:
// its Exited channel is closed.
func (ps *Procs) Proc(i int) *Proc {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if i < 0 || i >= len(ps.procs) {
		return nil
	}
	return ps.procs[i]
}

// ByID returns the node whose peer ID is id, or nil.
func (ps *Procs) ByID(id string) *Proc {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, p := range ps.procs {
		if p != nil && p.ID == id {
			return p
		}
	}
	return nil
}

// Running returns the nodes whose process has not exited, in index order (frozen ones
// included).
func (ps *Procs) Running() []*Proc {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []*Proc
	for _, p := range ps.procs {
		if p != nil && !p.done() {
			out = append(out, p)
		}
	}
	return out
}

func (p *Proc) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Kill crashes node i with SIGKILL and returns once it is reaped.
func (ps *Procs) Kill(i int) error {
	p := ps.Proc(i)
	if p == nil {
		return fmt.Errorf("no node %d", i)
	}
	if err := p.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("kill node %d: %w", i, err)
	}
	<-p.exited
	return nil
}

// Restart starts node i again after it has exited (killed, or drained and stopped), with
// the same flags and data dir: the same peer ID, its receipts and consent kept, new ports.
// It bootstraps to the lowest-numbered other node still running: node 0 as before while it
// runs. ctx bounds the start.
func (ps *Procs) Restart(ctx context.Context, i int) (*Proc, error) {
	old := ps.Proc(i)
	if old == nil {
		return nil, fmt.Errorf("no node %d", i)
	}
	if !old.done() {
		return nil, fmt.Errorf("node %d is still running (pid %d)", i, old.PID)
	}
	// Node 0's addresses were the others' bootstrap peers; node 0 itself had none.
	var args []string
	for j := 0; j < len(old.args); j++ {
		if old.args[j] == "--bootstrap" {
			j++
			continue
		}
		if old.args[j] == "--api" && ps.opts.StableAPI && j+1 < len(old.args) {
			args = append(args, "--api", old.API)
			j++
			continue
		}
		args = append(args, old.args[j])
	}
	for _, p := range ps.Running() {
		if p.Index != i {
			for _, a := range p.P2P {
				args = append(args, "--bootstrap", a)
			}
			break
		}
	}
	return ps.run(ctx, i, old.DataDir, args)
}

// Freeze stops node i with SIGSTOP: it holds its sockets and answers nothing, as a hung
// machine would, until Thaw.
func (ps *Procs) Freeze(i int) error { return ps.signal(i, sigStop) }

// Thaw resumes a frozen node i with SIGCONT.
func (ps *Procs) Thaw(i int) error { return ps.signal(i, sigCont) }

// Terminate sends node i SIGTERM, the node's own graceful stop, without waiting: see
// Proc.Exited.
func (ps *Procs) Terminate(i int) error { return ps.signal(i, sigTerm) }

func (ps *Procs) signal(i int, sig os.Signal) error {
	p := ps.Proc(i)
	if p == nil {
		return fmt.Errorf("no node %d", i)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal node %d: %w", i, err)
	}
	return nil
}

// Status reads node i's console /api/status.
func (ps *Procs) Status(ctx context.Context, i int) (console.Status, error) {
	var st console.Status
	return st, ps.getJSON(ctx, i, "/api/status", &st)
}

// Peers reads node i's console /api/peers.
func (ps *Procs) Peers(ctx context.Context, i int) ([]console.Peer, error) {
	var out console.Peers
	err := ps.getJSON(ctx, i, "/api/peers", &out)
	return out.Peers, err
}

// maxConsoleBody bounds what the parent reads from a console: /api/peers of a few hundred
// peers is well under it.
const maxConsoleBody = 16 << 20

func (ps *Procs) getJSON(ctx context.Context, i int, path string, v any) error {
	p := ps.Proc(i)
	if p == nil {
		return fmt.Errorf("no node %d", i)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Console+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("node %d %s: HTTP %d", i, path, resp.StatusCode)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, maxConsoleBody)).Decode(v)
}

// Converged reports whether every running node lists every other running node in its
// console's /api/peers as contacted (a routing candidate) with a fresh vector. A frozen
// node answers nothing, so a testnet with one is not converged until it thaws. ctx bounds
// the console reads.
func (ps *Procs) Converged(ctx context.Context) bool {
	running := ps.Running()
	for _, p := range running {
		peers, err := ps.Peers(ctx, p.Index)
		if err != nil {
			return false
		}
		ok := map[string]bool{}
		for _, pe := range peers {
			ok[pe.PeerID] = pe.Contacted && !pe.Stale
		}
		for _, other := range running {
			if other != p && !ok[other.ID] {
				return false
			}
		}
	}
	return true
}

// consolePoll is how often WaitConverged asks the consoles.
const consolePoll = 50 * time.Millisecond

// WaitConverged waits until Converged or ctx ends.
func (ps *Procs) WaitConverged(ctx context.Context) error {
	return WaitFor(ctx, consolePoll, func() bool {
		rctx, cancel := context.WithTimeout(ctx, time.Second) // a frozen node must not hold the poll
		defer cancel()
		return ps.Converged(rctx)
	})
}

// PIDs are the process IDs of every node started, exited or not.
func (ps *Procs) PIDs() []int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []int
	for _, p := range ps.procs {
		if p != nil {
			out = append(out, p.PID)
		}
	}
	return out
}

// Close stops every node and reaps it: SIGCONT (a frozen node cannot stop) and SIGTERM to
// each, then SIGKILL to those still running after ProcCloseGrace. It removes the data
// dirs once every child is gone. Idempotent.
func (ps *Procs) Close() error { return ps.close(ProcCloseGrace) }

// KillAll kills every node at once with SIGKILL and reaps it, then removes the data dirs:
// Close without the grace, for tests and for a parent that must be gone now.
func (ps *Procs) KillAll() error { return ps.close(0) }

func (ps *Procs) close(grace time.Duration) error {
	running := ps.Running()
	if grace > 0 {
		for _, p := range running {
			p.cmd.Process.Signal(sigCont)
			p.cmd.Process.Signal(sigTerm)
		}
		timer := time.NewTimer(grace)
		defer timer.Stop()
	wait:
		for _, p := range running {
			select {
			case <-p.exited:
			case <-timer.C:
				break wait
			}
		}
	}
	for _, p := range running {
		p.cmd.Process.Kill() // an error means it has exited already
	}
	ps.wg.Wait()
	return os.RemoveAll(ps.tmp)
}

// prefixWriter writes each line of a child's stderr to w with the child's prefix. Writes
// come from the one goroutine exec copies stderr with.
type prefixWriter struct {
	w      io.Writer
	prefix string
	mid    bool // the last write ended mid-line
}

func (pw *prefixWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line = b[:i+1]
		}
		out := line
		if !pw.mid { // one write per line, prefix included: a line-per-write log keeps it whole
			out = append([]byte(pw.prefix), line...)
		}
		if _, err := pw.w.Write(out); err != nil {
			return 0, err
		}
		pw.mid = line[len(line)-1] != '\n'
		b = b[len(line):]
	}
	return n, nil
}
