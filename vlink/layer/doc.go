// Package layer is the whole contract of a layer: what a layer's
// package implements, what its connections must do, and the registry
// (Register) through which package vlink finds it by the name a stack
// gives. A layer imports this package (and netconn, for its helpers),
// never package vlink, unless it dials through vlink itself (the
// factories that reach the nodes of a vlink network); a test in this
// package holds every other layer of the module to that.
//
// Applications never need this package: they use package vlink, which
// parses stacks and builds them out of registered layers, and exports the
// errors below under the same names (vlink.ErrAuth is ErrAuth). Importing
// github.com/vlink-dev/vlink/vlink/layers registers every layer shipped
// with vlink. The relation is that of database/sql/driver to
// database/sql.
//
// # Kinds and the registry
//
// A layer is one package that calls [Register] from its init function
// with a [Spec]: its name in stacks, its [Kind], a summary, the schema
// of its parameters ([Param]) and New, which builds it from checked
// values ([Args]). New returns what the kind implements:
//
//   - a factory ([Factory], optionally [ListenFactory]) makes the byte
//     stream at the bottom of a stack, reaching its next hop through the
//     forward [ContextDialer] it is given (nil for a terminal one, which
//     reaches the network itself);
//   - a filter ([Filter]) wraps the dialing end's connection (Client) and
//     the accepting end's (Server); the peer mirrors it. A filter that
//     needs the pre-shared key and the hello's transcript (encryption)
//     is a [HandshakeFilter];
//   - a multi-link layer ([MultiLink]) builds connections out of
//     connections of the layers below, one out of several or many over
//     one, and hands the listener's side to a [Junction];
//   - a route layer ([Route]) names a node that forwards the stream.
//
// A parameter's value is checked against its schema when a stack is
// parsed, and again by the listener against its policy: New only sees
// values within bounds, and returns errors wrapping [ErrBadParam] for
// what the schema cannot say.
//
// # The connection contract
//
// Every connection a layer returns (from Client and Server, DialContext,
// a multi-link layer's Dial and what it delivers) is handed to programs
// as a net.Conn and must be a whole one. Package
// github.com/vlink-dev/vlink/vlink/layer/layertest checks all of the
// following in one call; package vlink/layers runs it on every
// registered layer.
//
//   - net.Conn, as golang.org/x/net/nettest checks it: Read, Write,
//     Close and the deadline setters are safe for concurrent use; a
//     deadline applies to I/O already blocked; a timeout wraps
//     os.ErrDeadlineExceeded (a net.Error whose Timeout is true) and
//     leaves the connection working, so a decoder keeps a partial
//     frame's progress and a writer the unsent tail of one; Close
//     unblocks a blocked Read or Write at once; I/O after Close is
//     net.ErrClosed. A filter delegates deadlines to the connection
//     below; a layer whose I/O blocks in user space uses
//     netconn.Deadline.
//   - Errors are *net.OpError: a layer's own errors name the layer in Net
//     ("zstd") and wrap the cause with %w, so a program sees which layer
//     failed and errors.Is still finds the sentinel (ErrAuth,
//     io.ErrUnexpectedEOF, os.ErrDeadlineExceeded); an error of the
//     connection below may pass up as it is, naming its own layer. No
//     error is recognised by its text.
//   - CloseWrite ([CloseWriter]) ends the writing direction alone: the
//     peer reads every byte written, then io.EOF, and can still write
//     back. Every layer implements it, sends its end marker if it has
//     one, and half-closes the connection below.
//   - Close ends both directions as a clean end of stream: the peer reads
//     what was written, then io.EOF. A layer with an end marker sends it
//     first (in the background, bounded, as the kernel lingers on a TCP
//     close), unless a Write is in progress: then the stream was cut,
//     and no marker is sent. The connection a layer wraps is its own:
//     closing the layer's connection closes it.
//   - Abort ([Aborter], called through netconn.Abort) ends the stream as
//     a failure: the peer reads an error, never io.EOF, in either
//     direction, whether data was in flight or not. A layer with an end
//     marker closes without it and aborts the connection below; a layer
//     without one lets netconn.Abort reach the TCP connection at the
//     bottom (through Unwrapper or NetConn), which it resets. A relay or
//     a multi-link layer that fails in the middle of a stream aborts what
//     it carries.
//   - End markers: a layer that frames its stream ends it with a marker
//     of its own (an end frame, a fin block) and declares it
//     (Spec.EndMarker). A stream that ends without its marker, because
//     the connection below ended where it was cut (a killed process, a
//     middlebox), is an error (wrapping io.ErrUnexpectedEOF where the
//     layer sees the end itself), never io.EOF: a truncated stream must
//     not read as a complete one. A layer without
//     markers (identity, tcp) cannot tell the two apart, and declares
//     none.
//   - Looking below: a connection that passes bytes through unchanged
//     implements [Unwrapper], so a relay may copy from and to the one
//     below (splice(2)); one that transforms bytes must not, and
//     implements [NetConner] instead, for what looks below without
//     touching the bytes (an abort, the kernel's byte counts).
//   - io.ReaderFrom and io.WriterTo are optional; a layer implements them
//     where they save a copy, as a relay finds them by type assertion.
//
// # Handshakes
//
// A factory's own setup (a proxy's handshake, an SSH login) is bounded by
// the context it is given, or by [DefaultHandshakeTimeout] when the
// context sets no deadline, and a cancelled context interrupts blocked
// I/O (netconn.InterruptOnDone). Refusals wrap the sentinels below
// (ErrAuth, ErrNotAllowed, ErrUnreachable), so a program tells them
// apart without knowing the layer. A filter's Client and Server do not
// wait for the peer; one that must (an encryption layer's handshake) is a
// [HandshakeFilter], which package vlink runs within the dial's deadline
// and the listener's handshake timeout, with the pre-shared key and the
// transcript of the hello ([Handshake]) to bind its channel to; one that
// is a [FirstFlighter] sends its first message together with the hello
// ([FirstFlight]), which saves the keyed hello's challenge round trip and
// its own. A factory whose channel is already secured (QUIC's TLS) declares
// Spec.Encrypted, and its connections implement [ChannelBinder]. One
// whose transport also carries unreliable datagrams (QUIC's, RFC 9221)
// offers them per connection as a [DatagramCarrier], which vlink's
// datagram sessions find through [DatagramCarrierOf].
//
// # Multi-link layers
//
// A multi-link layer dials through a [Lower] (the rest of the stack down
// to the peer's listener) and, on the listener's side, takes each
// connection in Accept and gives what it builds to [Junction.Deliver];
// see [MultiLink] for the nested hello that makes those connections look
// freshly accepted, [Reserver] for holding a listener's room, and
// [EarlyDataLayer] for layers whose Dial returns before the listener
// answers.
package layer
