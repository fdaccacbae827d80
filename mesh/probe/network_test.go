package probe

import (
	"testing"
	"time"

	"github.com/meshinfer/meshinfer/mesh/caps"
)

const routeHeader = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"

func TestNetType(t *testing.T) {
	route := func(dev string) string {
		return routeHeader + dev + "\t00000000\t0102A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
	}
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"no route table", map[string]string{}, caps.NetUnknown},
		{"ethernet by name", map[string]string{"/proc/net/route": route("eth0")}, caps.NetEthernet},
		{"ethernet by predictable name", map[string]string{"/proc/net/route": route("enp3s0")}, caps.NetEthernet},
		{"ethernet by type", map[string]string{"/proc/net/route": route("lan0"), "/sys/class/net/lan0/type": "1\n"}, caps.NetEthernet},
		{"cellular by name", map[string]string{"/proc/net/route": route("wwan0")}, caps.NetCellular},
		{"usb tethering", map[string]string{"/proc/net/route": route("usb0")}, caps.NetCellular},
		{"cellular by uevent", map[string]string{
			"/proc/net/route":            route("enx1"),
			"/sys/class/net/enx1/uevent": "INTERFACE=enx1\nDEVTYPE=wwan\n",
		}, caps.NetCellular},
		{"wifi by uevent", map[string]string{
			"/proc/net/route":             route("wlan0"),
			"/sys/class/net/wlan0/uevent": "DEVTYPE=wlan\nINTERFACE=wlan0\n",
		}, caps.NetWiFi},
		{"wifi by wireless directory", map[string]string{
			"/proc/net/route":                      route("radio0"),
			"/sys/class/net/radio0/wireless/.keep": "",
			"/sys/class/net/radio0/type":           "1\n",
		}, caps.NetWiFi},
		{"wifi by name", map[string]string{"/proc/net/route": route("wlp2s0")}, caps.NetWiFi},
		{"bluetooth by name", map[string]string{"/proc/net/route": route("bnep0")}, caps.NetBluetooth},
		{"bluetooth by uevent", map[string]string{
			"/proc/net/route":            route("pan0"),
			"/sys/class/net/pan0/uevent": "DEVTYPE=bluetooth\n",
		}, caps.NetBluetooth},
		{"bridge", map[string]string{
			"/proc/net/route":           route("br0"),
			"/sys/class/net/br0/uevent": "DEVTYPE=bridge\n",
			"/sys/class/net/br0/type":   "1\n",
		}, caps.NetOther},
		{"vpn tunnel", map[string]string{"/proc/net/route": route("tun0"), "/sys/class/net/tun0/type": "65534\n"}, caps.NetOther},
		{"lowest metric wins", map[string]string{
			"/proc/net/route": routeHeader +
				"wwan0\t00000000\t0102A8C0\t0003\t0\t0\t700\t00000000\t0\t0\t0\n" +
				"wlan0\t00000000\t0102A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n",
		}, caps.NetWiFi},
		{"only a subnet route", map[string]string{
			"/proc/net/route": routeHeader + "wwan0\t0002A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n",
		}, caps.NetUnknown},
		{"path in name ignored", map[string]string{
			"/proc/net/route": routeHeader + "../x\t00000000\t0102A8C0\t0003\t0\t0\t1\t00000000\t0\t0\t0\n",
		}, caps.NetUnknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := newTree(t, tc.files)
			if got := readNetType(root); got != tc.want {
				t.Fatalf("net type = %q, want %q", got, tc.want)
			}
			// Probe reports the same, and metered exactly for cellular links.
			h := newProber(t, WithRoot(root), WithGPUCommand("")).Probe(time.Now())
			if h.NetType != tc.want || h.Metered != (tc.want == caps.NetCellular) {
				t.Fatalf("Probe: net type %q metered %v, want %q", h.NetType, h.Metered, tc.want)
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
