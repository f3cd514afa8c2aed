// Package netconn makes vlink connections first-class net.Conn and
// net.Listener values: relaying, conn wrappers, deadlines and interrupts,
// the pacing of accept loops.
//
// [Relay] joins two connections, as a tunnel, a forwarder or a proxy does.
// Between two TCP connections it moves the bytes inside the kernel (the
// zero-copy path: splice(2) on Linux), and an idle relay holds no buffer,
// so a process can carry many thousands of idle connections.
package netconn
