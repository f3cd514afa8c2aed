//go:build !linux

package compress

import (
	"net"
	"syscall"
)

// Only Linux has splice(2): elsewhere payloads go through the process.
func spliceSocket(net.Conn) syscall.RawConn { return nil }

func spliceReadable(net.Conn, syscall.RawConn) (int64, error) { panic("unreachable") }

func (c *conn) spliceBlock(net.Conn, syscall.RawConn, int, bool) (int, int, error) {
	panic("unreachable")
}

func (c *conn) spliceRaw(net.Conn, syscall.RawConn) (int, error) { panic("unreachable") }

func (c *conn) readNow(net.Conn, syscall.RawConn, []byte) (int, error) { panic("unreachable") }
