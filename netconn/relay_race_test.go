//go:build race

package netconn

// raceEnabled: the race detector multiplies memory use, so memory bounds
// are not checked under it.
const raceEnabled = true
