// Package control is the control channel of a vlink network: the
// messages nodes exchange through a relay to find and reach each other
// (reverse, spliced and relayed connections are built on it), open to
// programs for their own messages too.
//
// A node ([Connect]) keeps one outbound connection to a relay ([Relay],
// `vlink relay`): a VLink connection whose hello proved the node's
// certificate, signed by the network's owner (Config.Member), or its key
// derived from a network key (vlink.NodeKey), encrypted by the noise
// layer. Between members, the relay holds no key of theirs: connections
// between nodes are secured end to end by the nodes' own keys. The relay registers the
// node under the name it proved, so no node can send or answer as
// another, and keeps a directory of who is online and from which
// address ([Node.Lookup]). The node pings, and reconnects with backoff
// when the connection fails; its handlers and name survive a relay's
// restart. Several relays of one owner form one network
// (RelayConfig.Peers): they announce their nodes to each other and pass
// on messages and connections between nodes registered with different
// relays, still encrypted end to end.
//
// Messaging follows Paradis-Net. Messages are typed; a program registers
// a [Handler] per type and never calls receive: handlers run in
// goroutines of their own, may take their time and may send. A message
// of a type with no handler yet is kept, within bounds, for the handler
// [Node.Handle] registers later, as a socket's receive buffer keeps what
// the program has not read: a program may Connect, then Handle, and miss
// nothing sent to it in between. [Node.Send] sends; [Message.Reply]
// answers; [Message.Forward] delegates a request to another node, which
// answers the origin directly. A [Cooperation] ties requests to the
// replies they expect: its token travels with them, and the replies fill
// it instead of reaching a handler. Wait (with a context for the
// timeout), Finished (poll) and Cancel end it; one cooperation sending
// to several nodes and expecting a reply from each is scatter/gather.
//
// Everything that arrives is untrusted: frames are bounded (MaxPayload),
// decoded strictly (a malformed frame ends the connection that sent it),
// the relay bounds what it queues per node and in total, answering busy
// rather than buffering, and a node bounds what it keeps for handlers to
// come, dropping the oldest.
package control
