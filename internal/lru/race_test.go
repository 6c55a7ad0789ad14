//go:build race

package lru_test

// raceEnabled: the race detector allocates on its own account.
const raceEnabled = true
