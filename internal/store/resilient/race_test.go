//go:build race

package resilient_test

// raceEnabled: allocation counts mean nothing under the race detector.
const raceEnabled = true
