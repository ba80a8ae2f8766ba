package gvisor

import "testing"

func TestParseMountinfoLine(t *testing.T) {
	tests := []struct {
		line string
		want mountEntry
		ok   bool
	}{
		{
			"36 25 0:31 / /sys/fs/cgroup/memory rw,relatime shared:15 - cgroup cgroup rw,memory",
			mountEntry{point: "/sys/fs/cgroup/memory", fstype: "cgroup", superOptions: "rw,memory"}, true,
		},
		{
			"99 30 0:4 net:[4026532253] /var/lib/aenv/runsc/null-netns rw - nsfs nsfs rw",
			mountEntry{point: "/var/lib/aenv/runsc/null-netns", fstype: "nsfs", superOptions: "rw"}, true,
		},
		{
			`40 25 0:40 / /mnt/with\040space rw - tmpfs tmpfs rw`,
			mountEntry{point: "/mnt/with space", fstype: "tmpfs", superOptions: "rw"}, true,
		},
		{"garbage", mountEntry{}, false},
	}
	for _, tt := range tests {
		got, ok := parseMountinfoLine(tt.line)
		if ok != tt.ok || got != tt.want {
			t.Errorf("parseMountinfoLine(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	tests := []struct {
		line      string
		pid, ppid int
		ok        bool
	}{
		{"1234 (runsc-gofer) S 1200 1234 1234 0 -1", 1234, 1200, true},
		{"77 (a (weird) name) R 1 77 77", 77, 1, true},
		{"77 noparens", 0, 0, false},
	}
	for _, tt := range tests {
		pid, ppid, ok := parseProcStat(tt.line)
		if pid != tt.pid || ppid != tt.ppid || ok != tt.ok {
			t.Errorf("parseProcStat(%q) = %d, %d, %v; want %d, %d, %v", tt.line, pid, ppid, ok, tt.pid, tt.ppid, tt.ok)
		}
	}
}
