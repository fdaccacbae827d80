package node

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/transport/gateway"
)

// A coordinator's API asks every request for a live key, meters what each key used, and
// answers /v1/usage; a revoked key is refused from its next request.
func TestCoordinatorKeysAndUsage(t *testing.T) {
	dir := t.TempDir()
	key, ks := createKey(t, dir)
	k, err := ks.Check(key)
	if err != nil {
		t.Fatal(err)
	}
	consent := participation.Consent{Version: participation.ConsentVersion, RunLocal: true, Contribute: true}
	n := startTestNode(t, Config{Models: []string{"synth-tiny"}, DataDir: dir, Consent: &consent,
		Roles: []Role{RoleCoordinator}})
	api := "http://" + n.APIAddr()
	call := func(method, path, key, body string) (*http.Response, string) {
		req, _ := http.NewRequest(method, api+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			m, err := resp.Body.Read(buf)
			b.Write(buf[:m])
			if err != nil {
				break
			}
		}
		return resp, b.String()
	}
	chat := `{"model":"synth-tiny","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`

	for _, bad := range []string{"", "msk_live_nope", "sk-something"} {
		resp, body := call(http.MethodPost, "/v1/chat/completions", bad, chat)
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "invalid_api_key") || !strings.Contains(body, "meshinfer keys create") {
			t.Fatalf("key %q: status %d body %s", bad, resp.StatusCode, body)
		}
	}
	for range 3 {
		if resp, body := call(http.MethodPost, "/v1/chat/completions", key, chat); resp.StatusCode != http.StatusOK {
			t.Fatalf("good key: status %d body %s", resp.StatusCode, body)
		}
	}
	// Metering runs just after each response: wait for the third event.
	var u struct {
		Key   struct{ ID string }
		Usage gateway.Usage
	}
	within(t, 10*time.Second, "three metered requests", func() bool {
		resp, body := call(http.MethodGet, "/v1/usage", key, "")
		if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &u) != nil {
			t.Fatalf("usage: status %d body %s", resp.StatusCode, body)
		}
		return u.Usage.Requests >= 3
	})
	if u.Key.ID != k.ID || u.Usage.Requests != 3 || u.Usage.Completed != 3 || u.Usage.TokensOut == 0 {
		t.Fatalf("usage %+v", u)
	}
	if _, err := ks.Revoke("laptop", time.Now()); err != nil {
		t.Fatal(err)
	}
	if resp, body := call(http.MethodPost, "/v1/chat/completions", key, chat); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "revoked") {
		t.Fatalf("revoked key: status %d body %s", resp.StatusCode, body)
	}
	usage, err := gateway.ReadUsage(filepath.Join(dir, "usage.jsonl"))
	if err != nil || usage[k.ID].Completed != 3 {
		t.Fatalf("usage.jsonl: %+v, %v", usage, err)
	}
}

// A coordinator refuses to listen publicly in clear text, and serves HTTPS with a
// certificate.
func TestCoordinatorTLS(t *testing.T) {
	dir := t.TempDir()
	_, err := New(Config{Roles: []Role{RoleCoordinator}, DataDir: dir, APIAddr: "0.0.0.0:0",
		ConsoleAddr: ConsoleOff, Loopback: true, ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}})
	if err == nil || !strings.Contains(err.Error(), "clear text") {
		t.Fatalf("public coordinator without TLS: %v", err)
	}
	cert, keyFile := selfSigned(t, dir)
	n := startTestNode(t, Config{DataDir: dir, Roles: []Role{RoleCoordinator}, TLSCert: cert, TLSKey: keyFile})
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Get("https://" + n.APIAddr() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.TLS == nil {
		t.Fatalf("https without key: status %d, TLS %v", resp.StatusCode, resp.TLS != nil)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "meshinfer test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// Nodes prefer TLS 1.3 over Noise for their libp2p connections.
func TestConnectionsPreferTLS(t *testing.T) {
	b := startTestNode(t, Config{})
	a := startTestNode(t, Config{Bootstrap: []peer.AddrInfo{b.AddrInfo()}})
	within(t, 10*time.Second, "A connects to B", func() bool { return len(a.Host().Network().ConnsToPeer(b.ID())) > 0 })
	for _, c := range a.Host().Network().ConnsToPeer(b.ID()) {
		if sec := c.ConnState().Security; sec != libp2ptls.ID {
			t.Fatalf("connection %s secured by %q, want %q", c.RemoteMultiaddr(), sec, libp2ptls.ID)
		}
	}
}

// heldBackend holds every stream before token index at until its context ends: a test can
// act (hang up) while the stream is certainly in flight.
type heldBackend struct {
	inference.Backend
	at int
}

func (b heldBackend) Generate(ctx context.Context, req *inference.Request, emit func(inference.Token) error) (inference.Result, error) {
	return b.Backend.Generate(ctx, req, func(tok inference.Token) error {
		if tok.Index == b.at {
			<-ctx.Done()
			return ctx.Err()
		}
		return emit(tok)
	})
}

// A client that hangs up mid-stream is metered with the tokens it received and its prompt
// at the request's bound, as a client_disconnected outcome: hanging up is no way around the
// meter (issue 19, finding 4). So on every path: served by the coordinator's own backend,
// by a mesh peer, and on the local-only path.
func TestCoordinatorMetersWhatAHangUpReceived(t *testing.T) {
	const received = 3
	held := func(b inference.Backend) inference.Backend { return heldBackend{b, received} }
	consent := participation.Consent{Version: participation.ConsentVersion, RunLocal: true, Contribute: true}
	prompt := (&inference.Request{Messages: []inference.Message{{Role: inference.RoleUser, Content: "hi"}}}).PromptTokensBound()
	for _, tt := range []struct {
		name, prefs, route string
		mesh               bool // served by a peer; else by the coordinator
	}{
		{name: "local", route: "local"},
		{name: "mesh", mesh: true, route: "peer:"},
		{name: "local-only", prefs: `,"meshinfer":{"privacy":"local-only"}`, route: "local"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			key, _ := createKey(t, dir)
			cfg := Config{DataDir: dir, Consent: &consent, Roles: []Role{RoleCoordinator}}
			if !tt.mesh {
				cfg.Models, cfg.WrapBackend = []string{"synth-tiny"}, held
			}
			n := startTestNode(t, cfg)
			if tt.mesh {
				p := startTestNode(t, Config{Models: []string{"synth-tiny"}, WrapBackend: held,
					Bootstrap: []peer.AddrInfo{n.AddrInfo()}})
				within(t, 20*time.Second, "the coordinator sees the peer", func() bool {
					e, ok := n.Registry().Get(p.ID(), time.Now())
					return ok && !e.Stale
				})
			}
			hangUpAfter(t, n.APIAddr(), key, received,
				`{"model":"synth-tiny","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]`+tt.prefs+`}`)

			var events []gateway.MeterEvent
			within(t, 10*time.Second, "the hung-up request metered", func() bool {
				events = meterEvents(dir)
				return len(events) > 0
			})
			e := events[0]
			if len(events) != 1 || e.TokensOut != received || e.TokensIn != prompt || e.Outcome != "client_disconnected" ||
				!strings.HasPrefix(e.Peer, tt.route) {
				t.Fatalf("meter events %+v: want one client_disconnected on %s with %d tokens in, %d out", events, tt.route, prompt, received)
			}
		})
	}
}

// hangUpAfter posts body (a streaming chat request) to the API at addr with key, reads n
// tokens and hangs up.
func hangUpAfter(t *testing.T, addr, key string, n int, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // hang up, the stream held at its next token
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	rd := bufio.NewReader(resp.Body)
	for got := 0; got < n; {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d tokens: %v", got, err)
		}
		if strings.Contains(line, `"content"`) {
			got++
		}
	}
}

// meterEvents reads a coordinator's usage.jsonl in dir.
func meterEvents(dir string) []gateway.MeterEvent {
	var events []gateway.MeterEvent
	gateway.ReadEvents(filepath.Join(dir, gateway.UsageFile), func(e gateway.MeterEvent) { events = append(events, e) })
	return events
}

// createKey creates an API key named laptop in a coordinator's data dir and returns it with
// the store.
func createKey(t *testing.T, dir string) (string, *gateway.KeyStore) {
	t.Helper()
	ks, err := gateway.OpenKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := ks.Create("laptop", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return key, ks
}
