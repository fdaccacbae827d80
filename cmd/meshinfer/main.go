// Command meshinfer runs a node of the meshinfer peer-to-peer inference mesh, a local
// testnet of many nodes, and small tools around them (status, chat, id, consent, receipts,
// keys, usage).
//
// This package parses flags, sets up logging and calls into node and testnet; it holds no
// domain logic.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	golog "github.com/ipfs/go-log/v2"
	"github.com/libp2p/go-libp2p/gologshim"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// command is one subcommand: its name, its line in the usage, and what runs it.
type command struct {
	name, summary string
	run           func(args []string, stdout, stderr io.Writer) error
}

// commands are every subcommand, in the order the usage lists them: the one table that
// both dispatches and documents, so the usage cannot miss a command.
var commands = []command{
	{"node", "run a node: join the mesh, announce this machine's capabilities, serve the console", runNode},
	{"testnet", "run N nodes on loopback (in this process, or one process each) and show them find each other", runTestnet},
	{"status", "show a running node's status (reads its console)", runStatus},
	{"chat", "send a prompt to a node's OpenAI-compatible API and stream the answer", runChat},
	{"id", "print this node's peer ID (creates the identity on first use)", runID},
	{"consent", "show, give or withdraw the owner's consent to run and contribute work", runConsent},
	{"receipts", "list, total and verify the signed receipts of tasks served for other peers", runReceipts},
	{"keys", "create, list and revoke a coordinator's API keys for thin clients", runKeys},
	{"usage", "total what each API key used through a coordinator", runUsage},
	{"version", "print the version", runVersion},
	{"help", "show this help, or a command's ('meshinfer help node')", nil}, // run dispatches it
}

// usage is the top-level help, listing every command.
func usage() string {
	var b strings.Builder
	b.WriteString("meshinfer: a peer-to-peer inference mesh node\n\nUsage:\n  meshinfer <command> [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	b.WriteString(`
Run 'meshinfer <command> --help' for the flags of a command.

Logging: GOLOG_LOG_LEVEL sets levels for meshinfer and go-libp2p alike, for example
  GOLOG_LOG_LEVEL=info  or  GOLOG_LOG_LEVEL="error,mesh/announce=debug"
`)
	return b.String()
}

func runVersion(_ []string, stdout, _ io.Writer) error {
	fmt.Fprintln(stdout, "meshinfer", version)
	return nil
}

func main() {
	setupLogging()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage marks a command-line mistake: exit status 2, as flag does.
var errUsage = errors.New("usage")

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "--version", "-version":
		cmd = "version"
	case "--help", "-help", "-h":
		cmd = "help"
	}
	if cmd == "help" {
		if len(rest) == 0 {
			fmt.Fprint(stdout, usage())
			return 0
		}
		cmd, rest = rest[0], []string{"--help"} // meshinfer help node = meshinfer node --help
	}
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == cmd && c.run != nil })
	if i < 0 {
		fmt.Fprintf(stderr, "meshinfer: unknown command %q\n\n%s", cmd, usage())
		return 2
	}
	err := commands[i].run(rest, stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "meshinfer: %v\n", err)
		return 1
	}
}

// setupLogging routes go-libp2p's slog output through go-log, so GOLOG_LOG_LEVEL controls
// both, and keeps the default level at warn: a node's normal output is what it prints itself.
func setupLogging() {
	cfg := golog.GetConfig()
	if os.Getenv("GOLOG_LOG_LEVEL") == "" {
		cfg.Level = golog.LevelWarn
	}
	golog.SetupLogging(cfg)
	if os.Getenv("GOLOG_LOG_LEVEL") == "" {
		// The DHT warns on every refresh while its table is empty, and identify on every
		// connection closed under it; both are normal for the first node of a mesh and
		// during shutdown.
		golog.SetLogLevel("dht/RtRefreshManager", "error")
		golog.SetLogLevel("net/identify", "error")
	}
	gologshim.SetDefaultHandler(golog.SlogHandler())
}

// newFlagSet returns a FlagSet that prints its usage with a one-line synopsis and reports
// errors instead of exiting. Its output is stderr; parseFlags sends the usage to stdout when
// it was asked for.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: meshinfer %s\n\n%s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args into fs and leaves any positional arguments to the caller. Asked
// for help (-h, --help), it prints the usage to stdout and returns flag.ErrHelp: exit 0.
// After a mistake flag has printed the error to stderr; the usage follows it there and
// parseFlags returns errUsage: exit 2.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	usage := fs.Usage
	fs.Usage = func() {} // flag calls it on help and after an error: printed below instead
	err := fs.Parse(args)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		stderr := fs.Output()
		fs.SetOutput(stdout)
		fs.Usage()
		fs.SetOutput(stderr)
		return flag.ErrHelp
	case err != nil:
		fs.Usage()
		return errUsage
	}
	return nil
}

// parse is parseFlags for a command that takes no positional argument.
func parse(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "meshinfer %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		fs.Usage()
		return errUsage
	}
	return nil
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return fmt.Sprint([]string(*l)) }

func (l *listFlag) Set(s string) error {
	*l = append(*l, s)
	return nil
}
