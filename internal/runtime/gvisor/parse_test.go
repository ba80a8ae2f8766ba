package gvisor

import (
	"slices"
	"testing"
)

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

func TestParseLockHolders(t *testing.T) {
	locks := "1: FLOCK  ADVISORY  WRITE 2254 00:19:3165 0 EOF\n" +
		"1: -> FLOCK  ADVISORY  WRITE 2255 00:19:3165 0 EOF\n" +
		"2: POSIX  ADVISORY  WRITE 999 00:19:31650 0 EOF\n" +
		"3: OFDLCK ADVISORY  READ  -1 00:19:3165 0 EOF\n" +
		"4: FLOCK  ADVISORY  WRITE 77 08:01:3165 0 EOF\n" +
		"5: FLOCK  ADVISORY  WRITE 78 08:01 3165 0 EOF\n" +
		"garbage\n"
	tests := []struct {
		ino  uint64
		want []int
	}{
		// The holder, a waiter and the same inode number on another
		// device (the caller checks what it finds); not the OFD lock.
		{3165, []int{2254, 2255, 77}},
		{31650, []int{999}},
		{316, nil},
		{1, nil},
	}
	for _, tt := range tests {
		if got := parseLockHolders(locks, tt.ino); !slices.Equal(got, tt.want) {
			t.Errorf("parseLockHolders(%d) = %v; want %v", tt.ino, got, tt.want)
		}
	}
}
