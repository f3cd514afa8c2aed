// Package vio is vlink's descriptor-level socket interface: what
// event-driven programs, and the layers that run sockets over packet
// transports, are written against.
//
// Its first part is the asynchronous interface of MPICH2's sock layer
// (the seed mpich2-sock-interface.txt), as a Go program uses it over any
// net.Conn (a vlink stack, a TCP socket, a pipe). A [Set] gathers
// connections; on each [Sock] a program posts at most one read and one
// write at a time, and takes their completions as [Event] values from
// [Set.Wait], one goroutine serving many connections:
//
//   - a read is posted with a minimum and a maximum, so a protocol reads a
//     header of known size, or whatever has come up to a buffer's size,
//     without a completion per byte;
//   - the vectored forms read into, or write from, several buffers in
//     order, so a header and a payload need no copy into one buffer;
//   - a progress callback sees partial transfers before the completion;
//   - Wait takes a timeout, and [Set.Wakeup] returns a Wait from another
//     goroutine (a new post needs no wakeup: its completion does that);
//   - [Sock.PostClose] interrupts what is posted on the connection: those
//     operations complete with an error matching net.ErrClosed, then the
//     close completes, in that order;
//   - errors are values: [*OpError] names the operation, and wraps io.EOF
//     (the peer ended the stream with nothing read), io.ErrUnexpectedEOF
//     (it ended before the minimum), net.ErrClosed, or the connection's
//     own error; Wait's timeout matches os.ErrDeadlineExceeded.
//
// Each posted operation runs on a goroutine of its own, blocked in the
// connection's Read or Write: the Go runtime's poller is the progress
// engine, and a posted operation costs a goroutine while it waits.
//
// Its second part runs streams over packet transports, as PadicoTM's
// VLink_Packet does. A [MessageConn] carries whole messages, reliably and
// in order (a SOCK_SEQPACKET socket, [NewSeqPacket] on Linux; a high-speed
// network's queues); [Stream] makes a net.Conn of it with the whole
// contract: reads of any size, writes cut into messages, deadlines,
// CloseWrite, and an end that cannot be mistaken, since each message
// says whether it is data, the end of the stream or an abort. A
// transport that ends without the stream's end, or that carries an
// abort, is ErrReset for the reader, never io.EOF. A factory over a
// packet transport returns Stream of its MessageConn, and the layers
// above, and the conformance suite, see one more net.Conn.
package vio
