package client_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/mesh/probe"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/gateway/client"
)

// startCoordinatorNode starts a real coordinator node on loopback, serving synth-tiny
// itself, with one API key; it is closed when the test ends.
func startCoordinatorNode(t *testing.T) (n *node.Node, dir, key string, ks *gateway.KeyStore) {
	t.Helper()
	dir = t.TempDir()
	ks, err := gateway.OpenKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if key, _, err = ks.Create("laptop", time.Now()); err != nil {
		t.Fatal(err)
	}
	id, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	consent := participation.Consent{Version: participation.ConsentVersion, RunLocal: true, Contribute: true}
	n, err = node.New(node.Config{Identity: id, DataDir: dir, Consent: &consent, Models: []string{testModel},
		Roles: []node.Role{node.RoleCoordinator}, Loopback: true, ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"},
		ConsoleAddr: node.ConsoleOff, APIAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	return n, dir, key, ks
}

// A real coordinator node serves thin clients over WebSocket and REST alike, meters each
// request once under its key, and refuses bad keys, a revoked one from its next request.
func TestCoordinatorNodeGateway(t *testing.T) {
	n, dir, key, ks := startCoordinatorNode(t)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	base := "http://" + n.APIAddr()
	want, ref := reference(t, 21, 24)

	ws := client.New(base, key, client.WithHTTPClient(hc), client.WithDevice("laptop-1"))
	defer ws.Close()
	rest := client.New(base, key, client.WithHTTPClient(hc), client.WithForceREST())
	defer rest.Close()
	for _, tc := range []struct {
		c         *client.Client
		transport string
	}{{ws, client.TransportWebSocket}, {rest, client.TransportREST}, {ws, client.TransportWebSocket}} {
		col := &collector{t: t}
		res, err := tc.c.Chat(context.Background(), chatBody(21, 24), col.on)
		if err != nil {
			t.Fatalf("%s: %v", tc.transport, err)
		}
		col.check(res, want, ref, tc.transport)
	}

	bad := client.New(base, gateway.KeyPrefix+"nope", client.WithHTTPClient(hc))
	defer bad.Close()
	var e *client.Error
	if _, err := bad.Chat(context.Background(), chatBody(1, 4), nil); !errors.As(err, &e) || e.Status != http.StatusUnauthorized {
		t.Fatalf("bad key: %v", err)
	}
	if _, err := ks.Revoke("laptop", time.Now()); err != nil {
		t.Fatal(err)
	}
	// Refused from the next request, on the live connection as on a new one.
	for _, c := range []*client.Client{ws, rest, client.New(base, key, client.WithHTTPClient(hc))} {
		defer c.Close()
		if _, err := c.Chat(context.Background(), chatBody(1, 4), nil); !errors.As(err, &e) || e.Status != http.StatusUnauthorized || e.Code != "invalid_api_key" {
			t.Fatalf("revoked key: %v", err)
		}
	}
	ws.Close()
	rest.Close()
	// Metering runs just after each response: wait for the third event.
	total := waitUsage(t, dir, func(u gateway.Usage) bool { return u.Requests >= 3 })
	if total.Requests != 3 || total.Completed != 3 || total.TokensOut != int64(3*ref.Usage.CompletionTokens) {
		t.Fatalf("usage %+v: want 3 requests of %d tokens, each metered once", total, ref.Usage.CompletionTokens)
	}
}

// The device id a thin client derives (from the machine's facts and a salt in its own data
// dir) goes with each request, over WebSocket and REST alike: the real coordinator records
// it in every usage line and GET /v1/usage shows that device's part. A malformed one is
// refused with 400 before anything runs or is metered.
func TestCoordinatorNodeMetersTheDevice(t *testing.T) {
	n, dir, key, _ := startCoordinatorNode(t)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	base := "http://" + n.APIAddr()
	dev, err := node.LoadOrCreateDevice(t.TempDir(), probe.ReadDeviceFacts(probe.DefaultRoot))
	if err != nil {
		t.Fatal(err)
	}

	ws := client.New(base, key, client.WithHTTPClient(hc), client.WithDevice(dev.ID))
	defer ws.Close()
	rest := client.New(base, key, client.WithHTTPClient(hc), client.WithDevice(dev.ID), client.WithForceREST())
	defer rest.Close()
	bare := client.New(base, key, client.WithHTTPClient(hc))
	defer bare.Close()
	for i, c := range []*client.Client{ws, rest, bare} {
		if _, err := c.Chat(context.Background(), chatBody(int64(i), 4), nil); err != nil {
			t.Fatalf("chat %d: %v", i, err)
		}
	}
	for _, c := range []*client.Client{
		client.New(base, key, client.WithHTTPClient(hc), client.WithDevice("my laptop")),
		client.New(base, key, client.WithHTTPClient(hc), client.WithDevice("my laptop"), client.WithForceREST()),
	} {
		defer c.Close()
		var e *client.Error
		if _, err := c.Chat(context.Background(), chatBody(9, 4), nil); !errors.As(err, &e) || e.Status != http.StatusBadRequest ||
			e.Code != "invalid_request" || !strings.Contains(e.Message, gateway.DeviceHeader) {
			t.Fatalf("malformed device: %v, want 400 invalid_request naming %s", err, gateway.DeviceHeader)
		}
	}

	waitUsage(t, dir, func(u gateway.Usage) bool { return u.Requests >= 3 })
	var devices []string
	var fromDevice gateway.Usage
	if err := gateway.ReadEvents(filepath.Join(dir, gateway.UsageFile), func(e gateway.MeterEvent) {
		devices = append(devices, e.Device)
		if e.Device == dev.ID {
			fromDevice.Add(e)
		}
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(devices)
	if want := []string{"", dev.ID, dev.ID}; !slices.Equal(devices, want) {
		t.Fatalf("metered devices %q, want %q: two with the device, one without, none malformed", devices, want)
	}

	req, err := http.NewRequest(http.MethodGet, base+"/v1/usage", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set(gateway.DeviceHeader, dev.ID)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Usage  gateway.Usage `json:"usage"`
		Device struct {
			ID    string        `json:"id"`
			Usage gateway.Usage `json:"usage"`
		} `json:"device"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/usage: %d, %v", resp.StatusCode, err)
	}
	if got.Usage.Requests != 3 || got.Device.ID != dev.ID || got.Device.Usage != fromDevice || fromDevice.Completed != 2 {
		t.Fatalf("GET /v1/usage = %+v: want 3 requests for the key, %+v from %s", got, fromDevice, dev.ID)
	}
}
