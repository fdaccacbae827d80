package announce

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/mesh/registry"
)

func TestTopicAndSyncProtocolNames(t *testing.T) {
	if got, want := Topic("lab"), "/meshinfer/lab/caps/2"; got != want {
		t.Errorf("Topic = %q, want %q", got, want)
	}
	if got, want := string(SyncProtocol("lab")), "/meshinfer/lab/caps-sync/2.0.0"; got != want {
		t.Errorf("SyncProtocol = %q, want %q", got, want)
	}
}

// v1Wire is a vector as a caps/1 node published it, signed by key under the caps/1 domain:
// gpu a list, battery.level in percent, app_state active, net.effective.
func v1Wire(t *testing.T, key crypto.PrivKey, seq uint64, now time.Time) []byte {
	t.Helper()
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"peer_id":%q,"runtime":"desktop","cpu":{"cores":8,"arch":"amd64"},"gpu":[],`+
		`"npu":{"present":false},"ram":{"total_mb":16384,"free_mb":8192},"battery":{"present":true,"level":80,"charging":false},`+
		`"thermal":"nominal","app_state":"active","net":{"rtt_ms":0,"downlink_mbps":0,"effective":"4g","metered":false},`+
		`"models":[],"load":{"in_flight":0,"queue":0,"accepting":true},"seq":%d,"issued_at":%d,"expires_at":%d}`,
		id, seq, now.UnixMilli(), now.Add(time.Minute).UnixMilli())
	sig, err := key.Sign([]byte("meshinfer/capability-vector/v1\n" + body))
	if err != nil {
		t.Fatal(err)
	}
	return []byte(body[:len(body)-1] + `,"sig":"ed25519:` + base64.StdEncoding.EncodeToString(sig) + `"}`)
}

// TestOldShapeVectorRejectedWithAWarning: a caps/1 vector published on caps/2 is rejected,
// and its author is warned about once, however many it sends; other refusals are not
// blamed on the old shape.
func TestOldShapeVectorRejectedWithAWarning(t *testing.T) {
	r := newRig(t, 2*time.Minute)
	now := time.Now()
	for seq := range uint64(3) {
		if got := r.send(t, v1Wire(t, r.attKey, 10+seq, now)); got != (Counts{Rejected: 1}) {
			t.Fatalf("caps/1 vector #%d: got %+v, want rejected", seq, got)
		}
	}
	if n := r.victim.val.old.logged.Load(); n != 1 {
		t.Fatalf("%d warnings about the old shape, want 1 for 3 vectors of one peer", n)
	}
	for name, data := range map[string][]byte{
		"not json":        []byte("hello"),
		"battery over 1":  signed(t, r.attKey, 20, now, time.Minute, func(v *caps.Vector) { v.Battery.Level = 1.5 }),
		"net.type absent": signed(t, r.attKey, 21, now, time.Minute, func(v *caps.Vector) { v.Net.Type = "" }),
	} {
		if got := r.send(t, data); got != (Counts{Rejected: 1}) {
			t.Fatalf("%s: got %+v, want rejected", name, got)
		}
	}
	if n := r.victim.val.old.logged.Load(); n != 1 {
		t.Fatalf("%d warnings about the old shape after refusals of other kinds, want still 1", n)
	}
	if r.reg.Len() != 0 {
		t.Fatalf("registry holds %d peers, want 0", r.reg.Len())
	}
	if got := r.send(t, signed(t, r.attKey, 30, now, time.Minute, nil)); got.Accepted != 1 {
		t.Fatalf("caps/2 vector of the same peer: got %+v, want accepted", got)
	}
}

func TestOldShapeLogOncePerPeerPerPeriod(t *testing.T) {
	var l oldShapeLog
	t0 := time.UnixMilli(1_800_000_000_000)
	a, b := peer.ID("peer-a"), peer.ID("peer-b")
	steps := []struct {
		p    peer.ID
		at   time.Duration
		want bool
	}{
		{a, 0, true},
		{a, time.Second, false},
		{b, time.Second, true},
		{a, oldShapeLogEvery - time.Millisecond, false},
		{a, oldShapeLogEvery, true},
		{b, oldShapeLogEvery, false},
		{b, oldShapeLogEvery + time.Second, true},
	}
	for i, s := range steps {
		if got := l.due(s.p, t0.Add(s.at)); got != s.want {
			t.Fatalf("step %d: due(%s, +%v) = %v, want %v", i, s.p, s.at, got, s.want)
		}
	}
	// Bounded: past oldShapeLogCap peers, a new one waits until some are due again.
	var c oldShapeLog
	for i := range oldShapeLogCap {
		if !c.due(peer.ID(fmt.Sprintf("p%d", i)), t0) {
			t.Fatalf("peer %d not warned about under the cap", i)
		}
	}
	if c.due("newcomer", t0.Add(time.Minute)) {
		t.Fatal("a peer past the cap was warned about while every remembered one is recent")
	}
	if !c.due("newcomer", t0.Add(oldShapeLogEvery)) || c.last.Len() != 1 {
		t.Fatalf("once the remembered peers are due, a newcomer is warned about and they are forgotten (%d held)", c.last.Len())
	}
}

// TestPlainGossipSubPeerReadsVectors: a GossipSub peer with default settings and no
// meshinfer code (as a js-libp2p browser peer would be) joins the caps/2 topic and receives
// the node's vector as an ordinary signed GossipSub message whose data is the signed JSON
// vector, in the design's shape.
func TestPlainGossipSubPeerReadsVectors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nk, pk := newKey(t), newKey(t)
	nh, ph := newHost(t, nk), newHost(t, pk)
	nps, err := pubsub.NewGossipSub(ctx, nh)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(nh, nps, nk, registry.New(registry.ParamsForHeartbeat(time.Minute)), fixedSource{}, Params{Mesh: testMesh, Heartbeat: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	sub := subscribePlain(t, ctx, ph, "/meshinfer/"+testMesh+"/caps/2")
	if err := ph.Connect(ctx, peer.AddrInfo{ID: nh.ID(), Addrs: nh.Addrs()}); err != nil {
		t.Fatal(err)
	}
	// The heartbeat is a minute: the vector arrives through the node's publish on join.
	msg, err := sub.Next(ctx)
	if err != nil {
		t.Fatalf("no vector reached the plain GossipSub peer: %v", err)
	}
	if msg.GetFrom() != nh.ID() || len(msg.Signature) == 0 {
		t.Fatalf("message from %s with a %d-byte signature: want a signed message from %s", msg.GetFrom(), len(msg.Signature), nh.ID())
	}
	v, err := caps.Verify(msg.Data, time.Now())
	if err != nil {
		t.Fatalf("the message's data is not a verifiable vector: %v\n%s", err, msg.Data)
	}
	if v.PeerID != nh.ID().String() {
		t.Fatalf("vector of %s in a message from %s", v.PeerID, nh.ID())
	}
	// What a JavaScript reader sees: plain JSON with the design's names and types.
	var js map[string]any
	if err := json.Unmarshal(msg.Data, &js); err != nil {
		t.Fatal(err)
	}
	battery, _ := js["battery"].(map[string]any)
	net, _ := js["net"].(map[string]any)
	_, hasGPU := js["gpu"]
	if js["runtime"] != "desktop" || js["app_state"] != "foreground" || net["type"] != "ethernet" ||
		battery["floor"] == nil || !hasGPU || js["sig"] == nil {
		t.Fatalf("vector JSON lacks the caps/2 fields: %s", msg.Data)
	}
}
