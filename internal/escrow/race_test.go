//go:build race

package escrow

const raceEnabled = true
