//go:build unix

package testnet

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/node"
)

// B6 — Testnet scaling (docs/benchmarks.md §7.2), wall-clock part on loopback.
//
// One run measures N = 10, 50 and 100 in-process nodes in turn, so every ratio against
// N = 10 comes from the same run and machine state. Per size:
//
//	(a) heap per node: HeapInuse after GC once converged, minus HeapInuse before the testnet
//	    started, ÷ N; goroutines per node likewise from runtime.NumGoroutine;
//	(b) convergence: from the call to New until WaitConverged returns (every node holds a
//	    fresh verified vector of every other), and the process CPU time spent meanwhile;
//	(c) connections per node: mean len(Network().Conns()) over running nodes (reported at
//	    every N; the headline is N = 100);
//	(d) late-join visibility: from the call to Add until every other running node holds the
//	    new node's fresh vector, and its ratio to the 15 s heartbeat.
//
// The heartbeat is the production 15 s, longer than any convergence target, so convergence
// and late-join visibility must come from announce-on-join (and the sync on join), not from
// the periodic tick. Consoles and APIs are off: they are not part of the mesh's cost.
//
// Targets (docs/benchmarks.md B6):
//   - (a) heap-ratio-100/10 ≤ 1.5, with heap-MiB/node ≤ 2 and goroutines/node ≤ 120;
//   - (b) converge-ratio-100/10 ≤ 12;
//   - (c) conns/node@100 ≤ 32;
//   - (d) join-ratio-to-heartbeat ≤ 0.2, i.e. join-visible ≤ 3 s;
//   - the whole B6 stage in ≤ 60 s.
//
// Run with `make bench`, or alone:
//
//	go test -run='^$' -bench=TestnetScaling -benchtime=1x -timeout 20m ./testnet/
//
// With b.N > 1 every size is measured b.N times and the medians are reported. When a size
// does not converge by its deadline the benchmark fails and logs, per node, what it knows,
// who knows it, its connections and topic peers, plus a timeline of the convergence and of
// the scheduler lag (how late a 100 ms sleep wakes up: seconds mean the process is
// CPU-starved, not that a message was lost).
func BenchmarkTestnetScaling(b *testing.B) {
	baseGoroutines := runtime.NumGoroutine()
	stageStart := time.Now()
	samples := make(map[int][]b6Sample, len(b6Sizes))
	for range b.N {
		for _, n := range b6Sizes {
			done := func() string { return b6Table(b6Sizes, samples, b.N) }
			samples[n] = append(samples[n], b6Measure(b, n, done))
			// The testnet is closed; wait for its goroutines to end before the next size so
			// neither its heap nor its goroutines bleed into the next baseline.
			b6Settle(b, baseGoroutines, fmt.Sprintf("after N=%d", n))
		}
	}
	stage := time.Since(stageStart)

	// Benchmark output is cut after 10 lines when the benchmark passes: the table first.
	b.Logf("B6 testnet scaling, whole stage %.1f s\n%s", stage.Seconds(), b6Table(b6Sizes, samples, b.N))

	hb := b6Heartbeat.Seconds()
	med := make(map[int]b6Sample, len(b6Sizes))
	for _, n := range b6Sizes {
		m := b6Median(samples[n])
		med[n] = m
		b.ReportMetric(m.heapMiB, fmt.Sprintf("heap-MiB/node@%d", n))
		b.ReportMetric(m.goroutines, fmt.Sprintf("goroutines/node@%d", n))
		b.ReportMetric(b6MS(m.converge), fmt.Sprintf("converge-ms@%d", n))
		b.ReportMetric(m.cpu.Seconds(), fmt.Sprintf("converge-cpu-s@%d", n))
		b.ReportMetric(b6MS(m.schedLag), fmt.Sprintf("sched-lag-max-ms@%d", n))
		b.ReportMetric(m.conns, fmt.Sprintf("conns/node@%d", n))
		b.ReportMetric(b6MS(m.joinVisible), fmt.Sprintf("join-visible-ms@%d", n))
		b.ReportMetric(m.joinVisible.Seconds()/hb, fmt.Sprintf("join-ratio-to-heartbeat@%d", n))
	}
	ref, big := med[b6Sizes[0]], med[b6Sizes[len(b6Sizes)-1]]
	b.ReportMetric(big.heapMiB/ref.heapMiB, "heap-ratio-100/10")
	b.ReportMetric(big.converge.Seconds()/ref.converge.Seconds(), "converge-ratio-100/10")
	b.ReportMetric(big.goroutines/ref.goroutines, "goroutine-ratio-100/10")
	b.ReportMetric(stage.Seconds()/float64(b.N), "stage-s")
	// ns/op would be the sum of every phase of every size: meaningless here.
	b.ReportMetric(0, "ns/op")
}

// b6Table formats the medians of the sizes measured so far.
func b6Table(sizes []int, samples map[int][]b6Sample, passes int) string {
	var tbl strings.Builder
	fmt.Fprintf(&tbl, "GOMAXPROCS=%d NumCPU=%d %s, heartbeat %v, %d pass(es)\n",
		runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.Version(), b6Heartbeat, passes)
	fmt.Fprintf(&tbl, "%5s %11s %13s %11s %7s %9s %8s %12s %8s %8s\n", "N", "heap-MiB/nd",
		"goroutines/nd", "converge-ms", "cpu-s", "lag-ms", "conns/nd", "join-vis-ms", "join/hb", "close-s")
	for _, n := range sizes {
		if len(samples[n]) == 0 {
			continue
		}
		m := b6Median(samples[n])
		fmt.Fprintf(&tbl, "%5d %11.3f %13.1f %11.0f %7.1f %9.0f %8.1f %12.0f %8.3f %8.1f\n",
			n, m.heapMiB, m.goroutines, b6MS(m.converge), m.cpu.Seconds(), b6MS(m.schedLag), m.conns,
			b6MS(m.joinVisible), m.joinVisible.Seconds()/b6Heartbeat.Seconds(), m.close.Seconds())
	}
	return strings.TrimSuffix(tbl.String(), "\n")
}

// b6Sizes are the testnet sizes, smallest (the reference) first.
var b6Sizes = []int{10, 50, 100}

const (
	b6Heartbeat = 15 * time.Second // production heartbeat (node.DefaultHeartbeat)
	// b6ConvergeDeadline bounds New+WaitConverged and b6JoinDeadline bounds Add until
	// visible. Both are far above the targets: hitting one is a failure, not a slow result.
	b6ConvergeDeadline = 120 * time.Second
	b6JoinDeadline     = 60 * time.Second
	// b6SettleDeadline bounds the wait for goroutines to end after Close.
	b6SettleDeadline = 60 * time.Second
	// b6SettleSlack is how many goroutines above the starting count still count as settled
	// (runtime and library singletons started lazily by the first testnet).
	b6SettleSlack = 16
	// b6VisiblePoll is how often late-join visibility is checked: N map lookups per check.
	b6VisiblePoll = 5 * time.Millisecond
	// b6SamplePeriod is the period of the convergence timeline.
	b6SamplePeriod = 2 * time.Second
)

// b6Sample is one measurement of one testnet size.
type b6Sample struct {
	heapMiB     float64       // HeapInuse growth per node, MiB
	goroutines  float64       // goroutine growth per node
	converge    time.Duration // New called until WaitConverged returned
	cpu         time.Duration // process CPU time over the same span
	schedLag    time.Duration // worst lateness of a 100 ms sleep over the same span
	conns       float64       // mean libp2p connections per running node
	joinVisible time.Duration // Add called until every other node held the new vector
	close       time.Duration // Close of the testnet
}

// b6Measure measures one size. On failure it logs the sizes done so far (done), the
// convergence timeline and the state of every lagging node, then fails the benchmark.
func b6Measure(b *testing.B, n int, done func() string) (s b6Sample) {
	b.Helper()

	heapBase := b6HeapInuse()
	goBase := runtime.NumGoroutine()

	ctx, cancel := context.WithTimeout(context.Background(), b6ConvergeDeadline)
	defer cancel()
	cpu0 := b6CPU()
	start := time.Now()
	tn, err := New(Options{Nodes: n, NoConsole: true, NoAPI: true, Heartbeat: b6Heartbeat})
	if err != nil {
		b.Fatalf("N=%d: start testnet: %v", n, err)
	}
	started := time.Since(start)
	defer func() {
		t := time.Now()
		if err := tn.Close(); err != nil {
			b.Errorf("N=%d: close testnet: %v", n, err)
		}
		s.close = time.Since(t)
		if b.Failed() {
			b.Logf("N=%d: Close took %v", n, s.close.Round(time.Millisecond))
		}
	}()
	timeline := b6Timeline(ctx, tn, start)
	err = tn.WaitConverged(ctx)
	s.converge = time.Since(start)
	s.cpu = b6CPU() - cpu0
	var points string
	points, s.schedLag = timeline()
	if err != nil {
		b.Logf("sizes done so far:\n%s", done())
		b.Logf("N=%d: New returned after %v; timeline:%s", n, started.Round(time.Millisecond), points)
		b.Logf("N=%d: state after the deadline:\n%s", n, b6Diagnose(tn))
		b.Fatalf("N=%d: not converged %v after New was called (%.1f CPU-s, worst scheduler lag %v): %v",
			n, s.converge.Round(time.Millisecond), s.cpu.Seconds(), s.schedLag.Round(time.Millisecond), err)
	}

	// (a) memory and goroutines, then (c) connections, all before the late joiner perturbs them.
	heap := b6HeapInuse()
	s.heapMiB = float64(int64(heap)-int64(heapBase)) / float64(n) / (1 << 20)
	s.goroutines = float64(runtime.NumGoroutine()-goBase) / float64(n)
	nodes := tn.Running()
	total := 0
	for _, nd := range nodes {
		total += len(nd.Host().Network().Conns())
	}
	s.conns = float64(total) / float64(len(nodes))

	// (d) late join: from the call to Add until every node running before it holds its vector.
	jctx, jcancel := context.WithTimeout(context.Background(), b6JoinDeadline)
	defer jcancel()
	jstart := time.Now()
	idx, err := tn.Add()
	if err != nil {
		b.Fatalf("N=%d: add late node: %v", n, err)
	}
	joiner := tn.Node(idx)
	err = WaitFor(jctx, b6VisiblePoll, func() bool { return b6Holders(nodes, joiner) == len(nodes) })
	s.joinVisible = time.Since(jstart)
	if err != nil {
		st := joiner.Status()
		b.Logf("sizes done so far:\n%s", done())
		b.Logf("N=%d: late node %d visible to %d/%d nodes after %v; its conns=%d topic-peers=%d published=%d synced=%d",
			n, idx, b6Holders(nodes, joiner), len(nodes), s.joinVisible.Round(time.Millisecond),
			len(joiner.Host().Network().Conns()), st.Mesh.TopicPeers, st.Announcements.Published, st.Announcements.Synced)
		b.Fatalf("N=%d: late node not visible everywhere: %v", n, err)
	}
	return s
}

// b6Holders counts the nodes among nodes that hold a fresh vector of target.
func b6Holders(nodes []*node.Node, target *node.Node) int {
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

// b6Held counts (holder, other) pairs where holder has a fresh vector of other.
func b6Held(nodes []*node.Node) int {
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

// b6Timeline samples, every b6SamplePeriod until stopped or ctx ends, how many of the
// N·(N−1) vectors are held, the connections, goroutines and heap, and the worst scheduler
// lag since the previous sample. The returned func stops sampling and returns the timeline
// and the worst scheduler lag seen.
func b6Timeline(ctx context.Context, tn *Testnet, start time.Time) func() (string, time.Duration) {
	ctx, stop := context.WithCancel(ctx)
	var maxLag, worstLag atomic.Int64
	lagDone := make(chan struct{})
	go func() { // scheduler lag probe: how late a 100 ms sleep wakes up
		defer close(lagDone)
		for ctx.Err() == nil {
			t := time.Now()
			time.Sleep(100 * time.Millisecond)
			lag := int64(time.Since(t) - 100*time.Millisecond)
			for _, m := range []*atomic.Int64{&maxLag, &worstLag} {
				for old := m.Load(); lag > old && !m.CompareAndSwap(old, lag); old = m.Load() {
				}
			}
		}
	}()
	done := make(chan []string, 1)
	go func() {
		var points []string
		tick := time.NewTicker(b6SamplePeriod)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				done <- points
				return
			case <-tick.C:
			}
			nodes := tn.Running()
			k := len(nodes)
			conns := 0
			for _, nd := range nodes {
				conns += len(nd.Host().Network().Conns())
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			points = append(points, fmt.Sprintf("%4.0fs held %5d/%-5d conns %5d goroutines %6d heap %5d MiB sched-lag %v",
				time.Since(start).Seconds(), b6Held(nodes), k*(k-1), conns, runtime.NumGoroutine(),
				ms.HeapInuse>>20, time.Duration(maxLag.Swap(0)).Round(time.Millisecond)))
		}
	}()
	return func() (string, time.Duration) {
		stop()
		points := <-done
		<-lagDone
		worst := time.Duration(worstLag.Load())
		if len(points) == 0 {
			return " (shorter than one sample)", worst
		}
		return "\n  " + strings.Join(points, "\n  "), worst
	}
}

// b6Diagnose describes why a testnet has not converged: per node, how many peers it knows
// against how many run, how many nodes know it, and its connection and topic counts.
func b6Diagnose(tn *Testnet) string {
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
	type row struct {
		score int
		text  string
	}
	var rows []row
	var conns, topic, dhtPeers []int
	for i, nd := range nodes {
		st := nd.Status()
		c := len(nd.Host().Network().Conns())
		conns = append(conns, c)
		topic = append(topic, st.Mesh.TopicPeers)
		dhtPeers = append(dhtPeers, st.Mesh.DHTPeers)
		if knows[i] < k-1 || knownBy[i] < k-1 {
			rows = append(rows, row{knows[i] + knownBy[i], fmt.Sprintf(
				"  node %-3d knows %3d/%d known-by %3d/%d conns %3d topic-peers %3d dht %3d published %d accepted %d ignored %d synced %d",
				i, knows[i], k-1, knownBy[i], k-1, c, st.Mesh.TopicPeers, st.Mesh.DHTPeers,
				st.Announcements.Published, st.Announcements.Accepted, st.Announcements.Ignored, st.Announcements.Synced)})
		}
	}
	slices.SortStableFunc(rows, func(a, b row) int { return a.score - b.score })
	var sb strings.Builder
	held := 0
	for _, x := range knows {
		held += x
	}
	fmt.Fprintf(&sb, "  %d nodes; vectors held %d/%d\n", k, held, k*(k-1))
	fmt.Fprintf(&sb, "  knows       min/med/max %s\n", b6Spread(knows))
	fmt.Fprintf(&sb, "  known-by    min/med/max %s\n", b6Spread(knownBy))
	fmt.Fprintf(&sb, "  conns       min/med/max %s\n", b6Spread(conns))
	fmt.Fprintf(&sb, "  topic-peers min/med/max %s\n", b6Spread(topic))
	fmt.Fprintf(&sb, "  dht-peers   min/med/max %s\n", b6Spread(dhtPeers))
	fmt.Fprintf(&sb, "  %d lagging nodes, worst 20:\n", len(rows))
	for _, r := range rows[:min(20, len(rows))] {
		sb.WriteString(r.text + "\n")
	}
	return sb.String()
}

func b6Spread(xs []int) string {
	if len(xs) == 0 {
		return "-"
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return fmt.Sprintf("%d/%d/%d", s[0], s[len(s)/2], s[len(s)-1])
}

// b6Settle waits until the goroutine count is back within b6SettleSlack of base, and fails
// the benchmark (a leak, docs/benchmarks.md §7.1 rule 7) if it is not by b6SettleDeadline.
func b6Settle(b *testing.B, base int, when string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), b6SettleDeadline)
	defer cancel()
	err := WaitFor(ctx, 50*time.Millisecond, func() bool { return runtime.NumGoroutine() <= base+b6SettleSlack })
	if err != nil {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		b.Fatalf("%s: still %d goroutines %v after Close, started with %d: leak?\n%s",
			when, runtime.NumGoroutine(), b6SettleDeadline, base, buf[:min(len(buf), 16<<10)])
	}
}

// b6HeapInuse returns HeapInuse after two full GCs (the second collects what the first's
// finalizers released).
func b6HeapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// b6CPU is the process's user + system CPU time.
func b6CPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func b6MS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// b6Median is the per-field median of samples (the only sample when b.N = 1).
func b6Median(samples []b6Sample) b6Sample {
	pick := func(f func(b6Sample) float64) float64 {
		xs := make([]float64, len(samples))
		for i, s := range samples {
			xs[i] = f(s)
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	dur := func(f func(b6Sample) time.Duration) time.Duration {
		return time.Duration(pick(func(s b6Sample) float64 { return float64(f(s)) }))
	}
	return b6Sample{
		heapMiB:     pick(func(s b6Sample) float64 { return s.heapMiB }),
		goroutines:  pick(func(s b6Sample) float64 { return s.goroutines }),
		converge:    dur(func(s b6Sample) time.Duration { return s.converge }),
		cpu:         dur(func(s b6Sample) time.Duration { return s.cpu }),
		schedLag:    dur(func(s b6Sample) time.Duration { return s.schedLag }),
		close:       dur(func(s b6Sample) time.Duration { return s.close }),
		conns:       pick(func(s b6Sample) float64 { return s.conns }),
		joinVisible: dur(func(s b6Sample) time.Duration { return s.joinVisible }),
	}
}
