package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/participation"
)

// TestMemoryBudgetOf: the budget is the configured one (or the default share of the memory
// available at start), cut to the policy's share of that memory; an unknown amount of
// memory is cut by no share.
func TestMemoryBudgetOf(t *testing.T) {
	const free = 1000 << 20
	tests := []struct {
		name       string
		configured int64
		free       int64
		share      int
		want       int64
	}{
		{"default, standard", 0, free, 50, free / 2},
		{"default, eco", 0, free, 25, free / 100 * 25},
		{"default, power: the default share is smaller", 0, free, 75, free / 2},
		{"default, no share", 0, free, 0, free / 2},
		{"configured under the share", 100 << 20, free, 25, 100 << 20},
		{"configured over the share", 800 << 20, free, 25, free / 100 * 25},
		{"configured over all memory, no share", 2000 << 20, free, 0, 2000 << 20},
		{"memory unknown: configured", 100 << 20, 0, 10, 100 << 20},
		{"memory unknown, nothing configured", 0, 0, 50, 0},
	}
	for _, tt := range tests {
		var m memoryBudget
		m.init(tt.configured, tt.free, tt.share)
		if got := m.get(); got != tt.want {
			t.Errorf("%s: budget %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestMemoryShareTightensBudget: on eco (25 %) a configured budget over a quarter of the
// memory available is cut to that quarter and announced so; when the owner's consent,
// changed while the node runs, asks for 2 %, the budget follows at once, the stage range the
// node held and no session uses no longer fits and is unloaded, and the announcement says
// both.
func TestMemoryShareTightensBudget(t *testing.T) {
	root := t.TempDir()
	// 200 MiB available of 400 MiB.
	meminfo := filepath.Join(root, "proc", "meminfo")
	if err := os.MkdirAll(filepath.Dir(meminfo), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(meminfo, []byte("MemTotal: 409600 kB\nMemAvailable: 204800 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := participation.Consent{Version: participation.ConsentVersion, GivenAt: time.Now(), RunLocal: true, Contribute: true}
	if err := participation.SaveConsent(dir, c); err != nil {
		t.Fatal(err)
	}
	n := startTestNode(t, Config{Models: []string{"synth-small"}, DataDir: dir, ProbeRoot: root, Profile: participation.ProfileEco,
		MemoryBudget: 80 << 20, Heartbeat: time.Minute})
	if got := n.MemoryBudget(); got != 50<<20 {
		t.Fatalf("budget %d MiB on eco, want a quarter of 200 MiB: 50", got>>20)
	}
	within(t, 5*time.Second, "the first announcement", func() bool { return n.Own() != nil })
	if got := n.Own().RAM.BudgetMB; got != 50 {
		t.Fatalf("announced ram.budget_mb %d, want 50", got)
	}

	// A stage range, held once its session closed: 6.3 MB for two of synth-small's layers.
	s, err := n.stages.OpenStage(context.Background(), "synth-small", 0, 2, 8)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	within(t, 5*time.Second, "the range announced warm", func() bool { return len(n.Own().Stages) == 1 })

	c.MaxMemoryShare = 2 // 4 MiB of 200
	if err := participation.SaveConsent(dir, c); err != nil {
		t.Fatal(err)
	}
	published := n.announcer.Published()
	n.part.refreshConsent() // what the next admission or heartbeat does
	if got := n.MemoryBudget(); got != 200<<20/100*2 {
		t.Fatalf("budget %d after the owner asked for 2 %%, want %d", got, 200<<20/100*2)
	}
	if got := n.ranges.Ranges(); len(got) != 0 {
		t.Fatalf("ranges %+v held over the lowered budget", got)
	}
	within(t, 5*time.Second, "an announcement of the lowered budget, without the range", func() bool {
		v := n.Own()
		return n.announcer.Published() > published && v.RAM.BudgetMB == 4 && len(v.Stages) == 0
	})
}
