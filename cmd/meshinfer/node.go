package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/inference"
	"github.com/meshinfer/meshinfer/mesh/participation"
	"github.com/meshinfer/meshinfer/node"
)

// firstRunConsent asks the owner for consent, with wording, when none is recorded or the
// recorded one was given to another wording, and this is a terminal; without a terminal it
// says how to give it, and the node runs without contributing.
func firstRunConsent(dataDir, textFile, wording string, stdout, stderr io.Writer) error {
	dir, err := dataDirOrDefault(dataDir)
	if err != nil {
		return err
	}
	c, ok, err := participation.LoadConsent(dir)
	if err != nil {
		return err
	}
	changed := ok && !c.GivenFor(participation.WordingHash(wording))
	if ok && !changed {
		return nil
	}
	how := "meshinfer consent"
	if textFile != "" {
		how += " --consent-text " + textFile
	}
	if !isTerminal(os.Stdin) {
		if changed {
			fmt.Fprintf(stderr, "consent wording changed: run 'meshinfer consent' again (%s). Until then this node runs models for you "+
				"but contributes nothing to the mesh and uses no cloud.\n", how)
			return nil
		}
		fmt.Fprintf(stderr, "no consent recorded: this node runs models for you but contributes nothing to the mesh and uses no cloud.\n"+
			"to decide: %s   (or, in scripts: %s --contribute yes --run-local yes --cloud no)\n", how, how)
		return nil
	}
	if changed {
		fmt.Fprintln(stdout, "consent wording changed since you answered: please read it and answer again.")
	}
	return askAndSave(dir, wording, stdout)
}

const nodeSynopsis = `Run a node: listen for peers, join the mesh through bootstrap peers, the DHT and mDNS,
announce this machine's signed capability vector, serve the built-in model on the
OpenAI-compatible API (and to peers), and serve the local console.

Examples:
  meshinfer node
  meshinfer node --role bootstrap --listen /ip4/0.0.0.0/tcp/4001
  meshinfer node --bootstrap /ip4/192.0.2.7/tcp/4001/p2p/12D3KooW...
  meshinfer node --backend openai --upstream http://127.0.0.1:8080 --model qwen2.5-0.5b
  meshinfer node --cloud-url https://api.example.com --cloud-model gpt-4o-mini --privacy any

Routing: each request goes to this device, a peer, or the cloud, from its preferences (the
body's "meshinfer" object or the X-Meshinfer-Privacy / X-Meshinfer-Priority headers), with
--privacy and --priority as the defaults. local-only requests never leave this device.
A request sent to a peer goes over a libp2p stream, or a WebRTC data channel with
"meshinfer": {"transport": "webrtc"}, X-Meshinfer-Transport: webrtc, or --webrtc, when the
peer accepts WebRTC set-ups (it runs with --webrtc or --webrtc-accept); else over libp2p.
A node answers no peer's WebRTC set-up unless it runs with one of those two flags.
A request may set a time limit, "meshinfer": {"timeout": "30s"} or X-Meshinfer-Timeout: 30s
(a Go duration, at most 1h): still running when it passes, it ends with a timeout error.`

func runNode(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("node", nodeSynopsis, stderr)
	var listen, boots, models, cloudModels, iceServers, origins listFlag
	dataDir := fs.String("data-dir", "", "where the identity key lives (default $XDG_DATA_HOME/meshinfer, else ~/.local/share/meshinfer)")
	mesh := fs.String("mesh", node.DefaultMesh, "mesh to join; nodes of different meshes never see each other")
	role := fs.String("role", string(node.RoleContributor), "contributor; bootstrap (DHT server, relay and AutoNAT service for others); coordinator (serves thin clients with API keys, metering; see meshinfer keys); comma-separated")
	fs.Var(&listen, "listen", "libp2p listen multiaddr, repeatable (default TCP and QUIC on port 4001, IPv4 and IPv6)")
	fs.Var(&boots, "bootstrap", "bootstrap peer multiaddr ending in /p2p/<peer ID>, repeatable")
	noMDNS := fs.Bool("no-mdns", false, "do not discover or answer peers on the local network (mDNS)")
	loopback := fs.Bool("loopback", false, "for a testnet of nodes on this one machine (meshinfer testnet --procs): DHT server mode on loopback addresses, no NAT traversal, mDNS, DHT rendezvous or peer exchange")
	fs.Var(&models, "model", "model to serve, repeatable: with --backend synth a built-in synthetic model, synth-tiny, synth-small or synth-base (default synth-tiny; \"none\" serves nothing and only routes); with --backend openai the upstream's name for it (required)")
	backend := fs.String("backend", node.BackendSynth, "what serves --model: synth (built-in synthetic models) or openai (an OpenAI-compatible server at --upstream)")
	upstreamURL := fs.String("upstream", "", "base URL of the OpenAI-compatible server for --backend openai, e.g. http://127.0.0.1:8080 (llama-server) or http://127.0.0.1:11434 (Ollama)")
	upstreamKeyEnv := fs.String("upstream-key-env", node.DefaultUpstreamKeyEnv, "environment variable holding the upstream's API key, sent as a bearer token (unset: none)")
	apiAddr := fs.String("api", node.DefaultAPIAddr, `OpenAI-compatible API listen address, or "off"`)
	apiPublic := fs.Bool("api-public", false, "allow a non-loopback API address (anyone who reaches it can use this node)")
	consoleAddr := fs.String("console", node.DefaultConsoleAddr, `console listen address, or "off"`)
	consolePublic := fs.Bool("console-public", false, "allow a non-loopback console address (exposes peers and addresses)")
	heartbeat := fs.Duration("heartbeat", node.DefaultHeartbeat, "capability re-announcement period")
	drainTimeout := fs.Duration("drain-timeout", node.DefaultDrainTimeout, "on Ctrl-C or SIGTERM, refuse new tasks from peers, hand the generations and pipeline stages in flight over to other nodes (their routers and heads take them with their KV cache) and let the others finish, for up to this long before stopping (0: stop at once, cancelling them; their routers resume them elsewhere)")
	connsLow := fs.Int("conns-low", node.DefaultConnsLow, "connection manager low water mark")
	connsHigh := fs.Int("conns-high", node.DefaultConnsHigh, "connection manager high water mark")
	probeRoot := fs.String("probe-root", "/", "filesystem root under which /proc and /sys are read (for tests)")
	privacy := fs.String("privacy", string(inference.PrivacyMesh), "default privacy of a request that sets none: local-only (never leaves this device), mesh (this device or peers) or any (the cloud too, with --cloud-url)")
	priority := fs.String("priority", string(inference.PriorityBalanced), "default priority of a request that sets none: cost, latency or balanced")
	cloudURL := fs.String("cloud-url", "", "base URL of an OpenAI-compatible cloud API, the fallback tier for requests whose privacy is any")
	cloudKeyEnv := fs.String("cloud-key-env", node.DefaultCloudKeyEnv, "environment variable holding the cloud's API key, sent as a bearer token (unset: none)")
	fs.Var(&cloudModels, "cloud-model", "model the cloud serves, repeatable (required with --cloud-url)")
	cloudCost := fs.Float64("cloud-cost", node.DefaultCloudUSDPerMTok, "the cloud's price in USD per million tokens, for cost and balanced routing")
	tlsCert := fs.String("tls-cert", "", "PEM certificate chain: serve the API over HTTPS (with --tls-key)")
	tlsKey := fs.String("tls-key", "", "PEM private key for --tls-cert")
	useWebRTC := fs.Bool("webrtc", false, "use WebRTC data channels (direct, low latency): send this node's requests to peers over them unless a request sets its transport (falls back to libp2p when no direct path sets up), and answer peers' WebRTC set-ups as --webrtc-accept does")
	acceptWebRTC := fs.Bool("webrtc-accept", false, "answer peers' WebRTC set-ups, without sending this node's own requests over WebRTC: direct paths peers open to send it requests, and direct tasks a coordinator relays for its thin clients (meshinfer chat --gateway --direct). Without it or --webrtc, this node registers no WebRTC signaling and peers' requests reach it over libp2p")
	fs.Var(&iceServers, "ice-server", "STUN or TURN server for WebRTC paths, stun:host:port or turn:host:port (TURN credentials from $"+node.EnvTURNUsername+" and $"+node.EnvTURNCredential+"); repeatable; none needed on a LAN")
	fs.Var(&origins, "gateway-origin", "origin of a browser app allowed to call this coordinator's gateway (WebSocket and REST with CORS), e.g. app.example.com or *.example.com; repeatable")
	var budget byteSize
	fs.Var(&budget, "memory-budget", "memory this node gives to mesh work (models held whole for peers, pipeline stages of larger ones), e.g. 512MiB, 4GiB or 2GB; a plain number is MiB (default half the memory available at start); the profile's max_memory_share caps it")
	insecureGateway := fs.Bool("insecure-gateway", false, "let a coordinator's API listen on a non-loopback address without TLS (a TLS proxy in front of it)")
	profile := fs.String("profile", "", "participation profile set by whoever deploys the node: eco, standard, power or off (default standard, or the --config file's)")
	configFile := fs.String("config", "", "JSON file of per-field overrides of the profile: require_charging, battery_min_level, thermal_max_state, max_tasks_per_min, pause_on_metered, max_bytes_per_hour, max_memory_share")
	consentText := fs.String("consent-text", "", "file with the deployer's consent wording (plain text, at most 64 KiB), asked with instead of the built-in one; a consent given to other wording counts as not given until the owner answers again")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	cfg := node.Config{
		DataDir:       *dataDir,
		Mesh:          *mesh,
		ListenAddrs:   listen,
		MDNS:          !*noMDNS,
		Loopback:      *loopback,
		Models:        modelList(models, *backend),
		APIAddr:       *apiAddr,
		APIPublic:     *apiPublic,
		ConsoleAddr:   *consoleAddr,
		ConsolePublic: *consolePublic,
		Heartbeat:     *heartbeat,
		ConnsLow:      *connsLow,
		ConnsHigh:     *connsHigh,
		ProbeRoot:     *probeRoot,
		MemoryBudget:  int64(budget),
		Version:       version,
	}
	cfg.Backend, cfg.Upstream, cfg.UpstreamKeyEnv = *backend, *upstreamURL, *upstreamKeyEnv
	cfg.Prefs = inference.Prefs{Privacy: inference.Privacy(*privacy), Priority: inference.Priority(*priority)}
	if *useWebRTC {
		cfg.Prefs.Transport = inference.TransportWebRTC
	}
	cfg.WebRTCAccept = *useWebRTC || *acceptWebRTC
	cfg.ICEServers = iceServers
	if err := cfg.Prefs.Validate(); err != nil {
		if e, ok := errors.AsType[*inference.Error](err); ok {
			err = errors.New(e.Message)
		}
		return fmt.Errorf("--privacy/--priority: %w", err)
	}
	cfg.CloudURL, cfg.CloudKeyEnv, cfg.CloudModels, cfg.CloudUSDPerMTok = *cloudURL, *cloudKeyEnv, cloudModels, *cloudCost
	cfg.Profile = *profile
	cfg.TLSCert, cfg.TLSKey, cfg.InsecureGateway = *tlsCert, *tlsKey, *insecureGateway
	cfg.GatewayOrigins = origins
	if *configFile != "" {
		ov, err := participation.LoadOverrides(*configFile)
		if err != nil {
			return err
		}
		cfg.ProfileOverrides = ov
	}
	wording, err := consentWording(*consentText)
	if err != nil {
		return err
	}
	if *consentText != "" {
		cfg.ConsentWording = wording
	}
	if err := firstRunConsent(*dataDir, *consentText, wording, stdout, stderr); err != nil {
		return err
	}
	roles, err := parseRoles(*role)
	if err != nil {
		return err
	}
	cfg.Roles = roles
	for _, b := range boots {
		ai, err := peer.AddrInfoFromString(b)
		if err != nil {
			return fmt.Errorf("--bootstrap %q: %w (want a multiaddr ending in /p2p/<peer ID>, as 'meshinfer status' shows under listen addresses)", b, err)
		}
		cfg.Bootstrap = append(cfg.Bootstrap, *ai)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	n, err := node.New(cfg)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%w\nanother meshinfer node may be running here: stop it, or pick other --listen and --console addresses", err)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "meshinfer %s node %s\n", version, n.ID())
	fmt.Fprintf(stdout, "  mesh     %s\n", *mesh)
	fmt.Fprintf(stdout, "  roles    %s\n", *role)
	for _, a := range n.P2PAddrs() {
		fmt.Fprintf(stdout, "  listen   %s\n", a)
	}
	fmt.Fprintf(stdout, "  models   %s\n", strings.Join(cfg.Models, ", "))
	fmt.Fprintf(stdout, "  memory   %s for mesh work\n", byteSize(n.MemoryBudget()))
	if cfg.Backend == node.BackendOpenAI {
		fmt.Fprintf(stdout, "  upstream %s\n", cfg.Upstream)
	}
	fmt.Fprintf(stdout, "  routing  privacy %s, priority %s by default\n", cfg.Prefs.Or(inference.DefaultPrefs()).Privacy, cfg.Prefs.Or(inference.DefaultPrefs()).Priority)
	switch {
	case *useWebRTC:
		fmt.Fprintln(stdout, "  webrtc   requests to peers over WebRTC data channels by default; answers peers' WebRTC set-ups")
	case cfg.WebRTCAccept:
		fmt.Fprintln(stdout, "  webrtc   answers peers' WebRTC set-ups (direct paths, direct tasks for thin clients)")
	}
	if cfg.CloudURL != "" {
		fmt.Fprintf(stdout, "  cloud    %s (%s) for requests with privacy any\n", cfg.CloudURL, strings.Join(cfg.CloudModels, ", "))
	}
	if a := n.APIAddr(); a != "" {
		scheme := "http"
		if cfg.TLSCert != "" {
			scheme = "https"
		}
		if slices.Contains(cfg.Roles, node.RoleCoordinator) {
			fmt.Fprintf(stdout, "  gateway  %s://%s/v1   (clients need a key: meshinfer keys create --name NAME; then meshinfer chat --gateway %s://%s --key KEY \"hello\")\n",
				scheme, a, scheme, a)
		} else {
			fmt.Fprintf(stdout, "  api      %s://%s/v1   (try: meshinfer chat --api %s://%s \"hello\")\n", scheme, a, scheme, a)
		}
	}
	if a := n.ConsoleAddr(); a != "" {
		fmt.Fprintf(stdout, "  console  http://%s/api/status\n", a)
	}
	if len(cfg.Bootstrap) == 0 && !slices.Contains(cfg.Roles, node.RoleBootstrap) {
		if cfg.MDNS {
			fmt.Fprintln(stdout, "  no --bootstrap peers: finding peers through mDNS on this network only")
		} else {
			fmt.Fprintln(stdout, "  no --bootstrap peers and --no-mdns: this node finds no peers until others dial it")
		}
	}
	fmt.Fprintln(stdout, "Ctrl-C stops the node.")
	<-ctx.Done()
	stop() // a second Ctrl-C or SIGTERM ends the process at once, drain or not
	if *drainTimeout > 0 {
		fmt.Fprintf(stdout, "draining: no new tasks from peers, up to %v for those in flight (Ctrl-C again stops at once)...\n", *drainTimeout)
		dctx, cancel := context.WithTimeout(context.Background(), *drainTimeout)
		if err := n.Drain(dctx); err != nil {
			fmt.Fprintf(stdout, "%v: cancelling them (their routers resume them elsewhere)\n", err)
		}
		cancel()
	}
	fmt.Fprintln(stdout, "stopping...")
	done := make(chan error, 1)
	go func() { done <- n.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		return fmt.Errorf("node did not stop within 10s")
	}
}

// modelList applies the --model default (synth-tiny with the synth backend, none with
// openai: the upstream's names cannot be guessed) and the "none" value.
func modelList(flags []string, backend string) []string {
	if len(flags) == 0 {
		if backend == node.BackendOpenAI {
			return nil
		}
		return []string{"synth-tiny"}
	}
	var out []string
	for _, m := range flags {
		if m != "none" {
			out = append(out, m)
		}
	}
	return out
}

func parseRoles(s string) ([]node.Role, error) {
	var roles []node.Role
	for _, r := range strings.Split(s, ",") {
		switch node.Role(strings.TrimSpace(r)) {
		case node.RoleContributor:
		case node.RoleBootstrap:
			roles = append(roles, node.RoleBootstrap)
		case node.RoleCoordinator:
			roles = append(roles, node.RoleCoordinator)
		default:
			return nil, fmt.Errorf("--role %q: known roles are contributor, bootstrap and coordinator (comma-separated)", r)
		}
	}
	return roles, nil
}

// byteSize is a --memory-budget value: a number with an optional unit (B, KB, MB, GB, TB
// in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024); a plain number is MiB.
type byteSize int64

func (b byteSize) String() string {
	switch v := int64(b); {
	case v == 0:
		return ""
	case v%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", v>>30)
	case v >= 1<<30:
		return fmt.Sprintf("%.1fGiB", float64(v)/(1<<30))
	default:
		return fmt.Sprintf("%dMiB", v>>20)
	}
}

func (b *byteSize) Set(s string) error {
	num, mult := splitUnit(s, 1<<20)
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || !(f > 0) {
		return fmt.Errorf("%q: want a positive size such as 512MiB or 4GiB (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", s)
	}
	if f*float64(mult) > float64(1<<62) {
		return fmt.Errorf("%q: too large", s)
	}
	*b = byteSize(f * float64(mult))
	return nil
}
