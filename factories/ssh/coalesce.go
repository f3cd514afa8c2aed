package ssh

import (
	"encoding/binary"
	"net"
	"sync"
)

// gcmCiphers are the ciphers whose packets have a plaintext length and a
// 16-byte tag, so their boundaries can be found in the byte stream.
var gcmCiphers = map[string]bool{"aes128-gcm@openssh.com": true, "aes256-gcm@openssh.com": true}

// maxFrame bounds a packet the framer accepts; anything larger means the
// framer lost track, and it steps aside.
const maxFrame = 1 << 20

// A framer sends each SSH packet x/crypto/ssh writes in one write(2).
//
// x/crypto/ssh writes an AES-GCM packet as a 4-byte length and then the
// rest through a 4 KiB bufio.Writer, which makes two system calls of each
// 32 KiB packet: 4 KiB, then the remainder. The framer follows the
// packet boundaries (the version line, clear-text packets up to our
// NEWKEYS, then GCM packets: length, length bytes, 16-byte tag), holds
// the first piece of a packet and writes it with the rest in one writev.
// x/crypto/ssh always writes a whole packet before it returns, so
// nothing is held across packets. It is used only when every cipher
// offered is GCM (anything else encrypts the length), and steps aside
// for good the moment the stream does not parse.
type framer struct {
	mu      sync.Mutex // x/crypto/ssh serializes writes; this is for state()
	conn    net.Conn
	off     bool   // stepped aside: pass writes through
	banner  bool   // the version line was written
	keyed   bool   // our NEWKEYS was written: packets carry a 16-byte tag
	hdr     []byte // the length prefix (and type byte) read so far
	left    int    // bytes left in the current packet after hdr
	held    []byte // bytes of the current packet not yet written
	pending net.Buffers
	scratch []byte
	holds   [2][]byte
	flip    int
}

// write sends p, holding the start of a packet until its end arrives.
func (f *framer) write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return f.conn.Write(p)
	}
	n := len(p)
	f.pending = f.pending[:0]
	if len(f.held) > 0 {
		f.pending = append(f.pending, f.held)
	}
	rest := p
	for len(rest) > 0 && !f.off {
		if !f.banner {
			i := 0
			for i < len(rest) && rest[i] != '\n' {
				i++
			}
			if i < len(rest) {
				i++
				f.banner = true
			}
			f.pending = append(f.pending, rest[:i])
			rest = rest[i:]
			continue
		}
		if f.left == 0 {
			// Read the length (and the message type of a clear-text
			// packet, to see our NEWKEYS).
			need := 4
			if !f.keyed {
				need = 6
			}
			take := min(need-len(f.hdr), len(rest))
			f.hdr = append(f.hdr, rest[:take]...)
			f.pending = append(f.pending, rest[:take])
			rest = rest[take:]
			if len(f.hdr) < need {
				continue
			}
			length := int(binary.BigEndian.Uint32(f.hdr))
			if length < need-4 || length > maxFrame {
				f.off = true
				break
			}
			if !f.keyed {
				f.left = length - (need - 4)
				if f.hdr[5] == 21 { // msgNewKeys: from the next packet on, GCM
					f.keyed = true
				}
			} else {
				f.left = length + 16
			}
			f.hdr = f.hdr[:0]
			if f.left == 0 {
				continue
			}
		}
		take := min(f.left, len(rest))
		f.pending = append(f.pending, rest[:take])
		rest = rest[take:]
		f.left -= take
	}
	if f.off {
		f.pending = append(f.pending, rest)
	}
	if !f.off && (f.left > 0 || len(f.hdr) > 0) {
		// A packet is under way: keep its bytes (p is the caller's
		// buffer, reused after we return) for the write that ends it.
		// Two buffers in turn: pending may still point into the one
		// held last time.
		f.flip ^= 1
		keep := f.holds[f.flip][:0]
		for _, b := range f.pending {
			keep = append(keep, b...)
		}
		f.held, f.holds[f.flip] = keep, keep
		return n, nil
	}
	f.held = nil
	if len(f.pending) == 1 {
		_, err := f.conn.Write(f.pending[0])
		return n, err
	}
	if _, ok := f.conn.(*net.TCPConn); ok {
		bufs := f.pending // writev(2)
		_, err := bufs.WriteTo(f.conn)
		return n, err
	}
	// Another layer below (SSH over SSH, over SOCKS): one write of the
	// joined pieces is cheaper than one per piece.
	f.scratch = f.scratch[:0]
	for _, b := range f.pending {
		f.scratch = append(f.scratch, b...)
	}
	_, err := f.conn.Write(f.scratch)
	return n, err
}

// state reports whether the framer stepped aside and whether it saw our
// NEWKEYS.
func (f *framer) state() (off, keyed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.off, f.keyed
}
