package store

import "testing"

func TestTemplateSizeFor(t *testing.T) {
	rootfs := &Template{Kind: KindRootfs, MemoryMB: 512, VCPU: 2}
	bare := &Template{Kind: KindRootfs}
	snapshot := &Template{Kind: KindSnapshot, MemoryMB: 256, VCPU: 1}
	for _, tc := range []struct {
		name             string
		tpl              *Template
		memoryMB, vcpus  int
		wantMB, wantCPUs int
	}{
		{"a template's size", rootfs, 0, 0, 512, 2},
		{"what the create asks", rootfs, 1024, 4, 1024, 4},
		{"half asked", rootfs, 0, 4, 512, 4},
		{"a template of no size", bare, 0, 0, 0, 0},
		{"a snapshot's own, whatever is asked", snapshot, 4096, 8, 256, 1},
		{"no template known", nil, 2048, 0, 2048, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mb, cpus := tc.tpl.SizeFor(tc.memoryMB, tc.vcpus)
			if mb != tc.wantMB || cpus != tc.wantCPUs {
				t.Errorf("SizeFor(%d, %d) = %d MiB, %d vCPUs; want %d, %d", tc.memoryMB, tc.vcpus, mb, cpus, tc.wantMB, tc.wantCPUs)
			}
		})
	}
}
