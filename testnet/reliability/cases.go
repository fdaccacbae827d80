package main

import "time"

// Case is one case of the reliability catalogue.
type Case struct {
	ID   string // L1-L6, F1-F19, Z1-Z12, as the catalogue numbers them
	Name string // one line
	// Measured says what the tests measure; Goal the figure they must reach: the catalogue's
	// as written, or, marked "short:", the replacement the tests assert (docs/reliability.md
	// says why and what is missing).
	Measured, Goal string
	Runs           []Run
	// Missing says what is not built: for a case without Runs, everything its goal needs.
	Missing string
}

// Run is one `go test` of a case: a package, its top-level tests (-run '^(A|B)$'), build
// tags, -race, and a timeout that fails loudly instead of hanging.
type Run struct {
	Pkg     string
	Tests   []string
	Tags    string
	Race    bool
	Timeout time.Duration
}

// Timeouts: unit tests and fuzz seeds take seconds; the testnet's take up to a minute each
// under -race on 2 cores.
const (
	short = 2 * time.Minute
	long  = 10 * time.Minute
)

func race(pkg string, timeout time.Duration, tests ...string) Run {
	return Run{Pkg: pkg, Tests: tests, Race: true, Timeout: timeout}
}

func plain(pkg string, timeout time.Duration, tests ...string) Run {
	return Run{Pkg: pkg, Tests: tests, Timeout: timeout}
}

// seeds runs fuzz targets on their seed corpus (and, with -fuzztime, fuzzes each).
func seeds(pkg string, targets ...string) Run {
	return Run{Pkg: pkg, Tests: targets, Timeout: short}
}

// Cases is the table of all 37 cases, in the catalogue's order.
func Cases() []Case {
	return []Case{
		{
			ID: "L1", Name: "256 WebSocket clients",
			Measured: "256 clients × 4 requests through a coordinator to 4 peers (no -race)",
			Goal:     "short: every admitted request completes once and is metered once; the excess gets overloaded, faster than completions at the median; goroutines back after close (no p99 TTFT, RSS or rcmgr polling yet)",
			Runs:     []Run{{Pkg: "./transport/gateway/client/", Tests: []string{"TestSoakLoad256Clients"}, Tags: "soak", Timeout: long}},
		},
		{
			ID: "L2", Name: "stream storm",
			Measured: "one peer opening streams it never reads",
			Goal:     "short: refused before it holds 256 streams (limitPeerStreamsIn), every window accounted in its scope (no honest traffic, p99 or heap measured)",
			Runs:     []Run{race("./node/", short, "TestResourceManagerBoundsPeerStreams")},
		},
		{
			ID: "L3", Name: "connection storm",
			Measured: "peers on 127.0.0.2 with the loopback exemption overridden",
			Goal:     "short: ≤ 8 connections per IPv4 address, another address served; bootstrap peers allowlisted (no 300-key storm, no first-try figure over 20 runs)",
			Runs:     []Run{race("./node/", short, "TestConnectionCapPerIP", "TestBootstrapPeersAllowlisted")},
		},
		{
			ID: "L4", Name: "soak",
			Measured: "a router's streaming requests at 20 req/s to 6 serving peers (T1, no -race: under it this machine sends 9 req/s), each bringing a peer fault with 5 % chance, a kill (replaced at once; held as a stall while three killed peers are still fresh) and a 4 s stall in turn; heap fitted for 2 min after the catalogue's 2 min warm-up (not 2 min in all: a shorter warm-up fits GossipSub's 2 min caches filling) (the catalogue's 10 min: `go test -tags soak -count=1 -timeout 20m -run '^TestSoakL4$' -v ./testnet/`)",
			Goal:     "heap slope ≤ 0.5 MiB/min after the warm-up (least squares); goroutines ±2 % and FDs ±10, end against the warm-up's end; reputation entries ≤ cap (4096); ≥ 99 % success, each request ending once, with ≥ 1 healthy peer always",
			Runs:     []Run{{Pkg: "./testnet/", Tests: []string{"TestSoakL4Short"}, Tags: "soak", Timeout: long}},
		},
		{
			ID: "L5", Name: "announcement fan-out",
			Measured: "real hosts on a simulated WAN (x/simlibp2p, 20-240 ms round trips) under synctest, GossipSub as the node sets it up, the real announcer and validator: 16 nodes for 100 virtual s (-race), and 50 nodes announcing every 10 s for 10 virtual min (soak tag, no -race)",
			Goal:     "≥ 99.9 % of (announcement, subscriber) pairs delivered; p99 publish → delivery ≤ 3 GossipSub heartbeats (3 s); mean duplicates per delivery ≤ 6 (D) in the 50-node soak run; short: the 16-node run bounds them only by its mean mesh degree (7.5-8 peers, 6.1-6.6 duplicates); zero validation-queue drops",
			Runs: []Run{race("./mesh/announce/", short, "TestAnnouncementFanOutL5"),
				{Pkg: "./mesh/announce/", Tests: []string{"TestAnnouncementFanOutL5Soak"}, Tags: "soak", Timeout: long}},
		},
		{
			ID: "L6", Name: "max-size inputs",
			Measured: "32 bodies at the 256 KiB limit and 32 one byte over, at once; bytes read of an over-limit body",
			Goal:     "short: limit-size all finish; over-limit refused (HTTP 413) after reading ≤ limit + 16 bytes (heap growth not measured)",
			Runs:     []Run{race("./transport/openai/", short, "TestMaxSizeBodiesConcurrent", "TestBodyLimitReads", "TestBodyLimit")},
		},
		{
			ID: "F1", Name: "peer killed or frozen mid-stream",
			Measured: "in process (kill, freeze, no alternative) and real processes (SIGKILL over TCP and QUIC, SIGSTOP)",
			Goal:     "short (one run per variant, not 100 seeded): output identical to the reference; frozen stream reset ≤ inter-token timeout + 0.5 s; no alternative: typed error ≤ timeout + 1 s, never a hang",
			Runs: []Run{race("./testnet/", long, "TestStreamResumesAfterPeerKilled", "TestNoAlternativeLeftGivesPeerLost",
				"TestStreamResumesAfterPeerFrozen", "TestFrozenPeerWithoutAlternativeTimesOut",
				"TestProcsStreamResumesAfterSIGKILL", "TestProcsFrozenPeerIsDetected")},
		},
		{
			ID: "F2", Name: "partition and heal",
			Measured: "1 of 4 nodes cut off past the forget period (heartbeat 1 s), then healed",
			Goal:     "short ({1 | 3}, not {3 | 3}): stale, no vector issued after the cut crossing it; fresh again after the heal; node 3 serving again within 100 requests; no score below 40 (times measured, not asserted)",
			Runs: []Run{race("./testnet/", long, "TestPartitionAndHeal"),
				race("./mesh/announce/", short, "TestLateMessageAfterPartitionIsNoRollback")},
		},
		{
			ID: "F3", Name: "slow peer",
			Measured: "the catalogue's 500 requests at 1/s to three peers, one behind a latency toxic (3 s round trip against the 1 s TTFT timeout) or a bandwidth toxic (first token 0.8 s) until request 250, against the real reputation store on virtual time, 32 random sources each; real nodes: a peer behind 150 ms each way among two quick ones (120 requests, then the delay removed), a slow backend among quick ones, a peer behind 50 ms each way",
			Goal:     "the slow peer ≤ ε + 2 % (7 %) of requests after the first 50 (real nodes: after 20); score ≥ 40; p99 ≤ TTFT timeout + 2× baseline; share ≥ 25 % again within 5 min of the toxic's removal via the stale-peer boost, every run (changed for the latency toxic: within 6 min, 5 min in 30 of 32 runs: its timeouts' score debit weighs it down once its penalty clears); real nodes: 5 of 20 requests in a row after the delay is removed",
			Runs: []Run{race("./mesh/route/", short, "TestSlowPeerF3Virtual"),
				race("./testnet/", long, "TestSlowPeerF3", "TestSlowPeerGetsLessWork", "TestLinkDelay", "TestLinkProxyFaults")},
		},
		{
			ID: "F4", Name: "slowloris",
			Measured: "64 connections trickling a header (synctest); connections over the per-address cap; a stalled WebSocket message",
			Goal:     "short: cut within the header deadline + 1 s; connection count back to before; honest requests undelayed in virtual time; over-cap refused (honest p99 ±20 % on real loopback is make bench's BenchmarkHonestUnderSlowloris)",
			Runs: []Run{race("./transport/", short, "TestSlowlorisHeaderCut", "TestConnsPerIPOnLoopback"),
				race("./node/console/", short, "TestConnsPerIPCap", "TestSlowHeaderIsCut"),
				race("./transport/openai/", short, "TestAPISlowAndGreedyClients"),
				race("./transport/gateway/", short, "TestWSStalledMessageIsCut")},
		},
		{
			ID: "F5", Name: "clock skew",
			Measured: "signers' clocks −10…+10 min; the local clock stepping back",
			Goal:     "short: skew ≤ 5 min accepted, beyond refused as clock_skew (Ignore, no penalty); cooldowns never shortened by a clock step (no ±1 h jump figure)",
			Runs: []Run{race("./mesh/caps/", short, "TestVerifyClockSkewF5", "TestVerifyTimeWindow"),
				race("./reputation/", short, "TestCooldownNeverShortensWhenClockStepsBack")},
		},
		{
			ID: "F6", Name: "lying peer",
			Measured: "a liar among honest peers; hundreds of honest verified tasks; a liar's metering",
			Goal:     "short: liar excluded after one verified task; honest peers never penalized; liar's failed tasks metered 0 (not 200 seeded runs per liar kind)",
			Runs: []Run{race("./testnet/", long, "TestLiarIsExcludedAfterOneVerifiedTask", "TestLiarClaimingNondeterminismIsCaught",
				"TestHonestPeersPassEveryVerification", "TestCoordinatorMetersReceiptsAndLiarAsZero"),
				plain("./node/dispatch/", long, "TestHonestPeersPassThousandsOfVerifications")},
		},
		{
			ID: "F7", Name: "spoofed capability vectors",
			Measured: "the forgery matrix against Verify and the GossipSub validator",
			Goal:     "100 % refused; 0 registry changes",
			Runs: []Run{race("./mesh/caps/", short, "TestVerifyForgeryMatrix"),
				race("./mesh/announce/", short, "TestValidatorRejectsForgeriesWithoutStateChange", "TestSyncFromForgerChangesNothing")},
		},
		{
			ID: "F8", Name: "replayed announcements",
			Measured: "older seq, after the seen-cache, expired records, a forgotten peer's vector",
			Goal:     "ignored, state unchanged (100 %)",
			Runs: []Run{race("./mesh/announce/", short, "TestValidatorIgnoresReplays", "TestSyncCannotBringBackAForgottenPeer"),
				race("./mesh/registry/", short, "TestPutKeepsOnlyNewerSeq")},
		},
		{
			ID: "F9", Name: "oversized or malformed frames",
			Measured: "over-length and non-minimal varints, oversized request frames, WebSocket protocol breaks, over-limit bodies",
			Goal:     "short: no panic; bytes read ≤ max + 16; reset or close with its code; honest requests still served (close within 100 ms not timed)",
			Runs: []Run{race("./internal/frame/", short, "TestRefusals"),
				race("./transport/infer/", short, "TestServerRefusesOversizedRequest", "TestProtocolViolationsGivePeerLost"),
				race("./transport/gateway/", short, "TestWSCloseCodes")},
		},
		{
			ID: "F10", Name: "announcement flood",
			Measured: "a neighbour forwarding forged vectors; one identity's 50 signed announcements",
			Goal:     "short: forger below the graylist threshold (-400) at the 7th rejected vector; 4 accepted then one per heartbeat/3, no penalty (not 1,000/s for 30 s)",
			Runs: []Run{race("./node/", short, "TestGossipSubGraylistsAForger"),
				race("./mesh/announce/", short, "TestAnnouncementFloodIsRateLimited", "TestRateLimitPerAuthor")},
		},
		{
			ID: "F11", Name: "Sybil colocation",
			Measured: "12 identities on the machine's non-loopback address; made-up identities through sync",
			Goal:     "short: 8 connect, each below the publish threshold (-100); sync-fed Sybils never routed (no routed-share figure)",
			Runs: []Run{race("./node/", short, "TestSybilsOnOneIPScoreBelowPublish"),
				race("./testnet/", long, "TestSybilVectorsThroughCapsSync")},
		},
		{
			ID: "F12", Name: "eclipse",
			Measured: "12 inbound attackers, the connection manager trimming to 1",
			Goal:     "short: the diverse protected outbound connections survive; DHT diversity filter (no D_out or served-by-honest figure)",
			Runs:     []Run{race("./mesh/discovery/", short, "TestDiverseOutboundSurviveInboundFlood", "TestChooseDiverse", "TestDHTDiversityFilterExemptsLocalGroups")},
		},
		{
			ID: "F13", Name: "coordinator crash",
			Measured: "20 tasks in flight through a coordinator process, SIGKILL, restart; in process, restarted and gone",
			Goal:     "short: each task completes once or gets coordinator_lost within 5 s; no task metered twice (no status coordinator: restarting)",
			Runs: []Run{race("./testnet/", long, "TestProcsCoordinatorRestart"),
				race("./transport/gateway/client/", short, "TestCoordinatorRestartEachCallEndsOnce")},
		},
		{
			ID: "F14", Name: "privacy gate",
			Measured: "thousands of local-only requests with counting host, executor and announcer; the import graph",
			Goal:     "short (about 2,000 requests, not 10,000): 0 connections, publishes, peer or cloud requests; 0 import violations",
			Runs: []Run{race("./node/", short, "TestLocalOnlyNeverTouchesTheNetwork"),
				race("./testnet/", short, "TestLocalOnlyPathDependencies"),
				race("./transport/openai/", short, "TestLocalOnlyNeverReachesDispatcher")},
		},
		{
			ID: "F15", Name: "battery and thermal hysteresis",
			Measured: "synthetic sensor traces (virtual time); a testnet node's battery draining",
			Goal:     "short (3,000 traces, not 10,000): ≤ 1 resume per backoff window; never accepting while a policy is breached; the in-flight stream completes; peers see the pause within a heartbeat",
			Runs: []Run{race("./mesh/participation/", short, "TestGovernorTraces"),
				race("./testnet/", long, "TestBatteryDrainPausesAndResumes")},
		},
		{
			ID: "F16", Name: "WebSocket keepalive and REST fallback",
			Measured: "pongs stopped; connections cut at random tokens; a coordinator without WebSocket",
			Goal:     "short (20 cut runs, not 200): dead after exactly 3 missed pongs; exactly one completion per request; REST serves when WebSocket cannot",
			Runs:     []Run{race("./transport/gateway/client/", short, "TestKeepaliveThreeMissedPongs", "TestResubmissionGivesExactlyOneCompletion", "TestChatFallsBackToREST")},
		},
		{
			ID: "F17", Name: "status endpoint",
			Measured: "console bind addresses and Host headers",
			Goal:     "short: binds loopback only; a foreign Host refused; the node refuses a public console without its flag (no p99 under load)",
			Runs: []Run{race("./node/console/", short, "TestNewRefusesNonLoopback", "TestNewAcceptsLoopback", "TestConsoleRefusesForeignHost"),
				race("./cmd/meshinfer/", short, "TestNodeRefusesPublicConsoleBeforeBlocking")},
		},
		{
			ID: "F18", Name: "graceful shutdown",
			Measured: "SIGTERM to a serving peer process; drain and Close with requests in flight",
			Goal:     "short (one task in flight, not 50): in-flight finishes or gets shutting_down; the process exits 0",
			Runs: []Run{race("./testnet/", long, "TestProcsDrainOnSIGTERM", "TestProcsCommandLeavesNoChild"),
				race("./node/", short, "TestDrainRefusesNewTasksAndAnnounces"),
				race("./transport/openai/", short, "TestCloseInFlight")},
		},
		{
			ID: "F19", Name: "churn",
			Measured: "a router's requests on 3 streams while serving peers join or leave (kill, close, drain in turn) every 500 ms for 12 s, and every 2 s for 2 min (-tags soak)",
			Goal:     "short (at most three peers that left still fresh at the router; the test heartbeat of 1 s, not 15 s; TestChurn an event every 500 ms for 12 s, TestChurnSoak the catalogue's 2 s for 2 min): every request ends once, complete and identical or with a typed error; ≥ 99 % success; none stuck; reputation within its cap; every peer that left forgotten by registry and reputation",
			Runs: []Run{race("./testnet/", long, "TestChurn"),
				{Pkg: "./testnet/", Tests: []string{"TestChurnSoak"}, Tags: "soak", Race: true, Timeout: long},
				race("./reputation/", short, "TestPruneForgetsAPeerThatLeft"),
				race("./node/", short, "TestPruneReputationForgetsThePeerThatLeft"),
				race("./transport/infer/", short, "TestUnreachablePeerIsUnavailableAtOpenTimeout")},
		},
		{ID: "Z1", Name: "FuzzCapabilityVectorDecode", Measured: "capability vector bytes", Goal: "no panic; decode→encode→decode stable; fields in bounds or an error",
			Runs: []Run{seeds("./mesh/caps/", "FuzzDecode")}},
		{ID: "Z2", Name: "FuzzAnnouncementVerify", Measured: "signed vector + mutation", Goal: "verifies only the original bytes",
			Runs: []Run{seeds("./mesh/caps/", "FuzzVerifySignature")}},
		{ID: "Z3", Name: "FuzzFrameReader", Measured: "declared length and bytes", Goal: "allocation ≤ max frame; over-length and non-minimal varints refused",
			Runs: []Run{seeds("./internal/frame/", "FuzzReader")}},
		{ID: "Z4", Name: "FuzzInferenceRequestJSON", Measured: "request bodies", Goal: "no panic; limits enforced",
			Runs: []Run{seeds("./inference/", "FuzzRequestJSON"), seeds("./transport/openai/", "FuzzChatCompletionBody")}},
		{ID: "Z5", Name: "FuzzWSMessage", Measured: "WebSocket frames into the gateway handler", Goal: "no panic; close codes from the allowed set; well-formed frames only",
			Runs: []Run{seeds("./transport/gateway/", "FuzzWSFrames", "FuzzDecodeClientMessage")}},
		{ID: "Z6", Name: "FuzzTaskEnvelope", Measured: "the coordinator's task envelope (replacement: tasks are not encrypted end to end): the serving peer's signed receipt of the task and its result, the coordinator's countersignature and peer ID, task and stage kinds, seeded with real envelopes and forgeries",
			Goal: "accepted exactly when a key holder signed those bytes, as exactly the signed receipt; every other envelope (bit flips, truncations, forgeries) a typed error with nothing of it returned",
			Runs: []Run{plain("./mesh/receipts/", short, "FuzzTaskEnvelope", "TestTaskEnvelopeMutationsRefused")}},
		{ID: "Z7", Name: "FuzzResultCanonicalize", Measured: "result digests", Goal: "equal digests exactly when ids and texts are equal; one canonical string form",
			Runs: []Run{seeds("./inference/", "FuzzDigest", "FuzzParseDigest")}},
		{ID: "Z8", Name: "FuzzReputationOps", Measured: "reputation operation sequences", Goal: "scores finite in [0, 100]; store within its cap",
			Runs: []Run{seeds("./reputation/", "FuzzStoreOps")}},
		{ID: "Z9", Name: "FuzzRouterSelect", Measured: "peer sets decoded from the input (scores through real events, cooldowns, penalties, load, cold copies, round trips, speeds), ε in [0, 0.5], seed, route mode, through Decide and the real store",
			Goal: "never picks excluded peers, nor cooling ones when an eligible one exists; every pick a valid serving peer; over 10,000 evenly spaced draws Select gives each eligible candidate ε/n + (1−ε)·w/W within 5 draws and the exploring draws (ε within 1/N) evenly",
			Runs: []Run{seeds("./mesh/route/", "FuzzRouterSelect")}},
		{ID: "Z10", Name: "FuzzPolicyHysteresis", Measured: "sensor traces decoded from the input: readings, gaps, profiles, consent",
			Goal: "never accepting in a beat that breaches the policy (battery floor, thermal, silent sensors); at most one resume per backoff window (300 s by default), none before the healthy beats",
			Runs: []Run{plain("./mesh/participation/", short, "FuzzPolicyHysteresis", "TestHysteresisSeedsPauseAndResume")}},
		{ID: "Z11", Name: "FuzzVerifierQuorum", Measured: "two or three plans (peers or pipelines) and their digests, through inference.Judge and the executor's settle into a real store (not the executions)",
			Goal: "a plan sharing its output with another is never odd and never loses score (honest majority never penalized); two that differ with no third, or three different, are inconclusive: no score moves; an odd pipeline's stages lose nothing before isolation",
			Runs: []Run{seeds("./node/dispatch/", "FuzzVerifierQuorum")}},
		{ID: "Z12", Name: "FuzzStatusQuery", Measured: "request lines, Host and headers into the console", Goal: "no panic; never echoes request bodies; statuses from a closed set",
			Runs: []Run{seeds("./node/console/", "FuzzStatusQuery")}},
	}
}
