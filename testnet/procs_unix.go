//go:build unix

package testnet

import "syscall"

// The signals Procs injects faults with.
var (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
	sigTerm = syscall.SIGTERM
)
