package probe

import "testing"

const routeHeader = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"

func TestMetered(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  bool
	}{
		{"no route table", map[string]string{}, false},
		{"ethernet default", map[string]string{
			"/proc/net/route": routeHeader + "eth0\t00000000\t0102A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n",
		}, false},
		{"cellular by name", map[string]string{
			"/proc/net/route": routeHeader + "wwan0\t00000000\t0102A8C0\t0003\t0\t0\t700\t00000000\t0\t0\t0\n",
		}, true},
		{"cellular by uevent", map[string]string{
			"/proc/net/route":            routeHeader + "enx1\t00000000\t0102A8C0\t0003\t0\t0\t50\t00000000\t0\t0\t0\n",
			"/sys/class/net/enx1/uevent": "INTERFACE=enx1\nDEVTYPE=wwan\n",
		}, true},
		{"lowest metric wins", map[string]string{
			"/proc/net/route": routeHeader +
				"wwan0\t00000000\t0102A8C0\t0003\t0\t0\t700\t00000000\t0\t0\t0\n" +
				"wlan0\t00000000\t0102A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n",
		}, false},
		{"only a subnet route", map[string]string{
			"/proc/net/route": routeHeader + "wwan0\t0002A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n",
		}, false},
		{"path in name ignored", map[string]string{
			"/proc/net/route": routeHeader + "../x\t00000000\t0102A8C0\t0003\t0\t0\t1\t00000000\t0\t0\t0\n",
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := readMetered(newTree(t, tc.files)); got != tc.want {
				t.Fatalf("metered = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSensorsAnswer(t *testing.T) {
	root := newTree(t, map[string]string{"/proc/meminfo": "MemTotal: 1024 kB\n", "/sys/class/thermal/x": ""})
	if !sensorsAnswer(root) {
		t.Fatal("a tree with procfs and sysfs does not answer")
	}
	if sensorsAnswer(t.TempDir()) {
		t.Fatal("an empty tree answers")
	}
	if sensorsAnswer(newTree(t, map[string]string{"/proc/meminfo": "MemTotal: 1024 kB\n"})) {
		t.Fatal("a tree without sysfs answers")
	}
}
