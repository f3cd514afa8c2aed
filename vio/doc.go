// Package vio is vlink's posted, asynchronous socket interface, for
// event-driven programs: one goroutine serves many connections by posting
// operations and taking their completions, instead of a goroutine
// blocked in each connection's Read.
//
// It is the asynchronous interface of MPICH2's sock layer (the seed
// mpich2-sock-interface.txt), as a Go program uses it over any net.Conn
// and net.Listener (a vlink stack, a TCP socket, a pipe). A [Set]
// gathers connections and listeners; a program posts operations on them
// and takes their completions as [Event] values from [Set.Wait], and
// needs nothing else:
//
//   - [Set.AddListener] puts a listener in the set (the seed's listen);
//     [Listener.PostAccept] posts an accept, which completes as an
//     OpAccept event carrying the new [Sock];
//   - [Set.PostConnect] dials through any dialer with DialContext
//     (net.Dialer, vlink.Dialer) and returns the Sock at once; the dial
//     completes as an OpConnect event on it (the seed's post_connect);
//     [Set.Add] takes a connection made otherwise;
//   - on each Sock a program posts at most one read and one write at a
//     time; a read is posted with a minimum and a maximum, so a protocol
//     reads a header of known size, or whatever has come up to a buffer's
//     size, without a completion per byte;
//   - the vectored forms read into, or write from, several buffers in
//     order, so a header and a payload need no copy into one buffer;
//   - a progress callback sees partial transfers before the completion;
//   - Wait takes a timeout, and [Set.Wakeup] returns a Wait from another
//     goroutine (a new post needs no wakeup: its completion does that);
//   - [Sock.PostClose] and [Listener.PostClose] interrupt what is posted
//     (a read, a write, a connect, an accept): those operations complete
//     with an error matching net.ErrClosed, then the close completes, in
//     that order; [Set.Close] closes everything;
//   - errors are values: [*OpError] names the operation, and wraps io.EOF
//     (the peer ended the stream with nothing read), io.ErrUnexpectedEOF
//     (it ended before the minimum), net.ErrClosed, or the connection's,
//     listener's or dialer's own error; Wait's timeout matches
//     os.ErrDeadlineExceeded.
//
// Each posted operation runs on a goroutine of its own, blocked in the
// connection's Read or Write, the listener's Accept or the dialer: the
// Go runtime's poller is the progress engine, and a posted operation
// costs a goroutine while it waits.
//
// [Stream] is the other half of the package: a net.Conn over a transport
// that carries messages rather than a byte stream (a SOCK_SEQPACKET
// socket, [NewSeqPacket] on Linux; a high-speed network's queues), as
// PadicoTM's VLink_Packet makes streams of packets. Each message says
// whether it is data, the end of the stream or an abort, and its ends are
// the framed layers' (netconn/framed), so a transport that ends without
// the stream's end, or an abort, is [ErrReset] for the reader, never
// io.EOF. No shipped factory uses it today: shm moves bytes through rings
// of its own, quic through QUIC's streams, both byte streams with their
// own ends. Stream is for the first factory over a message transport,
// which then returns Stream of its MessageConn, and the layers above,
// and the conformance suite, see one more net.Conn.
package vio
