//go:build !race

package lru_test

const raceEnabled = false
