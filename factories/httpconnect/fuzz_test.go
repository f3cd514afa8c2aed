package httpconnect

import (
	"bytes"
	"testing"
)

// FuzzReadResponse feeds arbitrary proxy answers to the response reader:
// it must never panic, never read past MaxHeaderBytes, and give back the
// bytes after a 2xx header untouched.
func FuzzReadResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
	f.Add([]byte("HTTP/1.0 200 OK\r\nProxy-agent: x\r\n\r\nSSH-2.0-x\r\n"))
	f.Add([]byte("HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"))
	f.Add([]byte("\x00\xff garbage"))
	f.Fuzz(func(t *testing.T, answer []byte) {
		r := bytes.NewReader(answer)
		rest, err := readResponse(r)
		read := len(answer) - r.Len()
		if read > MaxHeaderBytes {
			t.Fatalf("read %d bytes, more than %d", read, MaxHeaderBytes)
		}
		if err != nil {
			return
		}
		// Everything read and not part of the header comes back.
		i := bytes.Index(answer, []byte("\n\r\n"))
		j := bytes.Index(answer, []byte("\n\n"))
		if i < 0 && j < 0 {
			t.Fatalf("accepted an answer with no end of header: %q", answer)
		}
		if !bytes.HasSuffix(answer[:read], rest) {
			t.Fatalf("rest %q is not the tail of what was read %q", rest, answer[:read])
		}
	})
}
