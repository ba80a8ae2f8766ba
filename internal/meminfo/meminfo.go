// Package meminfo reads the kernel's memory counters, /proc/meminfo.
package meminfo

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Path is where Linux reports the counters.
const Path = "/proc/meminfo"

// ErrNoField is returned for a field the text does not have.
var ErrNoField = errors.New("no such field")

// Parse returns field (a name such as "MemAvailable", without the colon)
// of meminfo text: in bytes when the kernel gives it in kB (which are
// KiB), as given otherwise (counts such as HugePages_Total).
func Parse(r io.Reader, field string) (uint64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		v, err := value(strings.Fields(rest))
		if err != nil {
			return 0, fmt.Errorf("meminfo field %s: %w", field, err)
		}
		return v, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("meminfo: %w", err)
	}
	return 0, fmt.Errorf("meminfo field %s: %w", field, ErrNoField)
}

// value reads "<n>" or "<n> kB".
func value(fields []string) (uint64, error) {
	if len(fields) == 0 || len(fields) > 2 || (len(fields) == 2 && fields[1] != "kB") {
		return 0, fmt.Errorf("malformed value %q", strings.Join(fields, " "))
	}
	v, err := strconv.ParseUint(fields[0], 10, 64)
	if err != nil {
		return 0, err
	}
	if len(fields) == 1 {
		return v, nil
	}
	if v > (1<<64-1)>>10 {
		return 0, fmt.Errorf("%d kB overflows 64 bits of bytes", v)
	}
	return v << 10, nil
}

// Read returns field of this machine's counters (see Parse).
func Read(field string) (uint64, error) {
	f, err := os.Open(Path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	v, err := Parse(f, field)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", Path, err)
	}
	return v, nil
}

// ParseAll returns every well-formed field of meminfo text, valued as
// Parse values them; malformed lines are left out.
func ParseAll(r io.Reader) (map[string]uint64, error) {
	out := map[string]uint64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if v, err := value(strings.Fields(rest)); err == nil {
			out[name] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("meminfo: %w", err)
	}
	return out, nil
}

// ReadAll returns every field of this machine's counters (see ParseAll).
func ReadAll() (map[string]uint64, error) {
	f, err := os.Open(Path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	all, err := ParseAll(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", Path, err)
	}
	return all, nil
}
