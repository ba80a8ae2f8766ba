// Package mountinfo reads the mount table of this process's mount
// namespace, /proc/self/mountinfo (proc(5)), as far as aenv needs it.
package mountinfo

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// Entry is the part of a mountinfo line aenv needs.
type Entry struct {
	Point        string // where it is mounted
	FSType       string
	Source       string // the device, or what stands for one
	SuperOptions string
}

// Read lists the mounts, in the table's order (a later mount on the same
// point is above an earlier one).
func Read() ([]Entry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var out []Entry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if m, ok := Parse(sc.Text()); ok {
			out = append(out, m)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return out, nil
}

// Parse parses one line as documented in proc(5):
// id parent major:minor root point options [optional...] - fstype source superoptions
func Parse(line string) (Entry, bool) {
	before, after, ok := strings.Cut(line, " - ")
	if !ok {
		return Entry{}, false
	}
	left, right := strings.Fields(before), strings.Fields(after)
	if len(left) < 5 || len(right) < 3 {
		return Entry{}, false
	}
	return Entry{Point: unescape(left[4]), FSType: right[0], Source: unescape(right[1]), SuperOptions: right[2]}, true
}

// unescape undoes the octal escapes (\040 for space, ...) the kernel uses
// in mountinfo paths.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
