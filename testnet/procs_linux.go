package testnet

import "syscall"

// childAttr puts a node process in a process group of its own (a terminal's Ctrl-C reaches
// the parent only, which stops its children in order) and has the kernel SIGKILL it when
// the parent dies, even of SIGKILL. The parent-death signal follows the OS thread that
// started the child; the Go runtime does not end its threads while the program runs (no
// goroutine here locks one), so it fires when the parent process goes.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
