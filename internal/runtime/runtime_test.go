package runtime

import (
	"os"
	"path/filepath"
	"testing"
)

func TestValidateID(t *testing.T) {
	tests := []struct {
		id string
		ok bool
	}{
		{"abcdefghij0123456789", true},
		{"abcdefghij012345678", false},
		{"abcdefghij0123456789x", false},
		{"abcdefghij012345678/", false},
		{"abcdefghij012345678.", false},
		{"Abcdefghij0123456789", false},
		{"", false},
	}
	for _, tt := range tests {
		if err := ValidateID(tt.id); (err == nil) != tt.ok {
			t.Errorf("ValidateID(%q) = %v; want ok=%v", tt.id, err, tt.ok)
		}
	}
}

func TestPrepareRootfs(t *testing.T) {
	root := t.TempDir()
	if err := CheckRootfs(root); err == nil {
		t.Fatal("CheckRootfs accepts an unprepared rootfs")
	}
	for range 2 { // idempotent
		if err := PrepareRootfs(root); err != nil {
			t.Fatal(err)
		}
	}
	if err := CheckRootfs(root); err != nil {
		t.Fatalf("CheckRootfs after PrepareRootfs: %v", err)
	}
	// A directory (or anything but a regular file) is no mount point for
	// the envd binary.
	other := t.TempDir()
	if err := os.MkdirAll(filepath.Join(other, EnvdMountPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := CheckRootfs(other); err == nil {
		t.Error("CheckRootfs accepts a directory at the envd mount point")
	}
}
