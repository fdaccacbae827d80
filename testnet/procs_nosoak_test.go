//go:build unix && !soak

package testnet

// soakTests: built with -tags soak (make soak), the process tests too long for make test run.
const soakTests = false
