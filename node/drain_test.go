package node

import (
	"context"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
)

// Drain refuses every new peer task with shutting_down (a rejection routers retry
// elsewhere), announces the node as not accepting at once, and returns as soon as no task
// is in flight. Finishing a task in flight is testnet's TestProcsDrainOnSIGTERM, on a real
// process.
func TestDrainRefusesNewTasksAndAnnounces(t *testing.T) {
	n := startTestNode(t, Config{Models: []string{"synth-tiny"}, Heartbeat: time.Minute})
	within(t, 5*time.Second, "an announcement accepting work", func() bool { return n.Own() != nil && n.Own().Load.Accepting })
	if err := n.admit(n.ID()); err != nil {
		t.Fatalf("admission before the drain: %v", err)
	}
	published := n.announcer.Published()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.Drain(ctx); err != nil {
		t.Fatalf("drain with nothing in flight: %v", err)
	}
	if err := n.admit(n.ID()); inference.CodeOf(err) != inference.CodeShuttingDown {
		t.Fatalf("admission while draining: %v, want %s", err, inference.CodeShuttingDown)
	}
	within(t, 5*time.Second, "an announcement refusing work", func() bool { return n.announcer.Published() > published && !n.Own().Load.Accepting })
	if err := n.Drain(ctx); err != nil { // again: no second announcement needed, still nil
		t.Fatalf("second drain: %v", err)
	}
	t.Logf("figure F18: draining: a new task refused with %s, the node announced not accepting", inference.CodeShuttingDown)
}
