package client

import "time"

// WithPingTicks replaces each connection's ping ticker: for every connection the client
// serves, in order, clock returns the channel whose values are that connection's ticks, so
// that a test decides when each ping goes out instead of the machine's speed deciding
// whether a pong made it back within an interval.
func WithPingTicks(clock func() <-chan time.Time) Option {
	return func(c *config) {
		c.pingClock = func(time.Duration) (<-chan time.Time, func()) { return clock(), func() {} }
	}
}
