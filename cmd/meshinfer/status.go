package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
	"github.com/meshinfer/meshinfer/node"
	"github.com/meshinfer/meshinfer/node/console"
)

// statusTimeout bounds the whole status query: the console is local and answers at once.
const statusTimeout = 5 * time.Second

// maxConsoleBody bounds what status reads from a console (4096 peers of ~2 KiB each).
const maxConsoleBody = 16 << 20

func runStatus(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status", "Show a running node's status, read from its local console.", stderr)
	addr := fs.String("console", node.DefaultConsoleAddr, "the node's console address")
	asJSON := fs.Bool("json", false, "print the raw JSON of /api/status and /api/peers, for scripts")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	base := "http://" + *addr
	var st console.Status
	if err := getJSON(ctx, base+"/api/status", &st); err != nil {
		return fmt.Errorf("%w\nis a node running? start one with 'meshinfer node', or point --console at its console", err)
	}
	var peers console.Peers
	if err := getJSON(ctx, base+"/api/peers", &peers); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Status console.Status `json:"status"`
			Peers  []console.Peer `json:"peers"`
		}{st, peers.Peers})
	}
	renderStatus(stdout, st, peers.Peers)
	return nil
}

// migrationWords says one gate decision: what the gate chose for which model after how
// many tokens, its estimate, and what happened.
func migrationWords(d console.MigrationDecision) string {
	s := fmt.Sprintf("%s: %s after %d tokens (estimated %s", d.Model, d.Choice, d.Inputs.Generated, msWords(d.EstimateMS))
	if cloud, ok := d.OptionsMS["restart_cloud"]; ok && d.Choice != "restart_cloud" {
		s += ", the cloud " + msWords(cloud)
	}
	s += ")"
	if d.Outcome == "running" {
		return s + ", running"
	}
	return fmt.Sprintf("%s, %s in %s", s, d.Outcome, msWords(d.TookMS))
}

// msWords is a duration in milliseconds in words: "850 ms", "3.9 s".
func msWords(ms float64) string {
	if ms < 1000 {
		return fmt.Sprintf("%.0f ms", ms)
	}
	return fmt.Sprintf("%.1f s", ms/1000)
}

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the console: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxConsoleBody)).Decode(v); err != nil {
		return fmt.Errorf("GET %s: bad JSON: %w", url, err)
	}
	return nil
}

func renderStatus(w io.Writer, st console.Status, peers []console.Peer) {
	ready := "bootstrapping"
	if st.Ready {
		ready = "ready"
	}
	fmt.Fprintf(w, "node      %s (%s)\n", st.NodeID, ready)
	fmt.Fprintf(w, "version   %s   roles %s   up %s\n", st.Version, strings.Join(st.Roles, ","), (time.Duration(st.UptimeS) * time.Second).String())
	fmt.Fprintf(w, "mesh      %s: %d known (%d stale), %d connected, %d on the caps topic, %d in the DHT\n",
		st.Mesh.Name, st.Mesh.PeersKnown, st.Mesh.PeersStale, st.Mesh.PeersConnected, st.Mesh.TopicPeers, st.Mesh.DHTPeers)
	if st.Mesh.PeersPending > 0 {
		fmt.Fprintf(w, "          %d more pending: heard of through others, not yet connected to, not routed to\n", st.Mesh.PeersPending)
	}
	a := st.Announcements
	fmt.Fprintf(w, "announce  %d published; received %d accepted, %d rejected, %d ignored (%d over their author's rate)\n",
		a.Published, a.Accepted, a.Rejected, a.Ignored, a.RateLimited)
	if r := a.Refused; r.OverBudget+r.Unreachable+r.Full+a.Dropped > 0 {
		fmt.Fprintf(w, "          refused %d new identities over their source's budget, %d of unreachable peers, %d for lack of room; dropped %d unreachable peers\n",
			r.OverBudget, r.Unreachable, r.Full, a.Dropped)
	}
	p := st.Participation
	consent := "no consent recorded (contributes nothing; run 'meshinfer consent')"
	if p.Consent.WordingChanged {
		consent = "consent wording changed: run 'meshinfer consent' again (contributes nothing and uses no cloud until then)"
	}
	if p.Consent.Given {
		consent = fmt.Sprintf("consent v%d given %s: run locally %s, contribute %s, cloud %s", p.Consent.Version, p.Consent.GivenAt,
			yesNo(p.Consent.RunLocal), yesNo(p.Consent.Contribute), yesNo(p.Consent.CloudFallback))
	}
	fmt.Fprintf(w, "contrib   %s, profile %s; %s\n", admissionWords(p.Admission, p.Reasons), p.Profile, consent)
	th := p.Thresholds
	fmt.Fprintf(w, "          pauses below %d%% battery%s, above %s heat%s; %s\n",
		th.BatteryMinLevel, cond(th.RequireCharging, " or when not charging", ""), th.ThermalMaxState,
		cond(th.PauseOnMetered, ", on metered networks", ""),
		cond(th.MaxTasksPerMin > 0, fmt.Sprintf("at most %d tasks a minute", th.MaxTasksPerMin), "no tasks-per-minute limit"))
	fmt.Fprintf(w, "          mesh traffic %s in the last hour, %s; %s\n", formatBytes(p.MeshBytesLastHour),
		cond(th.MaxBytesPerHour > 0, "at most "+formatBytes(th.MaxBytesPerHour), "no cap"),
		cond(th.MaxMemoryShare > 0, fmt.Sprintf("memory for mesh work at most %d%% of what was free at start", th.MaxMemoryShare), "no memory share cap"))
	r := st.Routing
	fmt.Fprintf(w, "routing   served here %d, by peers %d, by the cloud %d, no target %d; local-only %d served, %d refused\n",
		r.Requests.Local, r.Requests.Mesh, r.Requests.Cloud, r.Requests.NoTarget, r.LocalOnly.Served, r.LocalOnly.Refused)
	fmt.Fprintf(w, "          %d failovers, %d resumed streams; speculative cloud %d started, %d cancelled (local ready first), %d kept\n",
		r.Failovers, r.Resumptions, r.Speculative.Started, r.Speculative.Cancelled, r.Speculative.Kept)
	v := r.Verification
	fmt.Fprintf(w, "          verified %d sampled: %d passed, %d failed (a liar penalized), %d inconclusive, %d skipped (%d with no vetted voter)\n",
		v.Sampled, v.Passed, v.Failed, v.Inconclusive, v.Skipped, v.SkippedUnvetted)
	if v.StagesIsolated+v.StagesInconclusive > 0 {
		fmt.Fprintf(w, "          outvoted pipelines' stages: %d isolated, %d of them convicted (a lying stage penalized), %d inconclusive\n",
			v.StagesIsolated, v.StagesConvicted, v.StagesInconclusive)
	}
	if pl := st.Pipelines; pl.Headed+pl.OpenFailed+pl.StageRefused > 0 || pl.StageSessions+len(pl.Recent)+len(pl.Sessions) > 0 {
		fmt.Fprintf(w, "pipeline  headed %d (%d failed to set up); running %d stage sessions for heads now, %d refused\n",
			pl.Headed, pl.OpenFailed, pl.StageSessions, pl.StageRefused)
		for _, hp := range pl.Recent {
			fmt.Fprintf(w, "          %s\n", headedWords(hp))
		}
		for _, s := range pl.Sessions {
			fmt.Fprintf(w, "          %s\n", sessionWords(s))
		}
	}
	if m := st.Migration; len(m.Recent) > 0 {
		n := m.Decisions["replay"] + m.Decisions["restart_peer"] + m.Decisions["restart_cloud"] + m.Decisions["live_transfer"] + m.Decisions["none"]
		fmt.Fprintf(w, "migration %d cut streams: %d replayed, %d restarted on a peer, %d restarted in the cloud, %d moved live, %d could not go on; the last %d:\n",
			n, m.Decisions["replay"], m.Decisions["restart_peer"], m.Decisions["restart_cloud"], m.Decisions["live_transfer"], m.Decisions["none"], len(m.Recent))
		for _, d := range m.Recent {
			fmt.Fprintf(w, "          %s\n", migrationWords(d))
		}
	}
	if wr := st.WebRTC; wr != nil {
		accepts := "answers peers' set-ups"
		if !wr.Accepting {
			accepts = "answers no peer's set-up (--webrtc-accept)"
		}
		fmt.Fprintf(w, "webrtc    %d paths open, %d channels; %d requests over WebRTC (%d on a warm path), %d fell back to libp2p; %d set-ups failed; %s\n",
			wr.Open, wr.Streams, wr.Dispatched, wr.WarmHits, wr.Fallbacks, wr.SetupFailures, accepts)
	}
	for _, addr := range st.ListenAddrs {
		fmt.Fprintf(w, "listen    %s\n", addr)
	}
	if c := st.Capability; c != nil {
		fmt.Fprintf(w, "this node %s\n", describe(c))
	}
	fmt.Fprintln(w)
	if len(peers) == 0 {
		fmt.Fprintln(w, "no peers known yet")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tSTATE\tAGE\tSCORE\tCAPABILITY")
	for _, p := range peers {
		state := "connected" + linkWords(p.Conns)
		switch {
		case p.Stale:
			state = "stale"
		case !p.Connected:
			state = "via mesh"
		}
		score := fmt.Sprintf("%.0f", p.Score)
		if p.Excluded {
			score += " (excluded)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0fs\t%s\t%s\n", shortID(p.PeerID), state, p.AgeS, score, describe(p.Capability))
	}
	tw.Flush()
}

// headedWords says a pipeline this node heads or headed in words: "synth-large: node
// 12D3KooW…a1b2c3 layers 0-7 (12.0 ms/step) -> node 12D3KooW…d4e5f6 layers 8-15 (11.0
// ms/step), 3 hops 0.30 ms/step, 35 steps of 23.5 ms, running".
func headedWords(hp console.HeadedPipeline) string {
	stages := make([]string, len(hp.Stages))
	for i, s := range hp.Stages {
		stages[i] = fmt.Sprintf("node %s layers %d-%d", shortID(s.Peer), s.Lo, s.Hi-1)
		if s.ForwardMS != nil {
			stages[i] += fmt.Sprintf(" (%s ms/step)", formatMS(*s.ForwardMS))
		}
	}
	words := hp.Model + ": " + strings.Join(stages, " -> ")
	if hp.HopsMS != nil {
		words += fmt.Sprintf(", %d hops %s ms/step", len(hp.Stages)+1, formatMS(*hp.HopsMS))
	}
	words += fmt.Sprintf(", %d steps", hp.Steps)
	if hp.Steps > 0 {
		words += " of " + formatMS(hp.StepMS) + " ms"
	}
	switch {
	case hp.Failure != "":
		return words + ", failed: " + hp.Failure
	case hp.Open:
		return words + ", running"
	}
	return words + ", ended"
}

// sessionWords says a stage session this node runs in words: "stage 2 of 2 for
// 12D3KooW…a1b2c3: synth-large layers 8-15, 12 steps of 11.0 ms".
func sessionWords(s console.StageSession) string {
	words := fmt.Sprintf("stage %d of %d for %s: %s layers %d-%d, %d steps", s.Index+1, s.Stages, shortID(s.Head), s.Model, s.Lo, s.Hi-1, s.Steps)
	if s.Steps > 0 {
		words += " of " + formatMS(s.ForwardMS) + " ms"
	}
	return words
}

// formatMS writes milliseconds with three significant digits or so: 0.30, 12.0, 235.
func formatMS(ms float64) string {
	switch {
	case ms >= 100:
		return fmt.Sprintf("%.0f", ms)
	case ms >= 10:
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.2f", ms)
}

// linkWords names what a peer's connections run on: " (tcp+yamux)", " (quic)", " (tcp+yamux,
// relayed)"; several connections are joined with "; ".
func linkWords(conns []console.Conn) string {
	var parts []string
	for _, c := range conns {
		w := strings.TrimSuffix(c.Transport, "-v1")
		switch {
		case c.Muxer == "":
		case strings.Contains(c.Muxer, "yamux"):
			w += "+yamux"
		default:
			w += "+" + c.Muxer
		}
		if c.Limited {
			w += ", relayed"
		}
		parts = append(parts, w)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// reasonWords says each participation reason in words.
var reasonWords = map[string]string{
	"battery_low":    "battery below the floor",
	"not_charging":   "not charging",
	"thermal":        "running hot",
	"app_background": "app in the background",
	"metered":        "on a metered network",
	"bandwidth_cap":  "at its mesh traffic cap for the hour",
	"rate_limited":   "at its tasks-per-minute limit",
	"no_consent":     "no consent to contribute",
	"sensors_silent": "sensors not answering",
	"profile_off":    "profile off",
}

func admissionWords(admission string, reasons []string) string {
	if admission == "accepting" && len(reasons) == 0 {
		return "accepting work from peers"
	}
	words := make([]string, 0, len(reasons))
	for _, r := range reasons {
		if w, ok := reasonWords[r]; ok {
			words = append(words, w)
		} else {
			words = append(words, r)
		}
	}
	if admission == "accepting" {
		return "accepting work from peers (" + strings.Join(words, ", ") + ")"
	}
	return "paused: " + strings.Join(words, ", ")
}

func yesNo(b bool) string { return cond(b, "yes", "no") }

func cond(b bool, yes, no string) string {
	if b {
		return yes
	}
	return no
}

// describe renders a vector in one line for people.
func describe(c *caps.Vector) string {
	if c == nil {
		return "-"
	}
	parts := []string{
		fmt.Sprintf("%d× %s", c.CPU.Cores, c.CPU.Arch),
		fmt.Sprintf("%.1f/%.1f GiB free", float64(c.RAM.FreeMB)/1024, float64(c.RAM.TotalMB)/1024),
	}
	if c.GPU != nil {
		parts = append(parts, fmt.Sprintf("gpu %s %s", c.GPU.Vendor, c.GPU.Model))
	}
	if n := len(c.GPUs); n > 1 {
		parts = append(parts, fmt.Sprintf("%d gpus", n))
	}
	if c.Battery.Present {
		b := fmt.Sprintf("battery %.0f%%", c.Battery.Level*100)
		if c.Battery.Charging {
			b += " charging"
		}
		parts = append(parts, b)
	} else {
		parts = append(parts, "mains")
	}
	parts = append(parts, "thermal "+c.Thermal, fmt.Sprintf("rtt %.2fms", c.Net.RTTMS))
	if len(c.Models) == 0 {
		parts = append(parts, "no models")
	} else {
		var names []string
		for _, m := range c.Models {
			names = append(names, m.Name)
		}
		parts = append(parts, "models "+strings.Join(names, ","))
	}
	return strings.Join(parts, ", ")
}

func shortID(id string) string {
	if len(id) <= 16 {
		return id
	}
	return id[:8] + "…" + id[len(id)-6:]
}
