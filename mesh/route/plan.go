package route

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/reputation"
)

// Placement of a model's layers over the mesh: the rule is in the package documentation
// ("Placement"); this file is PlanStages and what it needs.

const (
	// MaxPlanLayers bounds the layers a shape may have (the largest models have a few
	// hundred). With every estimate at most 24 h, it keeps a plan's sums far from overflow.
	MaxPlanLayers = 4096
	// DefaultStageBandwidth (about 215 GB/s) is the memory bandwidth at which a 4 GiB model
	// generates DefaultTokensPerSec (50 tokens/s): decoding reads every weight once per
	// token, so a candidate whose layer time is unknown runs a layer in
	// LayerBytes ÷ DefaultStageBandwidth.
	DefaultStageBandwidth = DefaultTokensPerSec * (4 << 30) // bytes per second
	// exactOrderStages is the most stages whose order PlanStages searches exhaustively
	// (Held–Karp, 2^8 × 8² steps); longer pipelines by moving runs of stages (relocate).
	exactOrderStages = 8
	// maxLinkStages is the most stages whose order and members measured links change:
	// longer pipelines (no mesh worth planning has them) keep peer ID order.
	maxLinkStages = 64
	// linkSeeds is how many of the links that save the most over the head's path seed a
	// search (with three stages or more): each pair is brought into the best plan so far,
	// and the seedSearches best of these plans are searched from.
	linkSeeds    = 16
	seedSearches = 4
	// swapTrials is how many of a pass's exchanges, the least by their estimate before
	// ordering again, are ordered again and costed exactly.
	swapTrials = 4
	// maxSwapPasses bounds the exchange passes of one search. Each exchange made strictly
	// lowers the estimate; searches over random meshes settle in about two passes.
	maxSwapPasses = 32
)

// StageCandidate is a node that may hold a range of a model's layers. The head (the node
// planning, which embeds the prompt and samples tokens) is not a candidate unless the
// caller gives it as one, with Delay 0.
type StageCandidate struct {
	Peer peer.ID
	// Budget is the memory it may use for this model's layers and their KV cache (bytes):
	// its mesh budget minus what it already holds.
	Budget int64
	// LayerTime is its time to run one layer for one decode position, as measured; 0 (or
	// less) is unknown: LayerBytes ÷ DefaultStageBandwidth.
	LayerTime time.Duration
	// Delay is the one-way delay between the head and it: half the measured round trip
	// (Peer.RTT ÷ 2). Negative counts as 0.
	Delay time.Duration
	// Score is its reputation score (reputation.NeutralScore for a peer without history).
	// Below reputation.ExcludeBelow (40) it is not planned.
	Score float64
	// Paused: its owner paused mesh work, or it does not accept work. It is not planned.
	Paused bool
	// Warm are the ranges of this model's layers it holds loaded now (its vector's warm
	// stages): a plan of such ranges loads nothing (see the package doc, Placement). A
	// range it holds still needs its StageBytes within Budget, which counts the range once:
	// the budget is all the node has for mesh work, and it makes room by unloading what no
	// session uses. Ranges outside the model's layers are ignored.
	Warm []LayerRange
}

// LayerRange is the layers [Lo, Hi) of a model.
type LayerRange struct{ Lo, Hi int }

// StageLink is a measured one-way delay from one candidate to another. A link PlanStages
// is not given is estimated through the head: From's Delay + To's Delay.
type StageLink struct {
	From, To peer.ID
	Delay    time.Duration // negative counts as 0
}

// PlannedStage is one stage of a plan: a peer and the contiguous layers it holds.
type PlannedStage struct {
	Peer    peer.ID
	Lo, Hi  int           // the layers [Lo, Hi)
	Bytes   int64         // memory it needs: StageBytes of Hi − Lo layers
	Compute time.Duration // (Hi − Lo) × its layer time
	// Delay is the boundary into the stage: from the head for the first, from the previous
	// stage for the others.
	Delay time.Duration
	// Warm: the peer holds these layers loaded already (one of its StageCandidate.Warm).
	Warm bool
}

// StagePlan is where a model's layers run: stages in pipeline order, Stages[0].Lo == 0,
// each stage's Hi the next one's Lo, and the last Hi the model's Layers.
type StagePlan struct {
	Stages   []PlannedStage
	Return   time.Duration // the boundary from the last stage back to the head
	PerToken time.Duration // estimated time per token: Σ Compute + Σ Delay + Return
}

// ShortfallError is PlanStages' answer when the eligible candidates cannot hold the model
// even all together. Use errors.As to read it.
type ShortfallError struct {
	Layers     int   // the model's layers (the range's, from PlanRange)
	Positions  int   // the positions planned for (the KV cache's length)
	Need       int64 // bytes of every layer and the whole KV cache: StageBytes of Layers
	Held       int   // layers the eligible candidates can hold together
	Short      int64 // bytes of the layers that do not fit: one more node this free would do
	Candidates int   // eligible candidates
	Ignored    int   // candidates left out: score below 40, or paused
}

func (e *ShortfallError) Error() string {
	return fmt.Sprintf("route: the mesh cannot hold the model: its %d layers need %s with the KV cache for %d positions, "+
		"and the %d eligible candidates (%d ignored: excluded or paused) hold %d; %d layers short: "+
		"one more node with %s free would hold them, or plan fewer positions",
		e.Layers, formatBytes(e.Need), e.Positions, e.Candidates, e.Ignored, e.Held, e.Layers-e.Held, formatBytes(e.Short))
}

// formatBytes writes n in MB under 1 GB, in GB from there (decimal units).
func formatBytes(n int64) string {
	if n < 1e9 {
		return fmt.Sprintf("%.0f MB", math.Ceil(float64(n)/1e6))
	}
	return fmt.Sprintf("%.1f GB", float64(n)/1e9)
}

// StageBytes is the memory a stage holding layers of shape's layers needs for positions
// positions: the layers' weights plus their share of the KV cache,
// layers × LayerBytes + ⌈layers × KVBytesPerToken × positions ÷ Layers⌉. Sums past
// math.MaxInt64 saturate there. layers must be in [0, shape.Layers] and shape.Layers > 0.
func StageBytes(shape inference.ModelShape, positions, layers int) int64 {
	return newMemory(shape, positions).bytes(layers)
}

// PlanStages places shape's layers on cands for a generation of positions positions (0 or
// less: the whole context window), by the rule in the package documentation ("Placement"):
// contiguous ranges within each candidate's budget, the fewest stages that fit, and among
// those the least estimated time per token; but a plan of ranges candidates hold warm, when
// there is one of that many stages, before any plan that loads layers. It ignores
// candidates scoring under 40 and paused ones. links are the measured delays between
// candidates, in any order; a link given twice counts at its least, and links that name a
// peer not eligible are ignored.
// The plan depends on the candidates and links given, not on their order.
//
// A model that fits on one candidate gets one stage: the caller may route it whole instead.
// When the eligible candidates cannot hold it together the error is a *ShortfallError. A
// shape PlanStages cannot plan (Layers outside [1, MaxPlanLayers], negative sizes) or an
// eligible peer given twice is another error.
func PlanStages(shape inference.ModelShape, positions int, cands []StageCandidate, links []StageLink) (StagePlan, error) {
	return PlanRange(shape, positions, 0, shape.Layers, cands, links)
}

// PlanRange places the layers [lo, hi) of shape on cands as PlanStages places a whole
// model, by the same rule over those layers alone: Stages[0].Lo is lo and the last Hi is
// hi. A stage's memory is the model's (StageBytes: a layer's share of the KV cache is of
// the whole model's), and the estimate counts the range's boundaries with the head as if
// it were the whole pipeline: the head sends to its first stage and hears back from its
// last. A range the candidates cannot hold gets a *ShortfallError counting the range's
// layers; a range outside [0, Layers), or empty, is another error.
//
// It plans the parts of a pipeline around a stage kept where it is (PlanAround).
func PlanRange(shape inference.ModelShape, positions, lo, hi int, cands []StageCandidate, links []StageLink) (StagePlan, error) {
	if shape.Layers < 1 || shape.Layers > MaxPlanLayers {
		return StagePlan{}, fmt.Errorf("route: cannot plan %d layers (1 to %d)", shape.Layers, MaxPlanLayers)
	}
	if shape.LayerBytes < 0 || shape.KVBytesPerToken < 0 {
		return StagePlan{}, errors.New("route: cannot plan a shape with negative sizes")
	}
	if lo < 0 || lo >= hi || hi > shape.Layers {
		return StagePlan{}, fmt.Errorf("route: cannot plan layers [%d, %d) of %d", lo, hi, shape.Layers)
	}
	if positions <= 0 {
		positions = max(shape.Context, 0)
	}
	p := planner{lo: lo, layers: hi - lo, mem: newMemory(shape, positions), cands: cands}
	index := make(map[peer.ID]int, len(cands)) // the eligible peers' item indices, once sorted
	ignored, err := p.eligible(seconds(float64(shape.LayerBytes)/DefaultStageBandwidth), index)
	if err != nil {
		return StagePlan{}, err
	}
	p.stages = p.fewestStages()
	if p.stages == 0 {
		held := 0
		for _, it := range p.items {
			held += it.cap
		}
		return StagePlan{}, &ShortfallError{
			Layers:     p.layers,
			Positions:  positions,
			Need:       p.mem.bytes(p.layers),
			Held:       held,
			Short:      p.mem.bytes(p.layers - held),
			Candidates: len(p.items),
			Ignored:    ignored,
		}
	}
	p.sort(index)
	p.addLinks(links, index)
	if chain := p.warmChain(); chain != nil {
		return p.planChain(chain), nil
	}
	return p.plan(p.search()), nil
}

// eligible fills p.items with the candidates that may hold a stage: not paused, scoring 40
// or more, with room for a layer; and index with their peers. defaultTime is the layer
// time of those whose own is unknown. It returns how many were paused or excluded.
func (p *planner) eligible(defaultTime time.Duration, index map[peer.ID]int) (ignored int, err error) {
	for i := range p.cands {
		c := &p.cands[i]
		if c.Paused || !(c.Score >= reputation.ExcludeBelow) {
			ignored++
			continue
		}
		n := min(p.mem.capacity(c.Budget), p.layers)
		if n == 0 {
			continue
		}
		if _, dup := index[c.Peer]; dup {
			return 0, fmt.Errorf("route: candidate %s given twice", c.Peer)
		}
		index[c.Peer] = len(p.items)
		t := c.LayerTime
		if t <= 0 {
			t = defaultTime
		}
		p.items = append(p.items, item{c: i, cap: n, t: int64(min(t, maxEstimate)), d: duration(c.Delay)})
	}
	return ignored, nil
}

// sort caps every capacity at what a stage can use (every other stage holds a layer at
// least), sorts the items (planner's order) and updates index.
func (p *planner) sort(index map[peer.ID]int) {
	for i := range p.items {
		p.items[i].cap = min(p.items[i].cap, p.layers-p.stages+1)
	}
	slices.SortFunc(p.items, func(a, b item) int {
		switch {
		case a.t != b.t:
			return cmp.Compare(a.t, b.t)
		case a.cap != b.cap:
			return cmp.Compare(b.cap, a.cap)
		case a.d != b.d:
			return cmp.Compare(a.d, b.d)
		}
		return cmp.Compare(p.cands[a.c].Peer, p.cands[b.c].Peer)
	})
	for j := range p.items {
		index[p.id(j)] = j
	}
}

// search returns the stages of the plan, in pipeline order. The exact plan when every
// boundary goes through the head is the answer when no link is measured. Measured links
// change what the best plan is: then a local search starts from that plan; with two stages,
// every pair joined by a measured link is costed too; with more, the links that save the
// most over the head's path seed searches of their own.
func (p *planner) search() []int {
	order := p.order(p.throughHead())
	if !p.linked || p.stages < 2 || p.stages > maxLinkStages {
		return order
	}
	order, cost := p.improve(order)
	if p.stages == 2 {
		order, _ = p.bestPair(order, cost)
		return order
	}
	// Each seed's set, ordered and costed; the seedSearches best searched further.
	type start struct {
		order []int
		cost  int64
	}
	var starts []start
	for _, pair := range p.seeds() {
		if members := p.withPair(order, pair); members != nil {
			o := p.order(members)
			starts = append(starts, start{o, p.cost(o)})
		}
	}
	slices.SortStableFunc(starts, func(a, b start) int { return cmp.Compare(a.cost, b.cost) })
	for _, s := range starts[:min(len(starts), seedSearches)] {
		if o, c := p.improve(s.order); c < cost {
			order, cost = o, c
		}
	}
	return order
}

// duration is d in nanoseconds, within [0, maxEstimate].
func duration(d time.Duration) int64 { return int64(min(max(d, 0), maxEstimate)) }

// memory is the memory model of one plan: StageBytes.
type memory struct {
	layers     int
	layerBytes int64
	kv         int64 // the KV cache of every layer for the positions (saturated)
}

func newMemory(shape inference.ModelShape, positions int) memory {
	return memory{
		layers:     shape.Layers,
		layerBytes: max(shape.LayerBytes, 0),
		kv:         satMul(max(shape.KVBytesPerToken, 0), int64(max(positions, 0))),
	}
}

// bytes is StageBytes of n layers, n in [0, layers].
func (m memory) bytes(n int) int64 {
	// n × kv < layers × 2^63, so the quotient fits in 64 bits, and is at most kv.
	hi, lo := bits.Mul64(uint64(n), uint64(m.kv))
	q, r := bits.Div64(hi, lo, uint64(m.layers))
	if r > 0 {
		q++ // r > 0 only when n < layers, and then q < kv
	}
	return satAdd(satMul(int64(n), m.layerBytes), int64(q))
}

// capacity is the most layers (at most all) whose bytes fit in budget.
func (m memory) capacity(budget int64) int {
	n := m.layers
	if per := float64(m.layerBytes) + float64(m.kv)/float64(m.layers); per > 0 {
		n = int(min(max(float64(budget)/per, 0), float64(m.layers))) // off by one at most
	}
	for n > 0 && m.bytes(n) > budget {
		n--
	}
	for n < m.layers && m.bytes(n+1) <= budget {
		n++
	}
	return n
}

func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// item is an eligible candidate. Durations are in nanoseconds, at most maxEstimate, so no
// plan's sum can overflow (MaxPlanLayers × 3 × 24 h is far below 2^63 ns).
type item struct {
	c   int   // its index in the candidates
	cap int   // layers it can hold
	t   int64 // one layer's compute
	d   int64 // one-way delay to and from the head
}

// edge is a measured link to or from item j.
type edge struct {
	j int
	d int64
}

// adjacency holds the measured links of every item: item j's are
// edges[start[j]:start[j+1]].
type adjacency struct {
	start []int
	edges []edge
}

func (a *adjacency) of(j int) []edge {
	if a.start == nil {
		return nil
	}
	return a.edges[a.start[j]:a.start[j+1]]
}

// head stands for the head where an item index is expected.
const head = -1

// planner carries one plan's inputs. items are sorted by layer time, then capacity
// descending, then head delay, then peer ID: a candidate's index depends on the set of
// candidates only. Sets of stages ("members") are indices into items in increasing order;
// orders are the same indices in pipeline order.
type planner struct {
	lo      int // the first layer planned
	layers  int // how many are: the model's, or a range's (PlanRange)
	mem     memory
	cands   []StageCandidate
	items   []item
	out, in adjacency // measured links from and to each item
	linked  bool      // some link is measured
	stages  int       // the fewest that fit
	scratch []int     // cost's
}

// id is item j's peer.
func (p *planner) id(j int) peer.ID { return p.cands[p.items[j].c].Peer }

// addLinks records the links between eligible candidates (index: their item indices), each
// at its least.
func (p *planner) addLinks(links []StageLink, index map[peer.ID]int) {
	n := len(p.items)
	type arc struct {
		from int
		e    edge
	}
	arcs := make([]arc, 0, len(links))
	var from peer.ID // the last origin looked up: links come grouped by origin, usually
	a, okA := 0, false
	for i, l := range links {
		if i == 0 || l.From != from {
			from = l.From
			a, okA = index[from]
		}
		b, okB := index[l.To]
		if okA && okB && a != b {
			arcs = append(arcs, arc{a, edge{b, duration(l.Delay)}})
		}
	}
	if len(arcs) == 0 {
		return
	}
	p.linked = true
	// Bucket by origin, keeping each link's least.
	start := make([]int, n+1)
	for _, a := range arcs {
		start[a.from+1]++
	}
	for j := range n {
		start[j+1] += start[j]
	}
	edges := make([]edge, len(arcs))
	next := slices.Clone(start[:n])
	for _, a := range arcs {
		edges[next[a.from]] = a.e
		next[a.from]++
	}
	kept := 0
	at := make([]int, n) // at[b]: where the link from j to b was kept, +1; 0 if not yet
	for j := range n {
		bucket := edges[start[j]:start[j+1]]
		first := kept
		for _, e := range bucket {
			if i := at[e.j] - 1; i >= first {
				edges[i].d = min(edges[i].d, e.d)
				continue
			}
			edges[kept] = e
			kept++
			at[e.j] = kept
		}
		start[j] = first
	}
	start[n] = kept
	p.out = adjacency{start, edges[:kept]}

	// The same links by destination.
	in := make([]int, n+1)
	for _, e := range p.out.edges {
		in[e.j+1]++
	}
	for j := range n {
		in[j+1] += in[j]
	}
	inEdges := make([]edge, kept)
	next = slices.Clone(in[:n])
	for a := range n {
		for _, e := range p.out.of(a) {
			inEdges[next[e.j]] = edge{a, e.d}
			next[e.j]++
		}
	}
	p.in = adjacency{in, inEdges}
}

// fewestStages is the fewest candidates whose capacities add up to the model's layers, or
// 0 when all of them do not: the largest capacities first, counted by capacity.
func (p *planner) fewestStages() int {
	count := make([]int, p.layers+1)
	for _, it := range p.items {
		count[it.cap]++
	}
	held, stages := 0, 0
	for c := p.layers; c > 0; c-- {
		for range count[c] {
			held += c
			stages++
			if held >= p.layers {
				return stages
			}
		}
	}
	return 0
}

// throughHead returns the best set of p.stages members when every boundary between two
// stages goes through the head (costs from.d + to.d). Then a plan's estimate is
// Σ (layers × t + 2d) over its stages, whatever their order, and a dynamic programme over
// (stages used, layers placed) finds its least exactly, in O(candidates × stages × layers).
// It skips the candidates dominated (sorted before, capacity ≥, head delay ≤) by p.stages
// others or more: a set holding one of those leaves out one of its dominators, and
// trading it in keeps the set feasible and costs no more.
func (p *planner) throughHead() []int {
	k, n := p.stages, p.layers
	var use []int
	for j := range p.items {
		dominated := 0
		for i := 0; i < j && dominated < k; i++ {
			if p.items[i].cap >= p.items[j].cap && p.items[i].d <= p.items[j].d {
				dominated++
			}
		}
		if dominated < k {
			use = append(use, j)
		}
	}

	// best[m][l]: the least Σ (layers × t + 2d) of m of the items seen so far holding l
	// layers in all, one at least each; took[x][m][l]: the layers use[x] holds there, 0 if
	// none (it is not among the m).
	const inf = math.MaxInt64
	w := n + 1
	best := make([]int64, (k+1)*w)
	for i := range best {
		best[i] = inf
	}
	best[0] = 0
	took := make([]uint16, len(use)*(k+1)*w)
	// window[lo:] holds the l' in [l − cap, l − 1] with prev[l'] finite by increasing
	// prev[l'] − l' × t: this item taking l − l' layers costs prev[l'] + (l − l') × t.
	window := make([]int, 0, w)
	for x, j := range use {
		it := p.items[j]
		for m := min(k, x+1); m >= 1; m-- {
			prev, cur := best[(m-1)*w:m*w], best[m*w:(m+1)*w]
			tk := took[(x*(k+1)+m)*w:][:w]
			window = window[:0]
			lo := 0
			for l := 1; l <= n; l++ {
				if v := prev[l-1]; v != inf {
					v -= int64(l-1) * it.t
					for len(window) > lo && prev[window[len(window)-1]]-int64(window[len(window)-1])*it.t >= v {
						window = window[:len(window)-1]
					}
					window = append(window, l-1)
				}
				if len(window) > lo && window[lo] < l-it.cap {
					lo++
				}
				if len(window) == lo {
					continue
				}
				from := window[lo]
				if c := prev[from] + int64(l-from)*it.t + 2*it.d; c < cur[l] {
					cur[l], tk[l] = c, uint16(l-from)
				}
			}
		}
	}
	members := make([]int, 0, k)
	for x, m, l := len(use)-1, k, n; m > 0; x-- {
		if t := took[(x*(k+1)+m)*w+l]; t > 0 {
			members = append(members, use[x])
			m, l = m-1, l-int(t)
		}
	}
	slices.Sort(members)
	return members
}

// bestPair returns the better of order (costing cost) and the best pair of candidates
// joined by a measured link that can hold the model, for a plan of two stages.
func (p *planner) bestPair(order []int, cost int64) ([]int, int64) {
	best := [2]int{min(order[0], order[1]), max(order[0], order[1])}
	for a := range p.items {
		ia := &p.items[a]
		for _, e := range p.out.of(a) {
			ib := &p.items[e.j]
			if ia.cap+ib.cap < p.layers {
				continue
			}
			// compute of the pair: the faster (the lower index) takes what it can.
			fast, slow := ia, ib
			if e.j < a {
				fast, slow = ib, ia
			}
			nf := min(fast.cap, p.layers-1)
			c := int64(nf)*fast.t + int64(p.layers-nf)*slow.t + ia.d + ib.d + min(e.d, p.delay(e.j, a))
			pair := [2]int{min(a, e.j), max(a, e.j)}
			if c < cost || c == cost && (pair[0] < best[0] || pair[0] == best[0] && pair[1] < best[1]) {
				order, cost, best = p.order(pair[:]), c, pair
			}
		}
	}
	return order, cost
}

// seeds returns up to linkSeeds pairs of items whose measured link saves the most over
// the path through the head (d + d − link), most first, ties by index.
func (p *planner) seeds() [][2]int {
	type seed struct {
		pair [2]int
		save int64
	}
	better := func(a, b seed) bool {
		return a.save > b.save || a.save == b.save && (a.pair[0] < b.pair[0] || a.pair[0] == b.pair[0] && a.pair[1] < b.pair[1])
	}
	top := make([]seed, 0, linkSeeds+1)
	for a := range p.items {
		for _, e := range p.out.of(a) {
			s := seed{[2]int{min(a, e.j), max(a, e.j)}, p.items[a].d + p.items[e.j].d - e.d}
			if s.save <= 0 || len(top) == linkSeeds && !better(s, top[len(top)-1]) {
				continue
			}
			if i := slices.IndexFunc(top, func(t seed) bool { return t.pair == s.pair }); i >= 0 {
				if !better(s, top[i]) {
					continue
				}
				top = slices.Delete(top, i, i+1) // the other direction saves less
			}
			i, _ := slices.BinarySearchFunc(top, s, func(t, s seed) int {
				if better(t, s) {
					return -1
				}
				return 1
			})
			top = slices.Insert(top, i, s)
			if len(top) > linkSeeds {
				top = top[:linkSeeds]
			}
		}
	}
	out := make([][2]int, len(top))
	for i, s := range top {
		out[i] = s.pair
	}
	return out
}

// withPair returns the stages of order with pair's candidates brought in, in place of
// those whose leaving keeps the model held and costs the least through the head; nil when
// both are stages already. order has three stages or more.
func (p *planner) withPair(order []int, pair [2]int) []int {
	var add, stay []int
	for _, j := range pair {
		if !slices.Contains(order, j) {
			add = append(add, j)
		}
	}
	for _, j := range order {
		if j != pair[0] && j != pair[1] {
			stay = append(stay, j)
		}
	}
	if len(add) == 0 {
		return nil
	}
	var best []int
	bestCost := int64(math.MaxInt64)
	set := make([]int, 0, len(order))
	try := func(leave1, leave2 int) { // leave2 may be head: none
		set = append(set[:0], add...)
		for _, j := range order {
			if j != leave1 && j != leave2 {
				set = append(set, j)
			}
		}
		slices.Sort(set)
		held, c := 0, p.compute(set)
		for _, j := range set {
			held += p.items[j].cap
			c += 2 * p.items[j].d
		}
		if held >= p.layers && c < bestCost {
			best, bestCost = append(best[:0], set...), c
		}
	}
	for x, a := range stay {
		if len(add) == 1 {
			try(a, head)
			continue
		}
		for _, b := range stay[x+1:] {
			try(a, b)
		}
	}
	return best
}

// fill returns each member's layers: one each, then the rest to the fastest first (item
// order), each up to its capacity. For a given set this is the least compute.
func (p *planner) fill(members []int) []int {
	rest := p.layers - len(members)
	layers := make([]int, len(members))
	for i, j := range members {
		layers[i] = 1 + min(p.items[j].cap-1, rest)
		rest -= layers[i] - 1
	}
	return layers
}

// compute is the compute time of fill's layers, without allocating.
func (p *planner) compute(members []int) int64 {
	rest := p.layers - len(members)
	var total int64
	for _, j := range members {
		it := &p.items[j]
		n := 1 + min(it.cap-1, rest)
		rest -= n - 1
		total += int64(n) * it.t
	}
	return total
}

// delay is the boundary from a to b, either of which may be the head: the head's delay to
// a candidate is its d, a link between candidates is measured or a.d + b.d.
func (p *planner) delay(a, b int) int64 {
	switch {
	case a == head && b == head:
		return 0
	case a == head:
		return p.items[b].d
	case b == head:
		return p.items[a].d
	}
	for _, e := range p.out.of(a) {
		if e.j == b {
			return e.d
		}
	}
	return p.items[a].d + p.items[b].d
}

// cost is the estimate of the plan with stages order: fill's compute and the boundaries.
func (p *planner) cost(order []int) int64 {
	p.scratch = append(p.scratch[:0], order...)
	slices.Sort(p.scratch)
	total, prev := p.compute(p.scratch), head
	for _, j := range order {
		total += p.delay(prev, j)
		prev = j
	}
	return total + p.delay(prev, head)
}

// order returns the stages of start in the pipeline order of least boundary delay it finds.
// Without measured links every order costs the same, and stages go in peer ID order. With
// them, up to exactOrderStages stages are ordered exactly (peer ID order when it is among
// the best), up to maxLinkStages by moving runs of stages from start, and longer ones keep
// peer ID order.
func (p *planner) order(start []int) []int {
	order := slices.Clone(start)
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(p.id(a), p.id(b)) })
	k := len(order)
	if !p.linked || k < 2 || k > maxLinkStages {
		return order
	}
	// dist[a*w+b]: the boundary from node a to node b, node 0 the head and node x+1 order[x].
	w := k + 1
	dist := make([]int64, w*w)
	for a := range w {
		for b := range w {
			if a != b {
				dist[a*w+b] = p.delay(at(order, a), at(order, b))
			}
		}
	}
	var perm []int // perm[x]: the index in order of the x-th stage
	if k <= exactOrderStages {
		perm = heldKarp(dist, k)
	} else {
		perm = make([]int, 0, k)
		for _, j := range start {
			perm = append(perm, slices.Index(order, j))
		}
		relocate(perm, dist)
	}
	out := make([]int, k)
	for x, i := range perm {
		out[x] = order[i]
	}
	return out
}

// at is node y of a path: the head for y = 0, order[y−1] otherwise.
func at(order []int, y int) int {
	if y == 0 {
		return head
	}
	return order[y-1]
}

// heldKarp returns the order of k members (member x being node x+1 of dist) whose path
// head → every member → head is shortest; the identity when it is among the shortest.
func heldKarp(dist []int64, k int) []int {
	w := k + 1
	full := 1<<k - 1
	// cost[mask*k+last]: the shortest path from the head through mask's members, ending at
	// last; prev: the member before last there (-1: none).
	cost := make([]int64, (full+1)*k)
	prev := make([]int8, (full+1)*k)
	for i := range cost {
		cost[i] = math.MaxInt64
	}
	for last := range k {
		cost[(1<<last)*k+last], prev[(1<<last)*k+last] = dist[last+1], -1
	}
	for mask := 1; mask <= full; mask++ {
		for last := range k {
			c := cost[mask*k+last]
			if c == math.MaxInt64 {
				continue
			}
			for next := range k {
				if mask&(1<<next) != 0 {
					continue
				}
				i := (mask|1<<next)*k + next
				if nc := c + dist[(last+1)*w+next+1]; nc < cost[i] {
					cost[i], prev[i] = nc, int8(last)
				}
			}
		}
	}
	last, best := 0, int64(math.MaxInt64)
	for x := range k {
		if c := cost[full*k+x] + dist[(x+1)*w]; c < best {
			last, best = x, c
		}
	}
	perm := make([]int, k)
	for x := range perm {
		perm[x] = x
	}
	if pathCost(perm, dist) == best {
		return perm
	}
	for mask, x := full, k-1; x >= 0; x-- {
		perm[x] = last
		mask, last = mask&^(1<<last), int(prev[mask*k+last])
	}
	return perm
}

// relocate shortens the path perm (over dist, member x being node x+1) in place by moving
// a run of consecutive stages elsewhere, keeping its direction, while that strictly
// shortens the path: at most 100 sweeps of O(k³) moves each.
func relocate(perm []int, dist []int64) {
	k := len(perm)
	w := k + 1
	d := func(a, b int) int64 { return dist[a*w+b] }
	path := make([]int, 0, k+2) // the nodes: the head, the stages, the head
	path = append(path, 0)
	for _, x := range perm {
		path = append(path, x+1)
	}
	path = append(path, 0)
	for range 100 {
		improved := false
	sweep:
		for i := 1; i <= k; i++ {
			for j := i; j <= k && j-i+1 < k; j++ { // the run path[i..j]
				first, last := path[i], path[j]
				gain := d(path[i-1], first) + d(last, path[j+1]) - d(path[i-1], path[j+1])
				for y := 0; y <= k; y++ { // to between path[y] and path[y+1]
					if y >= i-1 && y <= j {
						continue // where it is
					}
					if d(path[y], first)+d(last, path[y+1])-d(path[y], path[y+1]) >= gain {
						continue
					}
					run := slices.Clone(path[i : j+1])
					path = slices.Delete(path, i, j+1)
					if y > j {
						y -= len(run)
					}
					path = slices.Insert(path, y+1, run...)
					improved = true
					break sweep
				}
			}
		}
		if !improved {
			break
		}
	}
	for x := range perm {
		perm[x] = path[x+1] - 1
	}
}

// pathCost is the path head → perm → head over dist (member x is node x+1).
func pathCost(perm []int, dist []int64) int64 {
	w := len(perm) + 1
	total, prev := int64(0), 0
	for _, x := range perm {
		total += dist[prev*w+x+1]
		prev = x + 1
	}
	return total + dist[prev*w]
}

// improve searches, from order, for a plan of as many stages that measured links make
// faster: each pass tries every exchange of one stage for a candidate outside the plan,
// placed on its cheapest boundary, makes the best exchange if it strictly lowers the
// estimate, and orders the stages again. It stops when no exchange helps, and returns the
// order found and its estimate.
func (p *planner) improve(order []int) ([]int, int64) {
	k := len(order)
	pos := make([]int, len(p.items)) // pos[j]: the node of item j in the path (0: none)
	members := make([]int, 0, k)
	swapped := make([]int, 0, k)
	// The path's nodes are 0 (the head) and x+1 (stage x): at(order, y) is node y.
	edge := make([]int64, k+1) // edge[y]: the boundary from node y to the next (the head after the last)
	bridge := make([]int64, k) // bridge[x]: the boundary closing the path without stage x
	into := make([]int64, k+1) // into[y]: from node y to the candidate
	from := make([]int64, k+1) // from[y]: from the candidate to node y
	top := make([]move, 0, swapTrials+1)
	cur := p.cost(order)
	for range maxSwapPasses {
		clear(pos)
		held, least := 0, p.layers // the stages' capacity, and the least of one stage
		for x, j := range order {
			pos[j] = x + 1
			held += p.items[j].cap
			least = min(least, p.items[j].cap)
		}
		members = append(members[:0], order...)
		slices.Sort(members)
		tour := int64(0)
		for y := range k + 1 {
			edge[y] = p.delay(at(order, y), at(order, (y+1)%(k+1)))
			tour += edge[y]
		}
		for x := range k {
			bridge[x] = p.delay(at(order, x), at(order, (x+2)%(k+1)))
		}

		top = top[:0]
		for j := range p.items {
			if pos[j] > 0 || held-least+p.items[j].cap < p.layers {
				continue // a stage, or too small to replace any
			}
			dj := p.items[j].d
			into[0], from[0] = dj, dj
			for y := 1; y <= k; y++ {
				into[y] = p.items[order[y-1]].d + dj
				from[y] = into[y]
			}
			for _, e := range p.in.of(j) {
				if pos[e.j] > 0 {
					into[pos[e.j]] = e.d
				}
			}
			for _, e := range p.out.of(j) {
				if pos[e.j] > 0 {
					from[pos[e.j]] = e.d
				}
			}
			for x := range k { // j replaces stage x (node x+1)
				if held-p.items[order[x]].cap+p.items[j].cap < p.layers {
					continue
				}
				swapped = swapped[:0]
				for _, m := range members {
					if m == order[x] {
						continue
					}
					if j < m && (len(swapped) == 0 || swapped[len(swapped)-1] < j) {
						swapped = append(swapped, j)
					}
					swapped = append(swapped, m)
				}
				if len(swapped) < k {
					swapped = append(swapped, j)
				}
				// The path without node x+1, then j on its cheapest boundary.
				base := p.compute(swapped) + tour - edge[x] - edge[x+1] + bridge[x]
				mv := move{cost: math.MaxInt64, out: x, with: j}
				for y := range k + 1 {
					if y == x+1 {
						continue
					}
					next, d := (y+1)%(k+1), edge[y]
					if y == x {
						next, d = (x+2)%(k+1), bridge[x]
					}
					if c := base + into[y] + from[next] - d; c < mv.cost {
						mv.cost, mv.after = c, y
					}
				}
				top = keepLeast(top, mv)
			}
		}
		// The trials, each ordered again: the new path is order without stage out, with j
		// after node after (one less past out).
		var best []int
		bestCost := cur
		for _, mv := range top {
			next := slices.Delete(slices.Clone(order), mv.out, mv.out+1)
			after := mv.after
			if after > mv.out {
				after--
			}
			next = p.order(slices.Insert(next, after, mv.with))
			if c := p.cost(next); c < bestCost {
				best, bestCost = next, c
			}
		}
		if best == nil {
			break
		}
		order, cur = best, bestCost
	}
	return order, cur
}

// move is an exchange: stage out leaves, candidate with comes in after node after of the
// path without out, for an estimate of cost before ordering the stages again.
type move struct {
	cost             int64
	out, with, after int
}

// keepLeast adds mv to top, the swapTrials least moves, in order of cost (the first found
// first among equals).
func keepLeast(top []move, mv move) []move {
	if len(top) == swapTrials && mv.cost >= top[len(top)-1].cost {
		return top
	}
	i := len(top)
	for i > 0 && top[i-1].cost > mv.cost {
		i--
	}
	top = slices.Insert(top, i, mv)
	return top[:min(len(top), swapTrials)]
}

// plan writes order as a StagePlan: fill's layers, assigned in pipeline order.
func (p *planner) plan(order []int) StagePlan {
	members := slices.Sorted(slices.Values(order))
	filled := p.fill(members)
	layers := make([]int, len(order))
	for i, j := range order {
		layers[i] = filled[slices.Index(members, j)]
	}
	return p.write(order, layers)
}

// write is the StagePlan of the items order, in pipeline order, holding layers[i] layers
// each from the planner's first layer on.
func (p *planner) write(order, layers []int) StagePlan {
	out := StagePlan{Stages: make([]PlannedStage, 0, len(order))}
	lo, prev := p.lo, head
	for i, j := range order {
		it := &p.items[j]
		n := layers[i]
		s := PlannedStage{
			Peer:    p.id(j),
			Lo:      lo,
			Hi:      lo + n,
			Bytes:   p.mem.bytes(n),
			Compute: time.Duration(int64(n) * it.t),
			Delay:   time.Duration(p.delay(prev, j)),
			Warm:    slices.Contains(p.cands[it.c].Warm, LayerRange{lo, lo + n}),
		}
		out.Stages = append(out.Stages, s)
		out.PerToken += s.Compute + s.Delay
		lo, prev = s.Hi, j
	}
	out.Return = time.Duration(p.delay(prev, head))
	out.PerToken += out.Return
	return out
}
