package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/meshinfer/meshinfer/transport/gateway"
)

const keysSynopsis = `Create, list and revoke the API keys of a coordinator. A thin client sends its key with every
request to the coordinator's gateway; the coordinator keeps only a hash of each key, in
keys.json in its data dir.

  meshinfer keys create --name NAME   make a key and print it, this once
  meshinfer keys list                 list the keys (id, name, created, revoked), never a key
  meshinfer keys revoke ID|NAME       refuse a key from now on, also on a running coordinator`

const dataDirHelp = "the coordinator's data dir (default $XDG_DATA_HOME/meshinfer, else ~/.local/share/meshinfer)"

func runKeys(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintf(stderr, "Usage: meshinfer keys create|list|revoke [flags]\n\n%s\n", keysSynopsis)
		return errUsage
	}
	switch sub, rest := args[0], args[1:]; sub {
	case "create":
		return runKeysCreate(rest, stdout, stderr)
	case "list":
		return runKeysList(rest, stdout, stderr)
	case "revoke":
		return runKeysRevoke(rest, stdout, stderr)
	case "help", "--help", "-help", "-h":
		fmt.Fprintf(stdout, "Usage: meshinfer keys create|list|revoke [flags]\n\n%s\n", keysSynopsis)
		return flag.ErrHelp
	default:
		fmt.Fprintf(stderr, "meshinfer keys: unknown subcommand %q\n\nUsage: meshinfer keys create|list|revoke [flags]\n\n%s\n", sub, keysSynopsis)
		return errUsage
	}
}

func runKeysCreate(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys create", "Make a new API key and print it on standard output, alone on its line, for a script to\n"+
		"capture. It is shown this once: only its hash is stored.", stderr)
	name := fs.String("name", "", "what the key is for, unique among live keys: letters, digits and . _ - @ + (required)")
	dataDir := fs.String("data-dir", "", dataDirHelp)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *name == "" {
		fmt.Fprintln(stderr, "meshinfer keys create: --name is required: say what the key is for, e.g. --name alice-laptop")
		fs.Usage()
		return errUsage
	}
	ks, err := openKeyStore(*dataDir)
	if err != nil {
		return err
	}
	plain, k, err := ks.Create(*name, time.Now())
	switch {
	case errors.Is(err, gateway.ErrNameTaken):
		return fmt.Errorf("a live key is already named %q: choose another name, or revoke that key first with: meshinfer keys revoke %s", *name, *name)
	case err != nil:
		return err
	}
	fmt.Fprintln(stdout, plain)
	fmt.Fprintf(stderr, "created API key %s %q in %s.\n", k.ID, k.Name, ks.Path())
	fmt.Fprintf(stderr, "This is the only time the key is shown: it is not stored (only its hash is) and cannot be\n"+
		"shown again. Copy it now. If it is lost, revoke it (meshinfer keys revoke %s) and create another.\n", k.ID)
	return nil
}

func runKeysList(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys list", "List the API keys: id, name, when created, when revoked. Never a key: only hashes are stored.", stderr)
	dataDir := fs.String("data-dir", "", dataDirHelp)
	asJSON := fs.Bool("json", false, "print the keys as JSON, for scripts")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	ks, err := openKeyStore(*dataDir)
	if err != nil {
		return err
	}
	keys := ks.List()
	if *asJSON {
		return printJSON(stdout, keys)
	}
	if len(keys) == 0 {
		fmt.Fprintf(stdout, "no API keys in %s: create one with: meshinfer keys create --name NAME\n", ks.Path())
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tCREATED\tREVOKED")
	live := 0
	for _, k := range keys {
		revoked := "-"
		if k.Revoked() {
			revoked = k.RevokedAt.Local().Format(time.DateTime)
		} else {
			live++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.ID, k.Name, k.CreatedAt.Local().Format(time.DateTime), revoked)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "%d keys, %d live\n", len(keys), live)
	return nil
}

func runKeysRevoke(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys revoke", "Revoke the key given as the argument, ID|NAME: its id, or the name of a live key. A running\n"+
		"coordinator refuses it from its next request.", stderr)
	dataDir := fs.String("data-dir", "", dataDirHelp)
	// The key may come before or after the flags.
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	target, rest := fs.Arg(0), fs.Args()
	if len(rest) > 0 {
		rest = rest[1:]
	}
	if err := parse(fs, rest, stdout); err != nil {
		return err
	}
	if target == "" {
		fmt.Fprintln(stderr, "meshinfer keys revoke: say which key, by id or name (see: meshinfer keys list)")
		fs.Usage()
		return errUsage
	}
	ks, err := openKeyStore(*dataDir)
	if err != nil {
		return err
	}
	k, err := ks.Revoke(target, time.Now())
	switch {
	case errors.Is(err, gateway.ErrAlreadyRevoked):
		fmt.Fprintf(stdout, "key %s %q was already revoked at %s\n", k.ID, k.Name, k.RevokedAt.Local().Format(time.DateTime))
		return nil
	case errors.Is(err, gateway.ErrKeyNotFound):
		return fmt.Errorf("no key has the id or name %q in %s: see the keys with: meshinfer keys list", target, ks.Path())
	case err != nil:
		return err
	}
	fmt.Fprintf(stdout, "revoked key %s %q: a running coordinator refuses it from its next request\n", k.ID, k.Name)
	return nil
}

func openKeyStore(dataDir string) (*gateway.KeyStore, error) {
	dir, err := dataDirOrDefault(dataDir)
	if err != nil {
		return nil, err
	}
	return gateway.OpenKeys(dir)
}
