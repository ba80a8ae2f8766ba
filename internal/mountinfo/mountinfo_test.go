package mountinfo

import "testing"

func TestParse(t *testing.T) {
	tests := []struct {
		line string
		want Entry
		ok   bool
	}{
		{
			"36 25 0:31 / /sys/fs/cgroup/memory rw,relatime shared:15 - cgroup cgroup rw,memory",
			Entry{Point: "/sys/fs/cgroup/memory", FSType: "cgroup", Source: "cgroup", SuperOptions: "rw,memory"}, true,
		},
		{
			"99 30 0:4 net:[4026532253] /var/lib/aenv/runsc/null-netns rw - nsfs nsfs rw",
			Entry{Point: "/var/lib/aenv/runsc/null-netns", FSType: "nsfs", Source: "nsfs", SuperOptions: "rw"}, true,
		},
		{
			`40 25 0:40 / /mnt/with\040space rw - tmpfs tmpfs rw`,
			Entry{Point: "/mnt/with space", FSType: "tmpfs", Source: "tmpfs", SuperOptions: "rw"}, true,
		},
		{
			"120 29 0:52 / /var/lib/aenv/volumes rw,nosuid,nodev,relatime - btrfs /dev/loop3 rw,space_cache=v2,subvolid=5,subvol=/",
			Entry{Point: "/var/lib/aenv/volumes", FSType: "btrfs", Source: "/dev/loop3", SuperOptions: "rw,space_cache=v2,subvolid=5,subvol=/"}, true,
		},
		{"garbage", Entry{}, false},
	}
	for _, tt := range tests {
		got, ok := Parse(tt.line)
		if ok != tt.ok || got != tt.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
}
