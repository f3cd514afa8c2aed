package parallelstreams

import "sync/atomic"

// Stats are the package's counts since the process started, over every
// session: what a metrics endpoint exports (vlink serve --metrics).
type Stats struct {
	Sessions     uint64 // sessions started, either side
	SessionsOpen int64  // sessions not yet torn down
	Substreams   uint64 // TCP connections put to work in sessions
	// OutOfOrder counts data blocks that arrived ahead of one sent
	// before them, and so waited in the reorder table: the price of
	// spreading one stream over several connections.
	OutOfOrder uint64
}

var stats struct {
	sessions, ended, substreams, outOfOrder atomic.Uint64
}

// ReadStats returns the counts so far.
func ReadStats() Stats {
	// ended first: a session that ends between the two loads must not
	// count as open twice, nor below zero.
	ended := stats.ended.Load()
	started := stats.sessions.Load()
	return Stats{Sessions: started, SessionsOpen: int64(started - ended),
		Substreams: stats.substreams.Load(), OutOfOrder: stats.outOfOrder.Load()}
}
