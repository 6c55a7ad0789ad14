//go:build !race

package escrow

const raceEnabled = false
