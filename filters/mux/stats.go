package mux

import "sync/atomic"

// Stats are the package's counts since the process started, over every
// session, dialing and accepting: what a metrics endpoint exports (vlink
// serve --metrics).
type Stats struct {
	Sessions     uint64 // sessions started: connections below carrying streams
	SessionsOpen int64  // sessions not yet closed
	Streams      uint64 // streams opened or accepted: the connections carried
	StreamsOpen  int64  // streams not yet closed
}

var stats struct {
	sessions, sessionsEnded, streams, streamsEnded atomic.Uint64
}

// ReadStats returns the counts so far.
func ReadStats() Stats {
	// The ends first, so that one between the loads never makes a
	// negative count.
	se, te := stats.sessionsEnded.Load(), stats.streamsEnded.Load()
	s, t := stats.sessions.Load(), stats.streams.Load()
	return Stats{Sessions: s, SessionsOpen: int64(s - se), Streams: t, StreamsOpen: int64(t - te)}
}
