package console

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

// fakeSource is a fixed Source: the console's own input, not a libp2p node.
type fakeSource struct {
	status Status
	peers  []Peer
	ready  atomic.Bool
}

func (f *fakeSource) Status() Status { return f.status }
func (f *fakeSource) Peers() []Peer  { return f.peers }
func (f *fakeSource) Ready() bool    { return f.ready.Load() }

func testVector(id string) *caps.Vector {
	return &caps.Vector{
		PeerID:   id,
		Runtime:  caps.RuntimeDesktop,
		CPU:      caps.CPU{Cores: 8, Arch: "amd64", ISAExt: []string{"avx2"}},
		RAM:      caps.RAM{TotalMB: 32000, FreeMB: 20000},
		Thermal:  caps.ThermalNominal,
		AppState: caps.AppStateForeground,
		Net:      caps.Net{Type: caps.NetEthernet, RTTMS: 0.5},
		Models:   []caps.Model{},
		Load:     caps.Load{Accepting: true},
		Seq:      7,
		IssuedAt: 1764489600123,
		Expires:  1764489645123,
		Sig:      "ed25519:AAAA",
	}
}

func testStatus() Status {
	return Status{
		NodeID:      "12D3KooWSelf",
		Version:     "v-test",
		Roles:       []string{"contributor", "bootstrap"},
		Mesh:        Mesh{Name: "lab", PeersConnected: 3, PeersKnown: 2, PeersStale: 1, TopicPeers: 2, DHTPeers: 4},
		ListenAddrs: []string{"/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWSelf"},
		UptimeS:     12.5,
		Ready:       true,
		Capability:  testVector("12D3KooWSelf"),
		Announcements: Announcements{
			Published: 3, Accepted: 12, Rejected: 1, Ignored: 2, Synced: 4,
		},
	}
}

// serve starts a console on loopback over src and closes it when the test ends.
func serve(t *testing.T, src Source) *Server {
	t.Helper()
	s, err := New("127.0.0.1:0", false, src)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// get does one request to the console and returns the status code, content type and body.
func get(t *testing.T, method, url string) (int, string, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), body
}

func hasIPv6Loopback() bool {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

func TestNewRefusesNonLoopback(t *testing.T) {
	tests := []struct {
		addr        string
		notLoopback bool // the error must be ErrNotLoopback (else: any error, e.g. a malformed address)
	}{
		{addr: "0.0.0.0:0", notLoopback: true},
		{addr: ":0", notLoopback: true},
		{addr: ":3131", notLoopback: true},
		{addr: "[::]:0", notLoopback: true},
		{addr: "192.0.2.1:0", notLoopback: true},
		{addr: "[2001:db8::1]:0", notLoopback: true},
		{addr: "example.com:0", notLoopback: true},
		{addr: "127.0.0.1"},   // no port
		{addr: "not an addr"}, // no port either
		{addr: ""},
	}
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			s, err := New(tc.addr, false, &fakeSource{})
			if err == nil {
				s.Close()
				t.Fatalf("New(%q, public=false) = nil error, want a refusal", tc.addr)
			}
			if s != nil {
				t.Errorf("New(%q) returned a server with error %v", tc.addr, err)
			}
			if tc.notLoopback && !errors.Is(err, ErrNotLoopback) {
				t.Errorf("New(%q) error = %v, want errors.Is ErrNotLoopback", tc.addr, err)
			}
			if tc.notLoopback && !strings.Contains(err.Error(), "--console-public") {
				t.Errorf("New(%q) error = %q, want it to mention --console-public", tc.addr, err)
			}
		})
	}
	t.Logf("figure F17: the console refuses every non-loopback bind address")
}

func TestNewAcceptsLoopback(t *testing.T) {
	tests := []struct {
		addr   string
		public bool
		ipv6   bool
	}{
		{addr: "127.0.0.1:0"},
		{addr: "localhost:0"},
		{addr: "[::1]:0", ipv6: true},
		{addr: "0.0.0.0:0", public: true},
	}
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			if tc.ipv6 && !hasIPv6Loopback() {
				t.Skip("no IPv6 loopback on this machine: net.Listen on [::1]:0 failed")
			}
			src := &fakeSource{status: testStatus()}
			s, err := New(tc.addr, tc.public, src)
			if err != nil {
				t.Fatalf("New(%q, public=%v): %v", tc.addr, tc.public, err)
			}
			defer s.Close()
			addr := s.Addr()
			if tc.public {
				// Reach a wildcard listener through loopback.
				_, port, err := net.SplitHostPort(addr)
				if err != nil {
					t.Fatalf("split %q: %v", addr, err)
				}
				addr = net.JoinHostPort("127.0.0.1", port)
			}
			code, _, _ := get(t, http.MethodGet, "http://"+addr+"/health")
			if code != http.StatusOK {
				t.Errorf("GET /health on %s = %d, want 200", addr, code)
			}
		})
	}
}

func TestStatus(t *testing.T) {
	src := &fakeSource{status: testStatus()}
	s := serve(t, src)
	code, ctype, body := get(t, http.MethodGet, "http://"+s.Addr()+"/api/status")
	if code != http.StatusOK {
		t.Fatalf("GET /api/status = %d, want 200; body %s", code, body)
	}
	if ctype != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ctype)
	}

	// The raw keys, so that a renamed JSON tag is caught even though Status would still
	// round-trip through itself.
	var raw map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("decode /api/status as an object: %v\n%s", err, body)
	}
	for _, key := range []string{"node_id", "version", "roles", "mesh", "listen_addrs", "uptime_s", "ready", "capability", "announcements"} {
		if _, ok := raw[key]; !ok {
			t.Errorf("/api/status has no %q key: %s", key, body)
		}
	}
	mesh, ok := raw["mesh"].(map[string]any)
	if !ok {
		t.Fatalf("/api/status mesh = %T, want an object", raw["mesh"])
	}
	for _, key := range []string{"name", "peers_connected", "peers_known", "peers_stale", "topic_peers", "dht_peers"} {
		if _, ok := mesh[key]; !ok {
			t.Errorf("/api/status mesh has no %q key: %s", key, body)
		}
	}
	ann, ok := raw["announcements"].(map[string]any)
	if !ok {
		t.Fatalf("/api/status announcements = %T, want an object", raw["announcements"])
	}
	for _, key := range []string{"published", "accepted", "rejected", "ignored", "rate_limited", "synced"} {
		if _, ok := ann[key]; !ok {
			t.Errorf("/api/status announcements has no %q key: %s", key, body)
		}
	}
	if c, ok := raw["capability"].(map[string]any); !ok || c["sig"] != "ed25519:AAAA" {
		t.Errorf("/api/status capability = %v, want the signed vector", raw["capability"])
	}

	var got Status
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("decode /api/status into Status: %v", err)
	}
	if want := testStatus(); !reflect.DeepEqual(got, want) {
		t.Errorf("/api/status decoded =\n%+v\nwant\n%+v", got, want)
	}
}

func TestPeers(t *testing.T) {
	twoPeers := []Peer{
		{PeerID: "12D3KooWA", Connected: true, AgeS: 1.5, Capability: testVector("12D3KooWA")},
		{PeerID: "12D3KooWB", Stale: true, AgeS: 40, Capability: testVector("12D3KooWB")},
	}
	tests := []struct {
		name  string
		peers []Peer
	}{
		{name: "nil", peers: nil},
		{name: "empty", peers: []Peer{}},
		{name: "two", peers: twoPeers},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := serve(t, &fakeSource{status: testStatus(), peers: tc.peers})
			code, ctype, body := get(t, http.MethodGet, "http://"+s.Addr()+"/api/peers")
			if code != http.StatusOK {
				t.Fatalf("GET /api/peers = %d, want 200; body %s", code, body)
			}
			if ctype != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ctype)
			}
			var raw map[string]json.RawMessage
			if err := json.Unmarshal(body, &raw); err != nil {
				t.Fatalf("decode /api/peers: %v\n%s", err, body)
			}
			list, ok := raw["peers"]
			if !ok {
				t.Fatalf("/api/peers has no \"peers\" key: %s", body)
			}
			var entries []map[string]any
			if err := json.Unmarshal(list, &entries); err != nil {
				t.Fatalf("decode peers list: %v\n%s", err, list)
			}
			if entries == nil {
				t.Fatalf("/api/peers peers = %s, want an array", list)
			}
			if len(entries) != len(tc.peers) {
				t.Fatalf("/api/peers has %d entries, want %d: %s", len(entries), len(tc.peers), body)
			}
			for i, e := range entries {
				for _, key := range []string{"peer_id", "connected", "stale", "age_s", "capability"} {
					if _, ok := e[key]; !ok {
						t.Errorf("peer %d has no %q key", i, key)
					}
				}
			}
			var got Peers
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("decode /api/peers into Peers: %v", err)
			}
			if len(tc.peers) > 0 && !reflect.DeepEqual(got.Peers, tc.peers) {
				t.Errorf("/api/peers decoded =\n%+v\nwant\n%+v", got.Peers, tc.peers)
			}
		})
	}
}

func TestHealth(t *testing.T) {
	src := &fakeSource{status: testStatus()}
	s := serve(t, src)
	base := "http://" + s.Addr()
	tests := []struct {
		ready     bool
		path      string
		wantCode  int
		wantReady bool
	}{
		{ready: false, path: "/health", wantCode: http.StatusOK},
		{ready: false, path: "/health/ready", wantCode: http.StatusServiceUnavailable},
		{ready: true, path: "/health", wantCode: http.StatusOK, wantReady: true},
		{ready: true, path: "/health/ready", wantCode: http.StatusOK, wantReady: true},
	}
	for _, tc := range tests {
		src.ready.Store(tc.ready)
		code, ctype, body := get(t, http.MethodGet, base+tc.path)
		if code != tc.wantCode {
			t.Errorf("ready=%v GET %s = %d, want %d", tc.ready, tc.path, code, tc.wantCode)
		}
		if ctype != "application/json" {
			t.Errorf("ready=%v GET %s Content-Type = %q, want application/json", tc.ready, tc.path, ctype)
		}
		var h Health
		if err := json.Unmarshal(body, &h); err != nil {
			t.Fatalf("ready=%v GET %s: decode %q: %v", tc.ready, tc.path, body, err)
		}
		if h.Status != "ok" || h.Ready != tc.wantReady {
			t.Errorf("ready=%v GET %s = %+v, want {Status:ok Ready:%v}", tc.ready, tc.path, h, tc.wantReady)
		}
	}
}

func TestMethodsAndUnknownPaths(t *testing.T) {
	s := serve(t, &fakeSource{status: testStatus()})
	base := "http://" + s.Addr()
	tests := []struct {
		method, path string
		want         int
	}{
		{http.MethodPost, "/api/status", http.StatusMethodNotAllowed},
		{http.MethodPut, "/api/peers", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/health", http.StatusMethodNotAllowed},
		{http.MethodGet, "/nope", http.StatusNotFound},
		{http.MethodGet, "/api/status/extra", http.StatusNotFound},
		{http.MethodGet, "/", http.StatusNotFound},
	}
	for _, tc := range tests {
		code, _, _ := get(t, tc.method, base+tc.path)
		if code != tc.want {
			t.Errorf("%s %s = %d, want %d", tc.method, tc.path, code, tc.want)
		}
	}
}

func TestCloseIdempotentAndStopsListening(t *testing.T) {
	s, err := New("127.0.0.1:0", false, &fakeSource{status: testStatus()})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	addr := s.Addr()
	if code, _, _ := get(t, http.MethodGet, "http://"+addr+"/api/status"); code != http.StatusOK {
		t.Fatalf("GET /api/status before Close = %d, want 200", code)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("dial %s after Close succeeded, want connection refused", addr)
	}
	waitNoGoroutine(t, "net/http.(*Server).Serve", "net/http.(*conn).serve")
}

// waitNoGoroutine waits until no goroutine's stack mentions any of funcs. Close waits for
// Serve itself; connection goroutines end as Shutdown closes their connections.
func waitNoGoroutine(t *testing.T, funcs ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		var left []string
		for _, f := range funcs {
			if strings.Contains(stacks, f) {
				left = append(left, f)
			}
		}
		if len(left) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("goroutines still running after Close: %v\n%s", left, stacks)
		case <-tick.C:
		}
	}
}

// The console on loopback refuses a request whose Host is not this machine: a web page that
// rebinds its domain to 127.0.0.1 reads nothing (issue 19).
func TestConsoleRefusesForeignHost(t *testing.T) {
	s := serve(t, &fakeSource{status: testStatus()})
	req, _ := http.NewRequest(http.MethodGet, "http://"+s.Addr()+"/api/status", nil)
	req.Host = "rebound.evil.example"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("Host rebound.evil.example: status %d, want 421", resp.StatusCode)
	}
	if code, _, _ := get(t, http.MethodGet, "http://"+s.Addr()+"/api/status"); code != http.StatusOK {
		t.Fatalf("Host %s: status %d, want 200", s.Addr(), code)
	}
	t.Logf("figure F17: a request with a foreign Host refused; the console's own address served")
}
