// Package vlink builds socket-compatible connections out of stacks of
// layers: factories that make a byte stream (plain TCP, proxies, tunnels),
// filters that transform it (compression), and multi-link layers that
// stripe or multiplex it.
//
// [Dial], [DialContext], [Listen] and [Dialer] are drop-in replacements for
// their namesakes in package net. With no explicit stack they follow the
// user's configuration (see [LoadConfig]); with none, they are plain TCP.
//
// A stack with filters needs a VLink peer that mirrors them: the dialer
// opens with a hello naming the layers, the listener checks it against its
// [Policy] and answers accept or a precise refusal. A plain stack sends no
// hello, so it interoperates byte for byte with any TCP server.
//
// Layers are found by name in a registry: import package
// github.com/vlink-dev/vlink/vlink/layers to get every layer shipped with
// vlink. Writing a layer of one's own is the business of package
// github.com/vlink-dev/vlink/vlink/layer, which this package's users never
// need.
package vlink
