package loopback

import "testing"

func TestHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "LOCALHOST": true, "127.0.0.1": true, "127.8.0.1": true, "::1": true, "[::1]": true,
		"": false, "0.0.0.0": false, "192.168.1.2": false, "localhost.evil.test": false, "evil.example": false,
	} {
		if got := Host(host); got != want {
			t.Errorf("Host(%q) = %v, want %v", host, got, want)
		}
	}
}
