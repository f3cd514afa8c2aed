//go:build !race

package netconn

const raceEnabled = false
