package testnet

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/node"
)

// B6 — Testnet scaling (BENCHMARKS.md §7.2), wall-clock part on loopback.
//
// One run measures N = 10, 50 and 100 in-process nodes in turn, so every ratio against
// N = 10 comes from the same run and machine state. Per size:
//
//	(a) heap per node: HeapInuse after GC once converged, minus HeapInuse before the testnet
//	    started, ÷ N; goroutines per node likewise from runtime.NumGoroutine;
//	(b) convergence: from the call to New until WaitConverged returns (every node holds a
//	    fresh verified vector of every other);
//	(c) connections per node: mean len(Network().Conns()) over running nodes (reported at
//	    every N, headline at N = 100);
//	(d) late-join visibility: from the call to Add until every other running node holds the
//	    new node's fresh vector, and its ratio to the 15 s heartbeat.
//
// The heartbeat is the production 15 s, longer than any convergence target, so convergence
// and late-join visibility must come from announce-on-join, not from the periodic tick.
//
// Targets (BENCHMARKS.md B6):
//   - (a) heap-ratio-100/10 ≤ 1.5, with heap-MiB/node ≤ 2 and goroutines/node ≤ 120;
//   - (b) converge-ratio-100/10 ≤ 12;
//   - (c) conns/node@100 ≤ 32;
//   - (d) join-ratio-to-heartbeat ≤ 0.2, i.e. join-visible ≤ 3 s.
//
// Run with `make bench` or
//
//	go test -run='^$' -bench=TestnetScaling -benchtime=1x -timeout 20m ./testnet/
//
// With b.N > 1 every size is measured b.N times and the medians are reported.
func BenchmarkTestnetScaling(b *testing.B) {
	sizes := []int{10, 50, 100}
	baseGoroutines := runtime.NumGoroutine()

	samples := make(map[int][]scaleSample, len(sizes))
	for range b.N {
		for _, n := range sizes {
			s := measureScale(b, n)
			samples[n] = append(samples[n], s)
			// Close happened inside measureScale; wait for the goroutines to go before the
			// next size so neither its heap nor its goroutines bleed into the next baseline.
			settleGoroutines(b, baseGoroutines, fmt.Sprintf("after N=%d", n))
		}
	}

	med := make(map[int]scaleSample, len(sizes))
	for _, n := range sizes {
		med[n] = medianSample(samples[n])
	}
	heartbeat := benchHeartbeat.Seconds()

	var tbl strings.Builder
	fmt.Fprintf(&tbl, "GOMAXPROCS=%d NumCPU=%d %s, heartbeat %v, %d pass(es)\n",
		runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.Version(), benchHeartbeat, b.N)
	fmt.Fprintf(&tbl, "%5s %12s %14s %12s %11s %14s %10s %10s\n",
		"N", "heap-MiB/nd", "goroutines/nd", "converge-ms", "conns/nd", "join-visible", "join/hb", "new-ms")
	for _, n := range sizes {
		m := med[n]
		fmt.Fprintf(&tbl, "%5d %12.3f %14.1f %12.0f %11.1f %12.0fms %10.3f %10.0f\n",
			n, m.heapMiB, m.goroutines, ms(m.converge), m.conns, ms(m.joinVisible),
			m.joinVisible.Seconds()/heartbeat, ms(m.newTook))
	}
	b.Logf("B6 testnet scaling\n%s", tbl.String())

	for _, n := range sizes {
		m := med[n]
		b.ReportMetric(m.heapMiB, fmt.Sprintf("heap-MiB/node@%d", n))
		b.ReportMetric(m.goroutines, fmt.Sprintf("goroutines/node@%d", n))
		b.ReportMetric(ms(m.converge), fmt.Sprintf("converge-ms@%d", n))
		b.ReportMetric(m.conns, fmt.Sprintf("conns/node@%d", n))
		b.ReportMetric(ms(m.joinVisible), fmt.Sprintf("join-visible-ms@%d", n))
		b.ReportMetric(m.joinVisible.Seconds()/heartbeat, fmt.Sprintf("join-ratio-to-heartbeat@%d", n))
	}
	ref, big := med[10], med[100]
	b.ReportMetric(big.heapMiB/ref.heapMiB, "heap-ratio-100/10")
	b.ReportMetric(big.converge.Seconds()/ref.converge.Seconds(), "converge-ratio-100/10")
	b.ReportMetric(big.goroutines/ref.goroutines, "goroutine-ratio-100/10")
	// ns/op would be the sum of every phase of every size: meaningless here.
	b.ReportMetric(0, "ns/op")
}

const (
	benchHeartbeat = 15 * time.Second // production heartbeat (node.DefaultHeartbeat)
	// convergeDeadline bounds New+WaitConverged, and joinDeadline bounds Add until visible.
	// Both are far above the targets; hitting one is a failure, not a slow result.
	convergeDeadline = 120 * time.Second
	joinDeadline     = 60 * time.Second
	// settleDeadline bounds the wait for goroutines to end after Close.
	settleDeadline = 60 * time.Second
	// settleSlack is how many goroutines above the starting count still count as settled
	// (runtime and library singletons started lazily by the first testnet).
	settleSlack = 16
	// visiblePoll is how often late-join visibility is checked: ~N map lookups per check.
	visiblePoll = 5 * time.Millisecond
)

// scaleSample is one measurement of one testnet size.
type scaleSample struct {
	heapMiB     float64       // HeapInuse growth per node, MiB
	goroutines  float64       // goroutine growth per node
	converge    time.Duration // New until WaitConverged returned
	newTook     time.Duration // New alone (node start-up, before convergence)
	conns       float64       // mean libp2p connections per running node
	joinVisible time.Duration // Add until every other node holds the new node's vector
}

func measureScale(b *testing.B, n int) scaleSample {
	b.Helper()
	var s scaleSample

	heapBase := heapInuse()
	goBase := runtime.NumGoroutine()

	ctx, cancel := context.WithTimeout(context.Background(), convergeDeadline)
	defer cancel()
	start := time.Now()
	tn, err := New(Options{Nodes: n, NoConsole: true, Heartbeat: benchHeartbeat})
	if err != nil {
		b.Fatalf("N=%d: start testnet: %v", n, err)
	}
	defer func() {
		if err := tn.Close(); err != nil {
			b.Errorf("N=%d: close testnet: %v", n, err)
		}
	}()
	s.newTook = time.Since(start)
	progress := sampleProgress(ctx, tn, start)
	err = tn.WaitConverged(ctx)
	s.converge = time.Since(start)
	timeline := progress()
	if err != nil {
		b.Logf("N=%d: convergence timeline (elapsed: vectors held / needed): %s", n, timeline)
		b.Logf("N=%d: state at the deadline:\n%s", n, diagnose(tn))
		b.Fatalf("N=%d: not converged %v after New was called: %v", n, s.converge.Round(time.Millisecond), err)
	}
	b.Logf("N=%d: converged in %v (New took %v); timeline: %s",
		n, s.converge.Round(time.Millisecond), s.newTook.Round(time.Millisecond), timeline)

	// (a) memory and goroutines, then (c) connections, all before the late joiner perturbs them.
	heap := heapInuse()
	s.heapMiB = float64(int64(heap)-int64(heapBase)) / float64(n) / (1 << 20)
	s.goroutines = float64(runtime.NumGoroutine()-goBase) / float64(n)
	nodes := tn.Running()
	total := 0
	for _, nd := range nodes {
		total += len(nd.Host().Network().Conns())
	}
	s.conns = float64(total) / float64(len(nodes))

	// (d) late join.
	jctx, jcancel := context.WithTimeout(context.Background(), joinDeadline)
	defer jcancel()
	jstart := time.Now()
	idx, err := tn.Add()
	if err != nil {
		b.Fatalf("N=%d: add late node: %v", n, err)
	}
	joiner := tn.Node(idx)
	others := nodes // the running nodes before the join
	err = WaitFor(jctx, visiblePoll, func() bool { return holders(others, joiner) == len(others) })
	s.joinVisible = time.Since(jstart)
	if err != nil {
		st := joiner.Status()
		b.Logf("N=%d: late node %d visible to %d/%d nodes after %v; its conns=%d topic-peers=%d published=%d",
			n, idx, holders(others, joiner), len(others), s.joinVisible.Round(time.Millisecond),
			len(joiner.Host().Network().Conns()), st.Mesh.TopicPeers, st.Announcements.Published)
		b.Fatalf("N=%d: late node not visible everywhere: %v", n, err)
	}
	return s
}

// holders counts the nodes among nodes that hold a fresh vector of target.
func holders(nodes []*node.Node, target *node.Node) int {
	now := time.Now()
	id := target.ID()
	count := 0
	for _, nd := range nodes {
		if e, ok := nd.Registry().Get(id, now); ok && !e.Stale {
			count++
		}
	}
	return count
}

// pairsHeld counts (holder, other) pairs where holder has a fresh vector of other.
func pairsHeld(nodes []*node.Node) int {
	count := 0
	for _, nd := range nodes {
		now := time.Now()
		for _, other := range nodes {
			if other == nd {
				continue
			}
			if e, ok := nd.Registry().Get(other.ID(), now); ok && !e.Stale {
				count++
			}
		}
	}
	return count
}

// sampleProgress records, once a second until stopped or ctx ends, how many of the
// N·(N−1) vectors are held, so a slow convergence shows whether it crept or waited for the
// heartbeat tick. The returned func stops sampling and formats the timeline.
func sampleProgress(ctx context.Context, tn *Testnet, start time.Time) func() string {
	ctx, stop := context.WithCancel(ctx)
	done := make(chan []string, 1)
	go func() {
		var points []string
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				done <- points
				return
			case <-tick.C:
				nodes := tn.Running()
				k := len(nodes)
				points = append(points, fmt.Sprintf("%ds:%d/%d",
					int(time.Since(start).Round(time.Second).Seconds()), pairsHeld(nodes), k*(k-1)))
			}
		}
	}()
	return func() string {
		stop()
		points := <-done
		if len(points) == 0 {
			return "(under 1 s)"
		}
		return strings.Join(points, " ")
	}
}

// diagnose describes why a testnet has not converged: per node, how many peers it knows
// against how many run, how many nodes know it, and its connection and topic counts.
func diagnose(tn *Testnet) string {
	nodes := tn.Running()
	k := len(nodes)
	now := time.Now()
	knows := make([]int, k)
	knownBy := make([]int, k)
	for i, nd := range nodes {
		for j, other := range nodes {
			if i == j {
				continue
			}
			if e, ok := nd.Registry().Get(other.ID(), now); ok && !e.Stale {
				knows[i]++
				knownBy[j]++
			}
		}
	}
	var sb strings.Builder
	var conns, topic, dhtPeers []int
	var lagging []string
	for i, nd := range nodes {
		st := nd.Status()
		c := len(nd.Host().Network().Conns())
		conns = append(conns, c)
		topic = append(topic, st.Mesh.TopicPeers)
		dhtPeers = append(dhtPeers, st.Mesh.DHTPeers)
		if knows[i] < k-1 || knownBy[i] < k-1 {
			lagging = append(lagging, fmt.Sprintf("  node %-3d knows %3d/%d  known-by %3d/%d  conns %3d  topic-peers %3d  dht %3d  published %d accepted %d ignored %d rejected %d",
				i, knows[i], k-1, knownBy[i], k-1, c, st.Mesh.TopicPeers, st.Mesh.DHTPeers,
				st.Announcements.Published, st.Announcements.Accepted, st.Announcements.Ignored, st.Announcements.Rejected))
		}
	}
	fmt.Fprintf(&sb, "  %d nodes; vectors held %d/%d\n", k, pairsHeld(nodes), k*(k-1))
	fmt.Fprintf(&sb, "  knows     min/med/max %s\n", spread(knows))
	fmt.Fprintf(&sb, "  known-by  min/med/max %s\n", spread(knownBy))
	fmt.Fprintf(&sb, "  conns     min/med/max %s\n", spread(conns))
	fmt.Fprintf(&sb, "  topic     min/med/max %s\n", spread(topic))
	fmt.Fprintf(&sb, "  dht       min/med/max %s\n", spread(dhtPeers))
	fmt.Fprintf(&sb, "  %d lagging nodes (first 20):\n", len(lagging))
	for _, l := range lagging[:min(20, len(lagging))] {
		sb.WriteString(l + "\n")
	}
	return sb.String()
}

func spread(xs []int) string {
	if len(xs) == 0 {
		return "-"
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return fmt.Sprintf("%d/%d/%d", s[0], s[len(s)/2], s[len(s)-1])
}

// settleGoroutines waits until the goroutine count is back within settleSlack of base, and
// fails the benchmark (a leak, BENCHMARKS.md §7.1 rule 7) if it is not by settleDeadline.
func settleGoroutines(b *testing.B, base int, when string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), settleDeadline)
	defer cancel()
	start := time.Now()
	err := WaitFor(ctx, 50*time.Millisecond, func() bool { return runtime.NumGoroutine() <= base+settleSlack })
	if err != nil {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		b.Fatalf("%s: %d goroutines %v after Close, started with %d: leak?\n%s",
			when, runtime.NumGoroutine(), settleDeadline, base, firstBytes(buf, 8<<10))
	}
	b.Logf("%s: goroutines back to %d (start %d) in %v", when, runtime.NumGoroutine(), base,
		time.Since(start).Round(time.Millisecond))
}

func firstBytes(buf []byte, n int) []byte { return buf[:min(n, len(buf))] }

// heapInuse returns HeapInuse after two full GCs (the second collects what the first's
// finalizers released).
func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// medianSample is the per-field median of samples (the only sample when b.N = 1).
func medianSample(samples []scaleSample) scaleSample {
	pick := func(f func(scaleSample) float64) float64 {
		xs := make([]float64, len(samples))
		for i, s := range samples {
			xs[i] = f(s)
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	dur := func(f func(scaleSample) time.Duration) time.Duration {
		return time.Duration(pick(func(s scaleSample) float64 { return float64(f(s)) }))
	}
	return scaleSample{
		heapMiB:     pick(func(s scaleSample) float64 { return s.heapMiB }),
		goroutines:  pick(func(s scaleSample) float64 { return s.goroutines }),
		converge:    dur(func(s scaleSample) time.Duration { return s.converge }),
		newTook:     dur(func(s scaleSample) time.Duration { return s.newTook }),
		conns:       pick(func(s scaleSample) float64 { return s.conns }),
		joinVisible: dur(func(s scaleSample) time.Duration { return s.joinVisible }),
	}
}
