// Package layers registers every layer shipped with vlink. Programs that
// take stacks from users (flags, config files) import it for its side
// effect:
//
//	import _ "github.com/vlink-dev/vlink/vlink/layers"
//
// Programs that know their stacks can import just the layers they use.
package layers

import (
	_ "github.com/vlink-dev/vlink/factories/httpconnect"
	_ "github.com/vlink-dev/vlink/factories/quic"
	_ "github.com/vlink-dev/vlink/factories/rendezvous"
	_ "github.com/vlink-dev/vlink/factories/shm"
	_ "github.com/vlink-dev/vlink/factories/socks"
	_ "github.com/vlink-dev/vlink/factories/ssh"
	_ "github.com/vlink-dev/vlink/factories/tcp"
	_ "github.com/vlink-dev/vlink/filters/compress"
	_ "github.com/vlink-dev/vlink/filters/fwd"
	_ "github.com/vlink-dev/vlink/filters/identity"
	_ "github.com/vlink-dev/vlink/filters/mux"
	_ "github.com/vlink-dev/vlink/filters/noise"
	_ "github.com/vlink-dev/vlink/parallelstreams"
)
