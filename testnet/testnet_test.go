package testnet

import (
	"context"
	"testing"
	"time"
)

func TestFiveNodesConverge(t *testing.T) {
	tn, err := New(Options{Nodes: 5, NoConsole: true, Heartbeat: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer tn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if err := tn.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("converged in %v", time.Since(start))
}
