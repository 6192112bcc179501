package ddblease

import (
	"testing"
	"time"
)

// runIDOfSK inverts runSK for schedule slots and triggered runs alike,
// and refuses what is no run's sort key.
func TestRunIDOfSK(t *testing.T) {
	at := time.Date(2026, 11, 30, 2, 0, 0, 500_000_000, time.UTC)
	for _, c := range []struct {
		sk, want string
	}{
		{runSK(at, ""), "2026-11-30T02:00:00.5Z"},
		{runSK(at, "00000000000000aa"), "2026-11-30T02:00:00.5Z#trigger-00000000000000aa"},
		{runSK(time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), ""), "0001-01-01T00:00:00Z"},
	} {
		got, err := runIDOfSK(c.sk)
		if err != nil || got != c.want {
			t.Errorf("runIDOfSK(%q) = %q, %v; want %q", c.sk, got, err, c.want)
		}
		if sk, err := runSKOf(got); err != nil || sk != c.sk {
			t.Errorf("runSKOf(%q) = %q, %v; want %q", got, sk, err, c.sk)
		}
	}
	for _, sk := range []string{"", "lease", "run#", "run#2026-11-30T02:00:00Z", "run#2026-11-30T02:00:00.500000000Z#trigger-xyz",
		"run#2026-11-30T02:00:00.500000000Z#other", "job#2026-11-30T02:00:00.500000000Z"} {
		if id, err := runIDOfSK(sk); err == nil {
			t.Errorf("runIDOfSK(%q) = %q, want an error", sk, id)
		}
	}
}
