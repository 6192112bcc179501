//go:build race

package chaos

// RaceEnabled reports whether this binary was built with the race detector.
const RaceEnabled = true
