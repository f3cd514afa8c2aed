// Package shm is vlink's shared-memory factory: two processes on one
// machine exchange bytes through rings in memory both map, as
// ParaStation's pscom does within a node, rather than through the
// kernel's loopback TCP.
//
// A connection is set up on a unix socket: the dialer creates a memfd
// holding two rings (one per direction), seals its size, makes four
// eventfd doorbells, and passes the five descriptors (SCM_RIGHTS); the
// listener checks them and maps the memory. From then on a write copies
// into the ring and publishes the new end with an atomic swap, and a
// read copies out; a sleeper is woken (by a futex on the shared memory,
// or by its doorbell after a millisecond) only when it said it sleeps. The unix socket stays open beside the rings: it carries the
// end of each direction (with its byte count, so a cut stream is told
// from a whole one) and aborts, and its end tells the other side that a
// process died.
//
// Its ends follow the same rule as the framed layers' (netconn/framed):
// Close sends the end marker unless a Write is in progress, which it cuts;
// Abort sends an abort; a reader gets ErrReset, which matches
// framed.ErrReset, where the stream did not end with its marker. But not
// their code: the markers travel on the unix socket, beside the data, and
// a Write's bytes are in the peer's memory when it returns, so a Close
// has nothing to linger for and unmaps at once.
//
// The peer is another process and is not trusted: every value read from
// the shared memory is checked before use, the memory's size is sealed
// so the peer cannot shrink it under this side, and a peer that breaks
// the protocol or dies fails that connection only, with an error.
//
// An address is host:port on this machine's loopback, as for tcp: the
// listener for port P is the unix socket shm-P.sock in a folder of the
// user's own (mode 700), so only processes of the same user connect, and
// a vlink listener can take shared-memory connections on its TCP port's
// number. Processes that agree on a name instead (the ranks of a
// vlink launch job) listen and dial by it: Factory.ListenName and
// DialName, a socket NAME.sock in the same folder.
//
// Importing the package registers the layer "shm" with package vlink,
// on Linux (memfd, eventfd); elsewhere it registers nothing.
package shm
