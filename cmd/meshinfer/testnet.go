package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/testnet"
)

const testnetSynopsis = `Run N nodes in this process on 127.0.0.1 and show them find each other. Node 0 is the
bootstrap; node i's console listens on --console-base + i. Prints a table of nodes, waits until
every node holds every other's verified capability vector, then prints live status.
Ctrl-C (or --duration) stops every node cleanly.`

func runTestnet(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("testnet", testnetSynopsis, stderr)
	nodes := fs.Int("nodes", 5, "how many nodes to run")
	mesh := fs.String("mesh", node.DefaultMesh, "mesh name")
	consoleBase := fs.Int("console-base", 3131, "console port of node 0; node i uses base+i (0: OS-chosen ports)")
	apiBase := fs.Int("api-base", 9337, "OpenAI API port of node 0; node i uses base+i (0: OS-chosen ports)")
	duration := fs.Duration("duration", 0, "stop after this long (0: run until Ctrl-C)")
	heartbeat := fs.Duration("heartbeat", node.DefaultHeartbeat, "capability re-announcement period")
	watch := fs.Duration("watch", 2*time.Second, "how often to print live status (0: never)")
	seed := fs.Uint64("seed", 1, "seed for the choice of bootstrap peers")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *nodes < 1 {
		fmt.Fprintln(stderr, "meshinfer testnet: --nodes must be at least 1")
		return errUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}

	fmt.Fprintf(stdout, "starting %d nodes on loopback...\n", *nodes)
	start := time.Now()
	tn, err := testnet.New(testnet.Options{
		Nodes: *nodes, Mesh: *mesh, ConsoleBase: *consoleBase, APIBase: *apiBase, Heartbeat: *heartbeat,
		Version: version, Seed: *seed,
	})
	if err != nil {
		return fmt.Errorf("%w\nif a port is taken, pick others with --console-base and --api-base", err)
	}
	defer func() {
		fmt.Fprintln(stdout, "stopping all nodes...")
		tn.Close()
		fmt.Fprintln(stdout, "stopped.")
	}()
	printNodes(stdout, tn)

	if err := tn.WaitConverged(ctx); err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("nodes did not converge within --duration %v", *duration)
		}
		return nil // Ctrl-C before convergence: stop quietly
	}
	fmt.Fprintf(stdout, "\nconverged in %s: every node holds every other node's verified capability vector\n",
		time.Since(start).Round(time.Millisecond))
	demo(ctx, stdout, tn)
	if n := tn.Node(0); n != nil && n.ConsoleAddr() != "" {
		fmt.Fprintf(stdout, "try: meshinfer status --console %s   (Ctrl-C stops the testnet)\n\n", n.ConsoleAddr())
	}
	if *watch <= 0 {
		<-ctx.Done()
		return nil
	}
	tick := time.NewTicker(*watch)
	defer tick.Stop()
	for {
		printLive(stdout, tn, time.Since(start))
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func printNodes(w io.Writer, tn *testnet.Testnet) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tPEER ID\tMODELS\tLISTEN\tAPI\tCONSOLE")
	for i := range tn.Len() {
		n := tn.Node(i)
		if n == nil {
			continue
		}
		addr := "-"
		if a := n.Host().Addrs(); len(a) > 0 {
			addr = a[0].String()
		}
		cons, api := "-", "-"
		if c := n.ConsoleAddr(); c != "" {
			cons = "http://" + c + "/api/status"
		}
		if a := n.APIAddr(); a != "" {
			api = "http://" + a + "/v1"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", i, n.ID(), strings.Join(n.Status().Inference.Models, ","), addr, api, cons)
	}
	tw.Flush()
}

func printLive(w io.Writer, tn *testnet.Testnet, up time.Duration) {
	fmt.Fprintf(w, "[%s]", up.Round(time.Second))
	for i := range tn.Len() {
		n := tn.Node(i)
		if n == nil {
			fmt.Fprintf(w, "  n%d: down", i)
			continue
		}
		st := n.Status()
		fmt.Fprintf(w, "  n%d: %d known/%d conn/%d served", i, st.Mesh.PeersKnown, st.Mesh.PeersConnected, st.Inference.Served)
	}
	fmt.Fprintln(w)
}

// demo sends one request per model to the first two nodes' APIs and shows who served it, so
// the first screen of `make run` shows requests crossing the mesh.
func demo(ctx context.Context, w io.Writer, tn *testnet.Testnet) {
	names := map[string]string{}
	for i := range tn.Len() {
		if n := tn.Node(i); n != nil {
			names["peer:"+n.ID().String()] = fmt.Sprintf("node %d (peer)", i)
		}
	}
	for i := range min(2, tn.Len()) {
		n := tn.Node(i)
		if n == nil || n.APIAddr() == "" {
			continue
		}
		for _, model := range []string{"synth-tiny", "synth-small"} {
			began := time.Now()
			var text strings.Builder
			out, err := chat(ctx, "http://"+n.APIAddr(), model, "hello mesh", 12, 0, func(s string) { text.WriteString(s) })
			if err != nil {
				fmt.Fprintf(w, "node %d API, %s: %v\n", i, model, err)
				continue
			}
			where := out.route
			if name, ok := names[where]; ok {
				where = name
			}
			fmt.Fprintf(w, "node %d API, %-11s -> served by %-16s %2d tokens in %4dms: %q\n",
				i, model, where, out.tokens, time.Since(began).Milliseconds(), text.String())
		}
	}
	fmt.Fprintln(w, "(the synthetic models compute for real, but their text is meaningless)")
}
