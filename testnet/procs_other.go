//go:build !unix

package testnet

import (
	"os"
	"syscall"
)

// Without Unix signals a node process can only be killed: Freeze, Thaw and Terminate fail
// (os.Process.Signal supports only Kill there).
var (
	sigStop os.Signal = syscall.Signal(0x13)
	sigCont os.Signal = syscall.Signal(0x12)
	sigTerm os.Signal = syscall.SIGTERM
)

func childAttr() *syscall.SysProcAttr { return nil }
