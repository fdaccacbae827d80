package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshinfer/meshinfer/testnet"
)

// runProcs is `meshinfer testnet --procs`: the nodes run as child processes of this
// binary. Every way out of it (Ctrl-C, SIGTERM, --duration, an error) stops and reaps them
// (Procs.Close); a SIGKILL of this process takes them along through their parent-death
// signal (Linux).
func runProcs(ctx context.Context, stdout, stderr io.Writer, opts testnet.ProcOptions, duration time.Duration) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--procs runs this binary as each node: %w", err)
	}
	opts.Binary, opts.Logs = self, stderr
	fmt.Fprintf(stdout, "starting %d node processes on loopback...\n", opts.Nodes)
	start := time.Now()
	ps, err := testnet.StartProcs(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(stdout, "stopping all node processes...")
		ps.Close()
		fmt.Fprintln(stdout, "stopped.")
	}()
	printProcs(stdout, ps)
	convergeCtx, cancel := context.WithTimeout(ctx, convergeTimeout)
	err = ps.WaitConverged(convergeCtx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			return fmt.Errorf("node processes did not converge within %v: every node should list every other in /api/peers; see the logs with GOLOG_LOG_LEVEL=info", convergeTimeout)
		}
		return nil
	}
	fmt.Fprintf(stdout, "\nconverged in %s: every node lists every other as a routing candidate\n", time.Since(start).Round(time.Millisecond))
	ids := make([]string, ps.Len())
	for i := range ids {
		ids[i] = ps.Proc(i).ID
	}
	demoRequests(ctx, stdout, "http://"+ps.Proc(0).API, ids, false)
	fmt.Fprintf(stdout, "try: meshinfer status --console %s; kill -STOP <PID> freezes a node, -CONT thaws it, -KILL crashes it   (Ctrl-C stops the testnet)\n\n",
		ps.Proc(0).Console)
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}
	<-ctx.Done()
	return nil
}

func printProcs(w io.Writer, ps *testnet.Procs) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tPID\tPEER ID\tMODELS\tAPI\tCONSOLE")
	for i := range ps.Len() {
		p := ps.Proc(i)
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\thttp://%s/v1\thttp://%s/api/status\n", i, p.PID, p.ID,
			strings.Join(testnet.DefaultModels(i), ","), p.API, p.Console)
	}
	tw.Flush()
}
