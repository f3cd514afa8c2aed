package vio

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
)

// seqPacket is a SOCK_SEQPACKET unix socket as a MessageConn.
type seqPacket struct {
	*net.UnixConn
	max int
}

// NewSeqPacket returns c, a connected SOCK_SEQPACKET unix socket
// ("unixpacket"), as a MessageConn of messages up to max bytes; the
// socket's send buffer must hold one.
func NewSeqPacket(c *net.UnixConn, max int) MessageConn { return &seqPacket{c, max} }

func (c *seqPacket) MaxMessage() int { return c.max }

func (c *seqPacket) ReadMessage(p []byte) (int, error) {
	n, _, flags, _, err := c.UnixConn.ReadMsgUnix(p, nil)
	switch {
	case errors.Is(err, io.EOF):
		return 0, io.EOF
	case err != nil:
		return n, err
	case flags&syscall.MSG_TRUNC != 0:
		// The kernel cut a message longer than p: never pass that on.
		return 0, fmt.Errorf("%w: a message longer than %d bytes", ErrMessage, len(p))
	case n == 0:
		return 0, io.EOF // what a seqpacket socket reads at the peer's close
	}
	return n, nil
}

func (c *seqPacket) WriteMessage(p []byte) error {
	_, err := c.UnixConn.Write(p)
	return err
}
