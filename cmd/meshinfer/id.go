package main

import (
	"fmt"
	"io"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/meshinfer/meshinfer/node"
)

func runID(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("id", "Print this node's peer ID, creating the identity key on first use.", stderr)
	dataDir := fs.String("data-dir", "", "where the identity key lives (default $XDG_DATA_HOME/meshinfer, else ~/.local/share/meshinfer)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	dir := *dataDir
	if dir == "" {
		var err error
		if dir, err = node.DefaultDataDir(); err != nil {
			return err
		}
	}
	key, created, err := node.LoadOrCreateIdentity(dir)
	if err != nil {
		return err
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(stderr, "created a new identity in %s\n", dir)
	}
	fmt.Fprintln(stdout, id)
	return nil
}
