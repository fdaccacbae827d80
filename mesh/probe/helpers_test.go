package probe

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// waitDeadline bounds every wait on the background loop. Waits end as soon as their condition
// holds; the deadline only stops a broken test from hanging.
const waitDeadline = 10 * time.Second

// waitFor polls cond every few milliseconds until it holds; it fails the test, naming
// what it waited for, at waitDeadline. The one polling wait of this package's tests (the
// GPU state has its own change channel: waitGPU).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(waitDeadline)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("waited %v for %s", waitDeadline, what)
		}
	}
}

// writeTree lays out files (path relative to root → content) under root.
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// newTree returns a fresh root holding files.
func newTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	writeTree(t, root, files)
	return root
}

// newProber returns a Prober closed at the end of the test.
func newProber(t *testing.T, opts ...Option) *Prober {
	t.Helper()
	p, err := New(opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// waitGPU blocks until cond holds for the published GPU state, woken by each publication.
func waitGPU(t *testing.T, p *Prober, cond func(gpuState) bool) gpuState {
	t.Helper()
	deadline := time.NewTimer(waitDeadline)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		st := p.gpu
		p.mu.Unlock()
		if cond(st) {
			return st
		}
		select {
		case <-st.changed:
		case <-deadline.C:
			t.Fatalf("gpu state never met the condition; last: %+v", st)
		}
	}
}

// refreshed is a waitGPU condition: at least n complete refreshes.
func refreshed(n int) func(gpuState) bool {
	return func(st gpuState) bool { return st.refreshes >= n }
}

// fakeCommand writes an executable shell script and returns its absolute path.
func fakeCommand(t *testing.T, script string) string {
	t.Helper()
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	path := filepath.Join(t.TempDir(), "nvidia-smi")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}
