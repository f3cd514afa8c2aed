package compress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	_ "github.com/vlink-dev/vlink/factories/tcp"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// farFuture, as a controller's last probe, keeps it from probing.
var farFuture = time.Now().Add(100 * 365 * 24 * time.Hour)

func mustAuto(tb testing.TB, cfg AutoConfig) *Auto {
	tb.Helper()
	a, err := NewAuto(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

// encodeAuto returns the wire form of the given writes through an auto
// writer whose controller sits on rung j (a negative j leaves the
// controller alone).
func encodeAuto(tb testing.TB, a *Auto, j int, writes ...[]byte) []byte {
	tb.Helper()
	var wire bytes.Buffer
	c := newAutoConn(&testnet.FakeConn{W: &wire}, a)
	if j >= 0 {
		c.ctrl = newController(a.rungs, nil)
		c.ctrl.cur = j
		c.ctrl.lastProbe = farFuture // no probes,
		// and no epoch ends, however slow the codec (the race detector
		// makes zstd-6 take longer than epochTime per block): stay on j.
		c.ctrl.e = -time.Hour
	}
	for _, w := range writes {
		if _, err := c.Write(w); err != nil {
			tb.Fatal(err)
		}
	}
	return wire.Bytes()
}

// frames splits a stream into its headers.
func frames(tb testing.TB, wire []byte) []header {
	tb.Helper()
	var hs []header
	for len(wire) > 0 {
		var h header
		if len(wire) < headerSize {
			tb.Fatalf("%d bytes left, not a header", len(wire))
		}
		copy(h[:], wire)
		hs = append(hs, h)
		wire = wire[headerSize+h.PayloadLen():]
	}
	return hs
}

func readAuto(t *testing.T, a *Auto, wire []byte) ([]byte, error) {
	t.Helper()
	got, err := io.ReadAll(newAutoConn(&testnet.FakeConn{R: bytes.NewReader(wire)}, a))
	var b bytes.Buffer
	_, err2 := newAutoConn(&testnet.FakeConn{R: bytes.NewReader(wire)}, a).WriteTo(&b)
	if !bytes.Equal(got, b.Bytes()) || (err == nil) != (err2 == nil) {
		t.Errorf("Read gave %d bytes and %v; WriteTo %d bytes and %v", len(got), err, b.Len(), err2)
	}
	return got, err
}

// TestAutoFrames checks that every rung writes frames naming its codec,
// that an auto reader decodes each, and that the fixed layers and auto
// refuse each other's compressed frames.
func TestAutoFrames(t *testing.T) {
	a := mustAuto(t, AutoConfig{Codecs: codecNames, MaxLevel: 22})
	text, random := textCorpus(MaxBlock+5000), testnet.RandomBytes(3000, 7)
	for j, r := range a.rungs {
		t.Run(r.name, func(t *testing.T) {
			wire := encodeAuto(t, a, j, text, random, text[:10])
			for _, h := range frames(t, wire) {
				switch {
				case h.Type() == frameCompressed && (j == 0 || h.Codec() != r.id):
					t.Errorf("rung %s wrote a compressed frame naming codec %d", r.name, h.Codec())
				case h.Type() == frameRaw && h.RawLen() > 1000 && h.RawLen() != len(random) && j > 0:
					t.Errorf("rung %s sent %d bytes of text raw", r.name, h.RawLen())
				}
			}
			got, err := readAuto(t, a, ended(wire))
			want := append(append(bytes.Clone(text), random...), text[:10]...)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read back %d bytes, %v; want %d", len(got), err, len(want))
			}
			if j == 0 {
				return
			}
			// A fixed layer of the same codec refuses the named codec.
			_, err = readBoth(t, r.name[:strings.IndexByte(r.name, '-')], wire)
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("fixed %s layer read auto's frames: %v, want ErrCorrupt", r.name, err)
			}
		})
	}
	// Auto refuses codec 0 (a fixed layer's frames), and codecs outside
	// its configuration.
	zstdOnly := mustAuto(t, AutoConfig{Codecs: []string{"zstd"}})
	for name, tc := range map[string]struct {
		a    *Auto
		wire []byte
	}{
		"fixed zstd frames": {a, encode(t, "zstd", 3, text)},
		"s2 to a zstd-only": {zstdOnly, encodeAuto(t, a, 1, text)},
		"codec 15":          {a, withType(encodeAuto(t, a, 3, text), 0xf2)},
	} {
		if _, err := readAuto(t, tc.a, tc.wire); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

func withType(f []byte, typ byte) []byte {
	f = bytes.Clone(f)
	f[0] = typ
	return f
}

// TestAutoCorruptFrames: the framing errors of the fixed layers, and
// those only auto can meet, each give ErrCorrupt in a *net.OpError
// naming auto.
func TestAutoCorruptFrames(t *testing.T) {
	a := mustAuto(t, AutoConfig{Codecs: codecNames})
	text := textCorpus(10000)
	good := encodeAuto(t, a, 3, text) // zstd-1
	if hs := frames(t, good); len(hs) != 1 || hs[0].Type() != frameCompressed {
		t.Fatalf("want one compressed frame, got %v", hs)
	}
	for name, wire := range map[string][]byte{
		"raw frame naming a codec":    withType(frame(frameRaw, 3, []byte("abc")), 0x11),
		"end frame naming a codec":    withType(frame(frameEnd, 0, nil), 0x13),
		"codec 0":                     withType(good, byte(frameCompressed)),
		"codec 5":                     withType(good, 0x52),
		"wrong codec for the payload": withType(good, 0x22),
		"unknown kind":                withType(good, 0x14),
		"declared length +1":          withRawLen(good, len(text)+1),
		"payload truncated":           good[:len(good)-1],
		"compressed over MaxBlock":    withType(frame(frameCompressed, MaxBlock+1, make([]byte, 100)), 0x12),
		"payload garbage":             withType(frame(frameCompressed, len(text), bytes.Repeat([]byte{0xff}, 100)), 0x12),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := readAuto(t, a, wire)
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("error %v, want ErrCorrupt or io.ErrUnexpectedEOF", err)
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Net != "adaptive" || oe.Op != "read" {
				t.Errorf("error %v is not a *net.OpError naming auto", err)
			}
		})
	}
}

// TestAutoTransfer sends text, random and mixed data both ways at once
// over loopback TCP, net.Pipe and a connection hiding its type, with
// every rung reachable, and checks what arrives by SHA-256. That every
// rung is reachable is checked too: for each, some link and data on
// which the controller settles on it.
func TestAutoTransfer(t *testing.T) {
	size := 24 << 20
	if testing.Short() || raceEnabled {
		size = 4 << 20
	}
	text, random := textCorpus(size), testnet.RandomBytes(size, 7)
	mixed := make([]byte, 0, size)
	for i := 0; len(mixed) < size; i++ {
		src := text
		if i%2 == 1 {
			src = random
		}
		mixed = append(mixed, src[len(mixed):min(size, len(mixed)+200<<10+i*1000)]...)
	}
	a := mustAuto(t, AutoConfig{Codecs: codecNames, MaxLevel: 22})
	pipes := map[string]func() (net.Conn, net.Conn){
		"tcp":      func() (net.Conn, net.Conn) { c, s := testnet.TCPPair(t); return c, s },
		"tcp-copy": func() (net.Conn, net.Conn) { c, s := testnet.TCPPair(t); return hideType{c}, hideType{s} },
		"pipe":     func() (net.Conn, net.Conn) { return net.Pipe() },
	}
	read := func(r io.Reader) ([]byte, error) { return io.ReadAll(r) }
	for pname, mk := range pipes {
		for _, tc := range []struct {
			name     string
			up, down []byte
		}{{"text/random", text, random}, {"mixed/text", mixed, text[:size/3]}} {
			t.Run(pname+"/"+tc.name, func(t *testing.T) {
				a1, b1 := mk()
				c, _ := a.Client(a1)
				s, _ := a.Server(b1)
				defer c.Close()
				defer s.Close()
				exchange(t, c, s, tc.up, tc.down, read)
				ct := c.(*conn).ctrl
				t.Logf("client: %d epochs, %d moves, ended on %s", ct.epochs, ct.moves, a.rungs[ct.cur].name)
				// The first epoch ends after 1 MiB whatever the clock says:
				// the controller decided while the data above was checked.
				if ct.epochs == 0 {
					t.Errorf("no epoch ended in %d bytes: the controller never decided", len(tc.up))
				}
			})
		}
	}
	// Where the controller goes depends on this machine's speed, so the
	// transfers above may visit only a few rungs. Reachability is checked
	// on the simulated link of control_test.go instead, deterministically:
	// with tcp_info, as on Linux, and data compressing as the ladder's
	// priors say (randomly, for off), each rung has a link on which the
	// controller settles on it. A rung none reaches is dead weight.
	t.Run("every rung reachable", func(t *testing.T) {
		text := simData{name: "text", ratio: map[string]float64{}, speed: map[string]float64{}}
		random := simData{name: "random", ratio: map[string]float64{}, speed: map[string]float64{}}
		for _, r := range a.rungs[1:] {
			text.ratio[r.name], text.speed[r.name] = r.ratio, r.speed
			random.ratio[r.name], random.speed[r.name] = 1, 10*r.speed // failing is cheap
		}
		witnesses := map[string]struct {
			mbps float64 // the link's rate, Mbit/s
			data simData
		}{
			"off":       {100, random},
			"s2-1":      {1000, text},
			"s2-2":      {600, text},
			"zstd-1":    {250, text},
			"zstd-6":    {80, text},
			"deflate-9": {10, text},
		}
		if len(witnesses) != len(a.rungs) {
			t.Errorf("%d witnesses for the rungs %v", len(witnesses), a.Rungs())
		}
		for _, r := range a.rungs {
			t.Run(r.name, func(t *testing.T) {
				w, ok := witnesses[r.name]
				if !ok {
					t.Fatalf("no link and data that should reach %s", r.name)
				}
				s := newSimOn(t, a, simLink{rate: w.mbps * 1e6 / 8, bufSize: 1 << 20, perByte: 1 / 3e9}, w.data, true)
				s.run(10 * time.Second) // settle
				n := len(s.history)
				s.run(5 * time.Second)
				if got := s.last(len(s.history) - n); got != r.name {
					t.Errorf("%s over %v Mbit/s: settled on %s, want %s (%d moves)", w.data.name, w.mbps, got, r.name, s.ct.moves)
				}
			})
		}
	})
}

func TestAutoNettest(t *testing.T) {
	a := mustAuto(t, AutoConfig{})
	t.Run("tcp", func(t *testing.T) {
		nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
			x, y := testnet.TCPPair(t)
			c1, _ = a.Client(x)
			c2, _ = a.Server(y)
			return c1, c2, func() { c1.Close(); c2.Close() }, nil
		})
	})
	t.Run("pipe", func(t *testing.T) {
		nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
			x, y := net.Pipe()
			c1, _ = a.Client(x)
			c2, _ = a.Server(y)
			// Both ends close at once, and an unbuffered pipe takes the end
			// frame each Close lingers to send only from a reader: close the
			// pipes too, so neither linger waits for its 10 s.
			return c1, c2, func() { c1.Close(); c2.Close(); x.Close(); y.Close() }, nil
		})
	})
}

func TestAutoConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg AutoConfig
		ok  bool
	}{
		{AutoConfig{}, true},
		{AutoConfig{Codecs: []string{"lz4"}, MaxLevel: 1}, true},
		{AutoConfig{Codecs: []string{"brotli"}}, false},
		{AutoConfig{Codecs: []string{}}, false},
		{AutoConfig{Codecs: []string{""}}, false},
		{AutoConfig{Codecs: []string{"zstd", "zstd"}}, false},
		{AutoConfig{MaxLevel: 23}, false},
		{AutoConfig{MaxLevel: -1}, false},
	} {
		err := tc.cfg.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%+v: %v, want ok=%t", tc.cfg, err, tc.ok)
		}
		if !tc.ok && !errors.Is(err, layer.ErrBadParam) {
			t.Errorf("%+v: %v does not match layer.ErrBadParam", tc.cfg, err)
		}
	}
}

// TestAutoStack dials through a VLink listener with auto stacks written
// as a user writes them: the listener mirrors the layer from the hello,
// both ends move data, and a bad codec list fails the dial.
func TestAutoStack(t *testing.T) {
	spec, ok := layer.Lookup("adaptive")
	if !ok || spec.Kind != layer.KindFilter {
		t.Fatal("auto is not registered as a filter")
	}
	var lc vlink.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	data := textCorpus(3 << 20)
	for _, tc := range []struct {
		stack, rungs string
		ok           bool
	}{
		{"adaptive", "[off s2-1 s2-2 zstd-1 zstd-6]", true},
		{"adaptive:codecs=lz4/zstd,max-level=3", "[off lz4-0 zstd-1]", true},
		{"adaptive:codecs=zstd/brotli", "", false},
	} {
		t.Run(tc.stack, func(t *testing.T) {
			d := vlink.Dialer{Stack: vlink.MustParse(tc.stack)}
			c, err := d.Dial("tcp", l.Addr().String())
			if !tc.ok {
				if !errors.Is(err, layer.ErrBadParam) {
					t.Fatalf("dial: %v, want layer.ErrBadParam", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if ac, ok := c.(*conn); !ok {
				t.Fatalf("dialed a %T", c)
			} else if got := fmt.Sprint(namesOf(ac.rungs)); got != tc.rungs {
				t.Errorf("rungs %s, want %s", got, tc.rungs)
			}
			go func() {
				c.Write(data)
				c.(closeWriter).CloseWrite()
			}()
			got, err := io.ReadAll(c)
			if err != nil || testnet.Sum(got) != testnet.Sum(data) {
				t.Fatalf("echo: %d bytes (sha256 %x), %v; sent %d (%x)", len(got), testnet.Sum(got), err, len(data), testnet.Sum(data))
			}
		})
	}
}

func namesOf(rungs []rung) []string {
	var names []string
	for _, r := range rungs {
		names = append(names, r.name)
	}
	return names
}

// TestNoAllocsAuto is TestNoAllocs for auto: writing at every rung, with
// the controller timing blocks and ending epochs, and reading the frames
// of every codec allocate nothing once the pools are warm.
func TestNoAllocsAuto(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	a := mustAuto(t, AutoConfig{Codecs: codecNames, MaxLevel: 22})
	text, random := textCorpus(3*MaxBlock), testnet.RandomBytes(2*MaxBlock, 7)
	w := newAutoConn(&testnet.FakeConn{W: io.Discard}, a)
	w.vectored = true
	var wire []byte
	for j := range a.rungs {
		wire = append(wire, encodeAuto(t, a, j, text, random, text[:100])...)
	}
	wire = ended(wire)
	src := bytes.NewReader(wire)
	eof := testnet.NewEOFSignal(src)
	r := newAutoConn(&testnet.FakeConn{R: eof}, a)
	buf := make([]byte, 256<<10)
	w.Write(text) // makes the controller
	// The end frame starts the tail reader (framed.Ends.PeerEnded), which
	// reads src to its end: the rounds read src again once it is done.
	r.WriteTo(io.Discard)
	eof.Wait(t)
	allocs := testing.AllocsPerRun(20, func() {
		for j := range a.rungs {
			w.ctrl.cur = j
			w.skip, w.backoff = 0, 0
			w.Write(text)
			w.Write(random)
			w.Write(text[:100])
		}
		src.Reset(wire)
		r.rerr = nil
		for {
			if _, err := r.Read(buf); err != nil {
				break
			}
		}
		src.Reset(wire)
		r.rerr = nil
		r.WriteTo(io.Discard)
	})
	if allocs >= 1 {
		t.Errorf("%.1f allocations per round", allocs)
	}
	if w.ctrl.epochs == 0 {
		t.Error("no epoch ended: the controller's decisions were not measured")
	}
}
