package layertest

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// testHandshake is what TestFilter hands a layer.HandshakeFilter on
// both ends unless Options.Handshake says otherwise: the same key and
// transcript, as after a hello authenticated with the key.
var testHandshake = layer.Handshake{
	Key:        []byte("layertest pre-shared key"),
	Transcript: []byte("layertest: the hello's messages"),
}

// TestFilter runs the suite (TestConn) on f, over pairs of loopback TCP
// connections: f.Client wraps the dialing end, f.Server the accepting
// one (ClientHandshake and ServerHandshake with Options.Handshake for a
// layer.HandshakeFilter). Its pipes cut a stream by half-closing the TCP
// connection below the layer (a FIN), so the truncation check runs.
func TestFilter(t *testing.T, f layer.Filter, opts Options) {
	hs := opts.Handshake
	if hs.Key == nil && hs.Transcript == nil {
		hs = testHandshake
	}
	TestConn(t, func() (Pipe, error) { return filterPipe(f, hs) }, opts)
}

// filterPipe makes a pair of loopback TCP connections and wraps them
// with f, both ends at once (a handshake needs both).
func filterPipe(f layer.Filter, hs layer.Handshake) (Pipe, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Pipe{}, err
	}
	defer l.Close()
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := l.Accept()
		ch <- accepted{c, err}
	}()
	rawD, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		l.Close()
		<-ch
		return Pipe{}, err
	}
	acc := <-ch
	if acc.err != nil {
		rawD.Close()
		return Pipe{}, acc.err
	}
	rawA := acc.c
	type wrapped struct {
		c   net.Conn
		err error
	}
	server := make(chan wrapped, 1)
	go func() {
		var w wrapped
		if hf, ok := f.(layer.HandshakeFilter); ok {
			w.c, w.err = hf.ServerHandshake(rawA, hs)
		} else {
			w.c, w.err = f.Server(rawA)
		}
		server <- w
	}()
	var d net.Conn
	if hf, ok := f.(layer.HandshakeFilter); ok {
		d, err = hf.ClientHandshake(rawD, hs)
	} else {
		d, err = f.Client(rawD)
	}
	if err != nil {
		rawD.Close() // fails the server's side too
	}
	s := <-server
	if err != nil || s.err != nil {
		rawD.Close()
		rawA.Close()
		if d != nil {
			d.Close()
		}
		if s.c != nil {
			s.c.Close()
		}
		var errs []error
		if err != nil {
			errs = append(errs, fmt.Errorf("client end: %w", err))
		}
		if s.err != nil {
			errs = append(errs, fmt.Errorf("server end: %w", s.err))
		}
		return Pipe{}, errors.Join(errs...)
	}
	return Pipe{
		Dialer:   d,
		Acceptor: s.c,
		Stop: func() {
			d.Close()
			s.c.Close()
			rawD.Close()
			rawA.Close()
		},
		Cut: func(from net.Conn) error {
			raw := rawA
			if from == d {
				raw = rawD
			}
			return raw.(*net.TCPConn).CloseWrite()
		},
	}, nil
}
