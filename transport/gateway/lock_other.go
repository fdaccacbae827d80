//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package gateway

// lockKeys does not lock on systems without flock: two `meshinfer keys` commands run at the
// same moment may lose one's change there. Within one process writeMu still serializes.
func lockKeys(path string) (unlock func(), err error) {
	return func() {}, nil
}
