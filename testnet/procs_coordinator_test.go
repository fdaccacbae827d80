//go:build unix

package testnet

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/transport/gateway"
	"github.com/meshinfer/meshinfer/transport/gateway/client"
)

// f13Lost is F13's figure: a task whose coordinator crashed returns coordinator_lost to its
// originator within 5 s of the crash.
const f13Lost = 5 * time.Second

// F13 on a real process: a coordinator serving synth-tiny itself has 20 thin-client tasks
// streaming when it is killed with SIGKILL, then restarted on the same data dir and API
// address. Each task ends once: completed (before the crash, or resubmitted with its
// idempotency key to the restarted coordinator) or coordinator_lost within 5 s of the kill.
// No task is metered completed twice, and the restarted coordinator starts on its old data
// dir (idempotency records, usage log) without failing. With -tags soak (make soak) a second
// round kills it for good: every task then returns coordinator_lost within 5 s (4 s more).
func TestProcsCoordinatorRestart(t *testing.T) {
	ps := startProcs(t, ProcOptions{Nodes: 1, Coordinator: true, StableAPI: true, NoQUIC: true,
		ModelsFor: func(int) []string { return []string{"synth-tiny"} }})
	ks, err := gateway.OpenKeys(ps.Proc(0).DataDir)
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := ks.Create("f13", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f13Round(t, ps, key, true)
	if soakTests {
		f13Round(t, ps, key, false)
	}
}

// f13Round runs 20 tasks through a new client of node 0, kills node 0 once every task
// streams, restarts it (restart) or not, and checks F13's figure.
func f13Round(t *testing.T, ps *Procs, key string, restart bool) {
	const tasks = 20
	before := len(completedRuns(t, ps.Proc(0).DataDir))
	c := client.New("http://"+ps.Proc(0).API, key)
	defer c.Close()

	type outcome struct {
		err error
		at  time.Time
	}
	var (
		wg       sync.WaitGroup
		out      = make([]outcome, tasks)
		streamed = make(chan struct{}, tasks) // one per task at its first token
		ended    atomic.Int64
	)
	for i := range tasks {
		wg.Go(func() {
			first := true
			body := map[string]any{"model": "synth-tiny", "max_tokens": 4096, "seed": i,
				"messages": []map[string]string{{"role": "user", "content": "coordinator restart"}}}
			_, err := c.Chat(context.Background(), body, func(client.Token) {
				if first {
					first = false
					streamed <- struct{}{}
				}
			})
			out[i] = outcome{err, time.Now()}
			if ended.Add(1); first {
				streamed <- struct{}{} // ended without a token
			}
		})
	}
	for range tasks {
		<-streamed
	}
	inFlight := tasks - int(ended.Load()) // at most: some may end during the kill
	if err := ps.Kill(0); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var restarted time.Duration
	if restart {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := ps.Restart(ctx, 0); err != nil {
			t.Fatalf("restart on the same data dir: %v", err)
		}
		restarted = time.Since(killed)
	}
	wg.Wait()

	completed, lost, late := 0, 0, time.Duration(0)
	for i, o := range out {
		var e *client.Error
		switch {
		case o.err == nil:
			completed++
		case errors.As(o.err, &e) && e.Code == string(inference.CodeCoordinatorLost):
			lost++
			if d := o.at.Sub(killed); d > late {
				late = d
			}
		default:
			t.Errorf("task %d: %v, want a completion or coordinator_lost", i, o.err)
		}
	}
	if late > f13Lost {
		t.Errorf("coordinator_lost came %v after the kill, want within %v", late, f13Lost)
	}
	// Metering runs just after each response: stop the restarted coordinator gracefully
	// (SIGTERM: its executor waits for the meter lines) to read the whole log, then start it
	// again for what follows.
	if restart {
		if err := ps.Terminate(0); err != nil {
			t.Fatal(err)
		}
		<-ps.Proc(0).Exited()
	}
	byRun := completedRuns(t, ps.Proc(0).DataDir)
	for run, n := range byRun {
		if run == "" || n != 1 {
			t.Errorf("run %q metered completed %d times", run, n)
		}
	}
	// Runs of earlier rounds are in the log too; a completed task whose line the kill cut
	// is not billed, one billed whose done the kill cut returned coordinator_lost.
	metered := len(byRun) - before
	if metered > completed+lost {
		t.Errorf("%d runs metered completed for %d completions and %d coordinator_lost", metered, completed, lost)
	}
	if restart {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := ps.Restart(ctx, 0); err != nil {
			t.Fatalf("restart after a drain: %v", err)
		}
	}
	t.Logf("figure F13: coordinator process %s: %d tasks, %d streaming at the kill; restart took %v; %d completed, %d coordinator_lost (latest %v after the kill); %d runs metered completed, each once",
		map[bool]string{true: "restarted", false: "gone"}[restart], tasks, inFlight, restarted.Round(time.Millisecond), completed, lost, late.Round(time.Millisecond), metered)
}

// completedRuns counts the completed meter events of each gateway run in the usage log of
// the coordinator in dataDir (none before its first task). A torn last line of a crash is
// skipped.
func completedRuns(t *testing.T, dataDir string) map[string]int {
	t.Helper()
	byRun := map[string]int{}
	err := gateway.ReadEvents(filepath.Join(dataDir, gateway.UsageFile), func(e gateway.MeterEvent) {
		if e.Outcome == gateway.OutcomeCompleted {
			byRun[e.Idempotency]++
		}
	})
	var bad *gateway.BadLinesError
	if err != nil && !errors.As(err, &bad) && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return byRun
}
