package meminfo

import (
	"errors"
	"strings"
	"testing"
	"testing/iotest"
)

// sample has lines as Linux writes them, in its order.
const sample = `MemTotal:        8136412 kB
MemFree:          401232 kB
MemAvailable:    5273008 kB
Buffers:          212968 kB
Cached:          4640748 kB
SwapCached:            0 kB
Active:          2513136 kB
Inactive:        4231052 kB
Active(anon):       6604 kB
Inactive(anon):  1986232 kB
HugePages_Total:       4
HugePages_Free:        4
Hugepagesize:       2048 kB
`

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, text, field string
		want              uint64
		wantErr           error // nil: none; errAny: a malformed value
	}{
		{"total", sample, "MemTotal", 8136412 << 10, nil},
		{"available", sample, "MemAvailable", 5273008 << 10, nil},
		{"zero", sample, "SwapCached", 0, nil},
		{"a count has no unit", sample, "HugePages_Total", 4, nil},
		{"the last line", sample, "Hugepagesize", 2048 << 10, nil},
		{"a name with parentheses", sample, "Active(anon)", 6604 << 10, nil},
		{"a name that begins another", "Active(anon): 1 kB\nActive: 2 kB\n", "Active", 2 << 10, nil},
		{"a prefix is not a field", sample, "Mem", 0, ErrNoField},
		{"names are case-sensitive", sample, "memtotal", 0, ErrNoField},
		{"the colon is not part of the name", sample, "MemTotal:", 0, ErrNoField},
		{"empty text", "", "MemTotal", 0, ErrNoField},
		{"no trailing newline", "MemTotal: 1024 kB", "MemTotal", 1 << 20, nil},
		{"not a number", "MemTotal: lots kB\n", "MemTotal", 0, errAny},
		{"negative", "MemTotal: -1 kB\n", "MemTotal", 0, errAny},
		{"another unit", "MemTotal: 8 MB\n", "MemTotal", 0, errAny},
		{"no value", "MemTotal:\n", "MemTotal", 0, errAny},
		{"too many words", "MemTotal: 8 kB kB\n", "MemTotal", 0, errAny},
		{"too big for bytes", "MemTotal: 18014398509481984 kB\n", "MemTotal", 0, errAny},
		{"the largest that fits", "MemTotal: 18014398509481983 kB\n", "MemTotal", 18014398509481983 << 10, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(tc.text), tc.field)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("error %v, want %d", err, tc.want)
			case tc.wantErr == errAny && (err == nil || errors.Is(err, ErrNoField)):
				t.Fatalf("got %d, %v; want a malformed-value error", got, err)
			case tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Fatalf("got %d, %v; want %v", got, err, tc.wantErr)
			case err == nil && got != tc.want:
				t.Fatalf("got %d, want %d", got, tc.want)
			}
		})
	}
}

var errAny = errors.New("any error")

func TestParseReadError(t *testing.T) {
	boom := errors.New("boom")
	if _, err := Parse(iotest.ErrReader(boom), "MemTotal"); !errors.Is(err, boom) {
		t.Fatalf("error %v, want one wrapping %v", err, boom)
	}
}

// Read works on this machine (every supported host is Linux).
func TestRead(t *testing.T) {
	total, err := Read("MemTotal")
	if err != nil {
		t.Fatal(err)
	}
	avail, err := Read("MemAvailable")
	if err != nil {
		t.Fatal(err)
	}
	if total == 0 || avail > total {
		t.Fatalf("MemTotal %d, MemAvailable %d", total, avail)
	}
	if _, err := Read("NoSuchField"); !errors.Is(err, ErrNoField) {
		t.Fatalf("missing field: %v", err)
	}
}

// ParseAll values every field as Parse does and leaves malformed lines out.
func TestParseAll(t *testing.T) {
	all, err := ParseAll(strings.NewReader(sample + "Broken: x kB\nNoColon 5 kB\n"))
	if err != nil {
		t.Fatal(err)
	}
	for field, want := range map[string]uint64{"MemTotal": 8136412 << 10, "Cached": 4640748 << 10,
		"HugePages_Total": 4, "Active(anon)": 6604 << 10} {
		if all[field] != want {
			t.Errorf("%s = %d, want %d", field, all[field], want)
		}
		if one, err := Parse(strings.NewReader(sample), field); err != nil || one != want {
			t.Errorf("Parse(%s) = %d %v, ParseAll %d", field, one, err, want)
		}
	}
	if _, ok := all["Broken"]; ok {
		t.Error("a malformed line was kept")
	}
	if len(all) != 13 {
		t.Errorf("%d fields, want the sample's 13", len(all))
	}
	if _, err := ParseAll(iotest.ErrReader(errors.New("boom"))); err == nil {
		t.Error("a read error was not reported")
	}
}
