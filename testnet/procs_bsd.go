//go:build unix && !linux

package testnet

import "syscall"

// childAttr puts a node process in a process group of its own (a terminal's Ctrl-C reaches
// the parent only, which stops its children in order). Without Linux's parent-death
// signal, a child outlives a parent killed with SIGKILL; every other exit path of the
// parent reaps it (Procs.Close).
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
