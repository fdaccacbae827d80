//go:build !race

package dispatch

// raceDetector is true in a -race build (see race_test.go).
const raceDetector = false
