package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/reputation"
	"github.com/meshinfer/meshinfer/testnet"
)

const testnetSynopsis = `Run N nodes in this process on 127.0.0.1 and show them find each other. Node 0 is the
bootstrap; node i's console listens on --console-base + i. Prints a table of nodes, waits until
every node holds every other's verified capability vector, sends a few requests to show the
router at work (local, a peer, the stand-in cloud, a local-only refusal), then prints live
status. Ctrl-C (or --duration) stops every node cleanly.

With --procs every node is a 'meshinfer node' process of its own instead, node i on
127.0.0.(i+1): the table shows each PID, so real signals are real faults (kill -KILL crashes
a node, -STOP freezes it, -CONT thaws it, -TERM drains and stops it). The children never
outlive the command: Ctrl-C stops and reaps them, and on Linux they die with it even if it
is killed.

With --cloud (the default) a stand-in cloud API runs too: the built-in models behind a
meshinfer API that adds --cloud-latency before each response; every node uses it as its
cloud tier, for requests whose privacy is any.`

func runTestnet(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("testnet", testnetSynopsis, stderr)
	nodes := fs.Int("nodes", 5, "how many nodes to run")
	mesh := fs.String("mesh", node.DefaultMesh, "mesh name")
	consoleBase := fs.Int("console-base", 3131, "console port of node 0; node i uses base+i (0: OS-chosen ports)")
	apiBase := fs.Int("api-base", 9337, "OpenAI API port of node 0; node i uses base+i (0: OS-chosen ports)")
	duration := fs.Duration("duration", 0, "once the nodes have converged and the demo has run, keep running this long, then stop (0: until Ctrl-C)")
	heartbeat := fs.Duration("heartbeat", node.DefaultHeartbeat, "capability re-announcement period")
	watch := fs.Duration("watch", 2*time.Second, "how often to print live status (0: never)")
	seed := fs.Uint64("seed", 1, "seed for the choice of bootstrap peers")
	cloud := fs.Bool("cloud", true, "run a stand-in cloud API as every node's cloud tier")
	cloudLatency := fs.Duration("cloud-latency", testnet.DefaultCloudLatency, "latency the stand-in cloud adds before each response")
	coldStart := fs.Duration("cold-start", 0, "added to every synthetic model's load on the nodes, to show real-length cold starts (e.g. 3s)")
	faults := fs.String("faults", "", "comma-separated faulty nodes to start, e.g. liar=1,slow=1: liars (the last nodes) alter every token they generate, and sampled verification finds them; slow nodes (just before them) wait 500ms before their first token and 30ms before each next; flaky nodes (before those) drop all their connections every 2s")
	useWebRTC := fs.Bool("webrtc", false, "nodes send their requests to peers over WebRTC data channels (libp2p where no direct path sets up) and answer each other's WebRTC set-ups, as node --webrtc; 'meshinfer status' shows the paths")
	scenario := fs.String("scenario", scenarioNone, "what to play after the demo: none; battery-drain (node 1's simulated battery drains below the floor, then charges: it pauses, is skipped, comes back; then the peer serving a long answer drains mid-stream and hands the generation over live); or shard (synth-large, too big for any node's 256 MiB budget, served by a pipeline of layer ranges across the nodes)")
	procs := fs.Bool("procs", false, "run each node as its own 'meshinfer node' process (node i on 127.0.0.(i+1), OS-chosen ports), so that real signals are faults: kill -KILL, -STOP, -CONT or -TERM a node's PID from the table; children die with this command, even if it is killed. Not with --cloud, --cloud-latency, --faults, --webrtc, --scenario, --cold-start, --console-base, --api-base, --seed or --watch")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	set := map[string]bool{} // the flags given
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *procs {
		var bad []string // in flag order
		for _, name := range []string{"api-base", "cloud", "cloud-latency", "cold-start", "console-base", "faults", "scenario", "seed", "watch", "webrtc"} {
			if set[name] {
				bad = append(bad, "--"+name)
			}
		}
		if len(bad) > 0 {
			fmt.Fprintf(stderr, "meshinfer testnet: --procs does not take %s\n", strings.Join(bad, ", "))
			return errUsage
		}
	}
	switch *scenario {
	case scenarioNone, scenarioBatteryDrain, scenarioShard:
	default:
		fmt.Fprintf(stderr, "meshinfer testnet: --scenario %q: known scenarios are %s, %s and %s\n", *scenario, scenarioNone, scenarioBatteryDrain, scenarioShard)
		return errUsage
	}
	fl, err := parseFaults(*faults)
	if err != nil {
		fmt.Fprintf(stderr, "meshinfer testnet: --faults %q: %v\n", *faults, err)
		return errUsage
	}
	if *scenario == scenarioBatteryDrain && !set["heartbeat"] {
		*heartbeat = 2 * time.Second // the scenario's steps follow heartbeats: keep it short
	}
	if *nodes < 1 {
		fmt.Fprintln(stderr, "meshinfer testnet: --nodes must be at least 1")
		return errUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *procs {
		if !set["mesh"] {
			*mesh = "" // a mesh of its own
		}
		return runProcs(ctx, stdout, stderr, testnet.ProcOptions{Nodes: *nodes, Mesh: *mesh, Heartbeat: *heartbeat}, *duration)
	}

	fmt.Fprintf(stdout, "starting %d nodes on loopback...\n", *nodes)
	start := time.Now()
	opts := testnet.Options{
		Nodes: *nodes, Mesh: *mesh, ConsoleBase: *consoleBase, APIBase: *apiBase, Heartbeat: *heartbeat,
		Version: version, Seed: *seed, Cloud: *cloud, CloudLatency: *cloudLatency, ColdStart: *coldStart,
		Sensors: *scenario == scenarioBatteryDrain, Faults: fl, WebRTC: *useWebRTC,
	}
	if *scenario == scenarioShard {
		opts.ModelsFor = shardModels
	}
	if fl.Liars > 0 {
		// Verification voters must be established peers on hosts apart (10 minutes known,
		// score 60, another /24). A demo cannot wait that long: its nodes vote as soon as
		// they are connected, each on a loopback address of its own (Linux routes all of
		// 127.0.0.0/8 to loopback; elsewhere voters would share a host and never vote).
		opts.DistinctHosts = runtime.GOOS == "linux"
		opts.Configure = func(_ int, cfg *node.Config) {
			cfg.VoterMinKnown, cfg.VoterMinScore = time.Nanosecond, reputation.ExcludeBelow
		}
	}
	tn, err := testnet.New(opts)
	if err != nil {
		return fmt.Errorf("%w\nif a port is taken, pick others with --console-base and --api-base", err)
	}
	defer func() {
		fmt.Fprintln(stdout, "stopping all nodes...")
		tn.Close()
		fmt.Fprintln(stdout, "stopped.")
	}()
	printNodes(stdout, tn)
	if fl.Liars > 0 {
		fmt.Fprintf(stdout, "faults: the last %d node(s) lie (alter every token); sampled verification penalizes them, watch 'meshinfer status'\n", fl.Liars)
		fmt.Fprintln(stdout, "        (in this testnet verifiers vote once connected; a real mesh waits until they are established: 10 min, score 60, hosts apart)")
		if !opts.DistinctHosts {
			fmt.Fprintln(stdout, "        (not on Linux: the nodes share one loopback host, so no peer may vote and liars go unverified)")
		}
	}
	if fl.Flaky > 0 {
		fmt.Fprintf(stdout, "faults: %d node(s) before those drop all their connections every %v; cut streams resume elsewhere\n", fl.Flaky, testnet.FlakyPeriod)
	}
	if fl.Slow > 0 {
		fmt.Fprintf(stdout, "faults: %d node(s) before them answer slowly; the router's performance weighting sends them less\n", fl.Slow)
	}
	if *useWebRTC {
		fmt.Fprintln(stdout, "webrtc: requests between nodes go over WebRTC data channels (libp2p where no path sets up); every node answers WebRTC set-ups")
	}
	if c := tn.Cloud(); c != nil {
		fmt.Fprintf(stdout, "cloud: %s/v1 (stand-in, +%v per response; serves %s)\n", c.URL(), *cloudLatency, strings.Join(c.Models(), ", "))
	}

	convergeCtx, cancelConverge := context.WithTimeout(ctx, convergeTimeout)
	err = tn.WaitConverged(convergeCtx)
	cancelConverge()
	if err != nil {
		if ctx.Err() == nil {
			return fmt.Errorf("nodes did not converge within %v: every node should hold every other node's capability vector; try fewer --nodes, or see the logs with GOLOG_LOG_LEVEL=info", convergeTimeout)
		}
		return nil // Ctrl-C before convergence: stop quietly
	}
	fmt.Fprintf(stdout, "\nconverged in %s: every node holds every other node's verified capability vector\n",
		time.Since(start).Round(time.Millisecond))
	demo(ctx, stdout, tn)
	switch *scenario {
	case scenarioBatteryDrain:
		batteryDrain(ctx, stdout, tn, *heartbeat)
	case scenarioShard:
		shard(ctx, stdout, tn)
	}
	if n := tn.Node(0); n != nil && n.ConsoleAddr() != "" {
		fmt.Fprintf(stdout, "try: meshinfer status --console %s   (Ctrl-C stops the testnet)\n\n", n.ConsoleAddr())
	}
	if *duration > 0 { // counted from here: a slow machine's start-up never eats into it
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
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

// parseFaults reads --faults: "liar=N" entries, comma-separated.
func parseFaults(s string) (testnet.Faults, error) {
	var f testnet.Faults
	if s == "" {
		return f, nil
	}
	for _, part := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(val)
		if !ok || err != nil || n < 0 {
			return f, fmt.Errorf("%q: want name=count, e.g. liar=1", part)
		}
		switch name {
		case "liar":
			f.Liars = n
		case "slow":
			f.Slow = n
		case "flaky":
			f.Flaky = n
		default:
			return f, fmt.Errorf("unknown fault %q; known: liar, slow, flaky", name)
		}
	}
	return f, nil
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

// convergeTimeout bounds the wait for every node to hold every other node's vector. A few
// nodes converge in seconds; two minutes is a fault, not a slow machine.
const convergeTimeout = 2 * time.Minute

// demoRequestTimeout bounds each demo request; the node's own first-token and inter-token
// timeouts end a stuck one well before.
const demoRequestTimeout = time.Minute

// demo sends a few requests and shows who served each, so that the first screen of `make
// run` shows the router at work: node 0's own model, a model only peers serve, the cloud
// for a model no node serves (privacy any), and a local-only request refused rather than
// sent away.
func demo(ctx context.Context, w io.Writer, tn *testnet.Testnet) {
	ids := make([]string, tn.Len())
	for i := range ids {
		if n := tn.Node(i); n != nil {
			ids[i] = n.ID().String()
		}
	}
	if n := tn.Node(0); n != nil && n.APIAddr() != "" {
		demoRequests(ctx, w, "http://"+n.APIAddr(), ids, tn.Cloud() != nil)
	}
}

// demoRequests is demo through node 0's API at api; ids are the nodes' peer IDs by index
// ("" where stopped), to name who served each request.
func demoRequests(ctx context.Context, w io.Writer, api string, ids []string, cloud bool) {
	names := map[string]string{"local": "itself", "cloud": "the cloud"}
	for i, id := range ids {
		if id != "" {
			names[inference.Served{Tier: inference.TierMesh, Peer: id}.Route()] = fmt.Sprintf("node %d", i)
		}
	}
	cases := []struct {
		what string
		cr   chatRequest
	}{
		{"its own model", chatRequest{model: "synth-tiny"}},
		{"a model only peers serve", chatRequest{model: "synth-small"}},
		{"a model no node serves, privacy any", chatRequest{model: "synth-base", privacy: "any"}},
		{"a peer's model, privacy local-only", chatRequest{model: "synth-small", privacy: "local-only"}},
	}
	if !cloud {
		cases = slices.Delete(cases, 2, 3)
	}
	for _, c := range cases {
		c.cr.prompt, c.cr.maxTokens = "hello mesh", 8
		began := time.Now()
		var text strings.Builder
		rctx, cancel := context.WithTimeout(ctx, demoRequestTimeout)
		out, err := chat(rctx, api, c.cr, func(s string) { text.WriteString(s) })
		cancel()
		fmt.Fprintf(w, "node 0 API, %-38s", c.what+":")
		if err != nil {
			fmt.Fprintf(w, " refused: %v\n", err)
			continue
		}
		where := out.route
		if name, ok := names[where]; ok {
			where = name
		}
		fmt.Fprintf(w, " served by %-9s (%s) %2d tokens in %4dms: %q\n",
			where, out.tier, out.tokens, time.Since(began).Milliseconds(), text.String())
	}
	fmt.Fprintln(w, "(the synthetic models compute for real, but their text is meaningless)")
}
