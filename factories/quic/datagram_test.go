package quic

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/quicvarint"

	"github.com/vlink-dev/vlink/netconn/dgram"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// lossyPair returns a stream's two ends, the dialer's first, on a path
// through a relay that loses loss datagrams in a thousand each way,
// once the stream is open.
func lossyPair(t *testing.T, loss int32) (*conn, *conn) {
	t.Helper()
	f := newFactory(t, Options{})
	l := listen(t, f)
	r := newUDPRelay(t, l.Addr().String())
	acc := acc2(l)
	a, err := f.DialContext(context.Background(), "tcp", r.pc.LocalAddr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := <-acc
	if b == nil {
		t.Fatal("no stream accepted")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	r.loss.Store(loss)
	return a.(*conn), b.(*conn)
}

// Both ends offer datagrams: each stream carries its own, found through
// layer.DatagramCarrierOf, and a stream's datagrams reach only the other
// end of that stream.
func TestDatagramsPerStream(t *testing.T) {
	f := newFactory(t, Options{})
	l := listen(t, f)
	var ends [2][2]net.Conn
	for i := range ends {
		a, b, err := pair(t, f, l)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		defer b.Close()
		ends[i] = [2]net.Conn{a, b}
	}
	for i, e := range ends {
		ca, cb := layer.DatagramCarrierOf(e[0]), layer.DatagramCarrierOf(e[1])
		if ca == nil || cb == nil {
			t.Fatalf("stream %d: no datagram carrier (%v, %v)", i, ca, cb)
		}
		if m := ca.MaxDatagram(); m < 1100 || m > 1500 {
			t.Errorf("MaxDatagram %d, want a packet's worth", m)
		}
		if err := ca.SendDatagram([]byte{byte(i), 'x'}); err != nil {
			t.Fatal(err)
		}
	}
	for i, e := range ends {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		d, err := layer.DatagramCarrierOf(e[1]).ReceiveDatagram(ctx)
		cancel()
		if err != nil || !bytes.Equal(d, []byte{byte(i), 'x'}) {
			t.Fatalf("stream %d got %q, %v", i, d, err)
		}
	}
	c := layer.DatagramCarrierOf(ends[0][0])
	if err := c.SendDatagram(make([]byte, 1<<14)); !errors.Is(err, layer.ErrDatagramTooLarge) {
		t.Errorf("a datagram of 16 KiB: %v, want ErrDatagramTooLarge", err)
	}
	// A closed stream's reader returns, and datagrams for it are dropped.
	r := layer.DatagramCarrierOf(ends[1][1])
	done := make(chan error, 1)
	go func() {
		_, err := r.ReceiveDatagram(context.Background())
		done <- err
	}()
	ends[1][1].Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("ReceiveDatagram on a closed stream: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ReceiveDatagram goes on after Close")
	}
}

// A peer that takes no datagrams: the stream reports none, and
// DatagramCarrierOf finds no carrier.
func TestNoDatagramsFromPeer(t *testing.T) {
	f := newFactory(t, Options{})
	l := listen(t, f)
	udp, err := net.ListenUDP("udp", nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: udp}
	defer udp.Close()
	defer tr.Close()
	cfg := f.config()
	cfg.EnableDatagrams = false
	acc := acc2(l)
	qc, err := tr.Dial(context.Background(), l.Addr().(*net.UDPAddr), &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: f.protos, ServerName: "vlink", InsecureSkipVerify: true}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer qc.CloseWithError(0, "")
	s, err := qc.OpenStreamSync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte{streamOpen})
	b := <-acc
	if b == nil {
		t.Fatal("no stream accepted")
	}
	defer b.Close()
	if c := layer.DatagramCarrierOf(b); c != nil {
		t.Fatalf("a carrier (max %d) where the peer takes no datagrams", c.MaxDatagram())
	}
}

// stamp makes datagram i of n bytes: its index, then bytes derived from
// it, then their SHA-256, so the receiver checks boundaries and content.
func stamp(i, n int) []byte {
	d := make([]byte, n)
	binary.BigEndian.PutUint32(d, uint32(i))
	for j := 4; j < n-32; j++ {
		d[j] = byte(i*31 + j)
	}
	sum := sha256.Sum256(d[:n-32])
	copy(d[n-32:], sum[:])
	return d
}

// check returns the index of a datagram stamp made, or -1 if it is not
// one whole.
func check(d []byte) int {
	if len(d) < 36 {
		return -1
	}
	sum := sha256.Sum256(d[:len(d)-32])
	if !bytes.Equal(sum[:], d[len(d)-32:]) {
		return -1
	}
	return int(binary.BigEndian.Uint32(d))
}

// TestDatagramsLossy: over a path losing 10% of its packets each way,
// dgram.NewConnOver's datagrams that fit a packet ride QUIC datagrams:
// some are lost, alone, and those after them arrive without waiting for
// a retransmission (no head-of-line blocking); those too large for a
// packet ride the stream and all arrive whole.
func TestDatagramsLossy(t *testing.T) {
	a, b := lossyPair(t, 100)
	ca, cb := dgram.NewConnOver(a, a, nil, nil), dgram.NewConnOver(b, b, nil, nil)
	defer ca.Close()
	defer cb.Close()
	const n, size, big = 1000, 1000, 20000
	type arrival struct {
		i     int
		delay time.Duration
	}
	sent := make([]time.Time, n)
	var mu sync.Mutex
	got := make(chan []arrival, 1)
	go func() {
		var arr []arrival
		buf := make([]byte, 1<<16)
		for {
			cb.SetReadDeadline(time.Now().Add(2 * time.Second))
			k, err := cb.Read(buf)
			if err != nil {
				got <- arr
				return
			}
			i := check(buf[:k])
			if i < 0 || i >= n {
				t.Errorf("a datagram of %d bytes is not one sent whole", k)
				continue
			}
			mu.Lock()
			arr = append(arr, arrival{i, time.Since(sent[i])})
			mu.Unlock()
		}
	}()
	bigs := 0
	for i := range n {
		sz := size
		if i%100 == 50 {
			sz = big // past any packet: the stream carries it
			bigs++
		}
		mu.Lock()
		sent[i] = time.Now()
		mu.Unlock()
		if _, err := ca.Write(stamp(i, sz)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Microsecond)
	}
	arr := <-got
	seen := map[int]bool{}
	var late []time.Duration
	for _, x := range arr {
		if seen[x.i] {
			t.Errorf("datagram %d arrived twice", x.i)
		}
		seen[x.i] = true
		if x.i%100 != 50 {
			late = append(late, x.delay)
		}
	}
	for i := 50; i < n; i += 100 {
		if !seen[i] {
			t.Errorf("datagram %d (%d bytes, over the stream) was lost", i, big)
		}
	}
	lost, after := 0, 0
	for i := range n {
		if !seen[i] {
			lost++
		} else if lost > 0 {
			after++
		}
	}
	t.Logf("%d of %d arrived, %d lost (%.1f%%), %d arrived after a loss, DatagramsDropped %d", len(arr), n, lost, 100*float64(lost)/n, after, DatagramsDropped())
	if lost == 0 {
		t.Fatal("nothing lost over a path losing 10%: the datagrams rode the stream")
	}
	if after == 0 {
		t.Fatal("nothing arrived after the first loss")
	}
	if len(arr) < n*7/10 {
		t.Fatalf("only %d of %d arrived over a path losing 10%% each way", len(arr), n)
	}
	// What was lost stays lost and what follows a loss arrives (checked
	// above): nothing waited for a retransmission. The delays, for the
	// log only: on a busy machine they say more about the scheduler.
	slices.Sort(late)
	t.Logf("median delay %v", late[len(late)/2])
}

// FuzzDatagramDemux: whatever a peer sends in a DATAGRAM frame, the
// demux neither panics nor queues past its bounds: a well-formed one for
// an open stream is queued whole, anything else dropped and counted.
func FuzzDatagramDemux(f *testing.F) {
	f.Add([]byte{0, 'h', 'i'})
	f.Add([]byte{4})
	f.Add([]byte{2, 'u', 'n', 'i'})
	f.Add([]byte{0x40})
	f.Add(quicvarint.Append(nil, 1<<40))
	f.Add([]byte{0xc0, 0, 0, 0, 0, 0, 0, 8, 'x'})
	f.Fuzz(func(t *testing.T, b []byte) {
		m := &demux{queues: map[quic.StreamID]*dqueue{}}
		q0, q4 := m.register(0), m.register(4)
		// A unidirectional stream's ID (2) names no stream that carries
		// datagrams, even one registered by mistake.
		q2 := m.register(2)
		drops := datagramDrops.Load()
		for range 3 {
			m.dispatch(b)
		}
		if len(q2.items) != 0 {
			t.Fatalf("%x: queued for a unidirectional stream", b)
		}
		id, d, ok := parseDatagram(b)
		queued := len(q0.items) + len(q4.items)
		switch {
		case ok && (id == 0 || id == 4):
			if queued != 3 {
				t.Fatalf("%x: %d queued, want 3", b, queued)
			}
			q := map[quic.StreamID]*dqueue{0: q0, 4: q4}[id]
			if !bytes.Equal(q.items[0], d) || !bytes.HasSuffix(b, d) {
				t.Fatalf("%x: queued %x", b, q.items[0])
			}
			if m.bytes != 3*len(d) {
				t.Fatalf("%x: %d bytes counted, want %d", b, m.bytes, 3*len(d))
			}
			got, closed := m.next(q)
			if closed || !bytes.Equal(got, d) {
				t.Fatalf("next: %x, %v", got, closed)
			}
		default:
			if queued != 0 || datagramDrops.Load()-drops != 3 || m.bytes != 0 {
				t.Fatalf("%x (ok %v, id %d): %d queued, %d dropped", b, ok, id, queued, datagramDrops.Load()-drops)
			}
		}
		m.unregister(0)
		m.unregister(2)
		m.unregister(4)
		if m.bytes != 0 {
			t.Fatalf("%d bytes counted after the queues closed", m.bytes)
		}
	})
}

// The demux's bounds: a stream's queue holds datagramQueue datagrams,
// a path's queues datagramBytes; beyond, datagrams are dropped.
func TestDatagramDemuxBounds(t *testing.T) {
	m := &demux{queues: map[quic.StreamID]*dqueue{}}
	q := m.register(8)
	drops := datagramDrops.Load()
	for range datagramQueue + 10 {
		m.dispatch([]byte{8, 'x'})
	}
	if len(q.items) != datagramQueue || datagramDrops.Load()-drops != 10 {
		t.Fatalf("%d queued, %d dropped: want %d and 10", len(q.items), datagramDrops.Load()-drops, datagramQueue)
	}
	m.unregister(8)
	big := append([]byte{12}, make([]byte, 60000)...)
	m.register(12)
	n := 0
	for range 1000 {
		m.dispatch(big)
	}
	n = len(m.queues[12].items)
	if n*60000 > datagramBytes || n < datagramBytes/60000 {
		t.Fatalf("%d datagrams of 60000 bytes queued, want at most %d bytes", n, datagramBytes)
	}
}
