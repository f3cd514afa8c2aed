// Package vlink builds socket-compatible connections out of stacks of
// layers: factories that make a byte stream (plain TCP, proxies, tunnels),
// filters that transform it (compression), multi-link layers that stripe
// or multiplex it, and routes that forward it.
//
// [Dial], [DialContext], [Listen] and [Dialer] are drop-in replacements for
// their namesakes in package net. With no explicit stack they follow the
// user's configuration (see [LoadConfig]); with none, they are plain TCP.
//
// A stack with filters needs a VLink peer that mirrors them: the dialer
// opens with a hello naming the layers, the listener checks it against its
// [Policy] and answers accept or a precise refusal. A plain stack sends no
// hello, so it interoperates byte for byte with any TCP server. Layers
// register themselves with [Register]; import package
// github.com/vlink-dev/vlink/vlink/layers to get every layer shipped with
// vlink.
package vlink
