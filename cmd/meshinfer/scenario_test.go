package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/testnet"
)

// The battery-drain scenario's handover act on a real 4-node testnet (nodes 1 and 3 serve
// synth-small): the peer serving the answer pauses mid-stream and the stream goes on from
// the other, identical to an uninterrupted run, with node 0's gate decision printed. An
// answer that ends before the pause (a machine far faster than this one) is said so; the
// act never reports a failed or different stream.
func TestHandoverAct(t *testing.T) {
	const heartbeat = 500 * time.Millisecond
	tn, err := testnet.New(testnet.Options{Nodes: 4, Heartbeat: heartbeat, Sensors: true, Cloud: false})
	if err != nil {
		t.Fatalf("testnet.New: %v", err)
	}
	defer tn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := tn.WaitConverged(ctx); err != nil {
		t.Fatalf("WaitConverged: %v", err)
	}
	var out bytes.Buffer
	handover(ctx, &out, tn, heartbeat, 300)
	got := out.String()
	t.Log(got)
	for _, bad := range []string{"failed", "DIFFERENT", "did not start", "not a peer", "needs two nodes"} {
		if strings.Contains(got, bad) {
			t.Fatalf("the act says %q:\n%s", bad, got)
		}
	}
	if strings.Contains(got, "nothing moved") {
		return // the answer outran the pause: said, not hidden
	}
	for _, want := range []string{"pauses within a heartbeat", "node 0's gate chose", "(completed)", "identical to an uninterrupted run"} {
		if !strings.Contains(got, want) {
			t.Fatalf("the act does not say %q:\n%s", want, got)
		}
	}
}
