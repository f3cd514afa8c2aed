// Package quic is vlink's reliable-UDP factory: QUIC (RFC 9000, through
// github.com/quic-go/quic-go) for lossy, high-latency paths, where one
// TCP flow's congestion control and head-of-line blocking cost most. It
// is the udp-conduit idea of GASNet with a well-kept implementation in
// place of a home-made protocol.
//
// One QUIC connection per path (remote address and options) is made by
// the first dial that needs it and shared by every later one; each
// vlink connection is a bidirectional stream on it, so filters, hellos
// and multi-link layers stack on a stream as on a TCP connection. A
// stream has the whole net.Conn contract: deadlines, CloseWrite (the
// stream's FIN), and Abort, which resets the stream so the peer reads an
// error. A stream ends cleanly only with its FIN; a reset, or the path
// going silent for the idle timeout (a black hole, a killed peer), is an
// error for every stream on it, never a clean end.
//
// A listener takes QUIC on the UDP port of the same number as a vlink
// listener's TCP port (vlink.ListenConfig.Quic, vlink serve --quic).
//
// QUIC runs in this process, not in the kernel: what a stream sent is
// retransmitted by this process until the peer acknowledges it, and
// closing the QUIC connection drops what is still unacknowledged. So
// each end tells the other which streams it is done reading (read to
// their end, closed or aborted) on a unidirectional stream of its own:
// read receipts, the TLS application protocol vlink/2. Close and
// CloseWrite return at once, as TCP's do. CloseAll, which programs call
// at exit, first waits, at most ExitWait (3 s) in all, until every
// stream this process ended with Close or CloseWrite has its receipt or
// its connection ended; a closed listener closes an accepted connection
// a second after its last stream ended, and not before its receipts came
// (at most ExitWait); a dialer's idle path lingers on while a receipt is
// awaited. Abort, and a Close that cuts a blocked Write short, reset the
// stream: nothing waits for them. Past ExitWait (a dead peer, or one
// that does not read), with a peer that speaks only vlink/1 (no
// receipts; still accepted both ways), or in a program that exits
// without CloseAll, unacknowledged bytes go with the process, where
// TCP's kernel would still deliver them; the peer then sees the path
// fail (an error, never a clean end).
//
// # Datagrams
//
// Both ends enable QUIC datagrams (RFC 9221). Where the peer did too,
// each stream is a layer.DatagramCarrier: SendDatagram and
// ReceiveDatagram carry unreliable datagrams of the stream's own beside
// its bytes, each DATAGRAM frame naming its stream by ID (a QUIC
// varint) before the datagram. One goroutine per connection queues
// them on their streams, bounded (1024 datagrams a stream, 8 MiB a
// connection); what has no open stream, finds its queue full or is
// malformed is dropped and counted (DatagramsDropped). vlink's datagram
// sessions (netconn/dgram.NewConnOver) use them for the datagrams that
// fit a packet (MaxDatagram). QUIC's TLS encrypts and authenticates
// them; the filters stacked on the stream do not apply to them.
//
// # Trust
//
// QUIC always runs TLS 1.3. Authentication stays the stack's: the
// listener presents a certificate of its own (generated at Listen, or
// kept in the file its cert parameter names), and the dialer checks it
// in one of two ways:
//
//   - pin: the SHA-256 of the listener's public key, as the listener
//     logs it; any other key is refused before a byte of the stream is
//     sent;
//   - the hello's key: each stream offers the TLS exporter of its QUIC
//     connection as a channel binding (ChannelBinding), and the vlink
//     hello covers it with both proofs of the pre-shared key, so a
//     dialer and a listener holding the key see a man in the middle of
//     the QUIC connection as a failed proof.
//
// Without a pin and without a key nothing is authenticated, as over a
// tcp stack without a key.
//
// Importing the package registers the layer "quic" with package vlink.
package quic
