//go:build race

package dispatch

// raceDetector is true in a -race build, where the synthetic model computes about 20 times
// slower: long loops over it shrink (see TestHonestPeersPassThousandsOfVerifications).
const raceDetector = true
