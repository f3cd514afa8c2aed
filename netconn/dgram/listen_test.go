package dgram

import (
	"net"
	"testing"
	"time"
)

func listen(t *testing.T, lc ListenConfig) *Listener {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	l, err := lc.Listen(pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func client(t *testing.T, l *Listener) *net.UDPConn {
	t.Helper()
	c, err := net.DialUDP("udp", nil, l.Addr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func accept(t *testing.T, l *Listener) net.Conn {
	t.Helper()
	got := make(chan net.Conn, 1)
	go func() {
		s, err := l.Accept()
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	select {
	case s := <-got:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no session")
		return nil
	}
}

func TestSessionPerSource(t *testing.T) {
	l := listen(t, ListenConfig{})
	a, b := client(t, l), client(t, l)
	a.Write([]byte("from a"))
	sa := accept(t, l)
	b.Write([]byte("from b"))
	sb := accept(t, l)
	a.Write([]byte("a again"))
	buf := make([]byte, 64)
	for _, want := range []struct {
		s    net.Conn
		from *net.UDPConn
		msgs []string
	}{{sa, a, []string{"from a", "a again"}}, {sb, b, []string{"from b"}}} {
		if want.s.RemoteAddr().String() != want.from.LocalAddr().String() {
			t.Fatalf("session of %v says it is %v", want.from.LocalAddr(), want.s.RemoteAddr())
		}
		for _, m := range want.msgs {
			n, err := want.s.Read(buf)
			if err != nil || string(buf[:n]) != m {
				t.Fatalf("read %q, %v; want %q", buf[:n], err, m)
			}
		}
	}
	sb.Write([]byte("to b"))
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := b.Read(buf); err != nil || string(buf[:n]) != "to b" {
		t.Fatalf("client b read %q, %v", buf[:n], err)
	}
	// A closed session's client starts a new one.
	sa.Close()
	a.Write([]byte("back"))
	s := accept(t, l)
	if n, err := s.Read(buf); err != nil || string(buf[:n]) != "back" {
		t.Fatalf("new session read %q, %v", buf[:n], err)
	}
}

func TestBounds(t *testing.T) {
	t.Run("sessions", func(t *testing.T) {
		l := listen(t, ListenConfig{MaxSessions: 2})
		var ss []net.Conn
		for range 2 {
			client(t, l).Write([]byte("x"))
			ss = append(ss, accept(t, l))
		}
		// The table is full of sessions that never got an answer: a new
		// client takes the oldest one's place.
		client(t, l).Write([]byte("x"))
		third := accept(t, l)
		if _, err := ss[0].Read(make([]byte, 8)); err == nil {
			t.Fatal("the evicted session still reads")
		}
		if l.Evicted() != 1 {
			t.Fatalf("Evicted() = %d, want 1", l.Evicted())
		}
		// Two-way sessions keep their place: the next client waits.
		ss[1].Read(make([]byte, 8))
		ss[1].Write([]byte("answer"))
		third.Read(make([]byte, 8))
		third.Write([]byte("answer"))
		fourth := client(t, l)
		fourth.Write([]byte("x"))
		waitDropped(t, l, 1, 0)
		third.Close()
		fourth.Write([]byte("x"))
		accept(t, l)
		if l.Evicted() != 1 {
			t.Fatalf("Evicted() = %d, want still 1", l.Evicted())
		}
	})
	t.Run("buffered bytes", func(t *testing.T) {
		l := listen(t, ListenConfig{MaxBuffered: 3000})
		c := client(t, l)
		for range 4 {
			c.Write(make([]byte, 1000))
		}
		waitDropped(t, l, 0, 1)
		s := accept(t, l)
		buf := make([]byte, 2000)
		for range 3 {
			if n, err := s.Read(buf); err != nil || n != 1000 {
				t.Fatalf("read %d, %v", n, err)
			}
		}
		c.Write(make([]byte, 1000)) // the room read made is free again
		if n, err := s.Read(buf); err != nil || n != 1000 {
			t.Fatalf("read %d, %v", n, err)
		}
	})
	t.Run("queue", func(t *testing.T) {
		l := listen(t, ListenConfig{Queue: 2})
		c := client(t, l)
		for range 3 {
			c.Write([]byte("x"))
		}
		waitDropped(t, l, 0, 1)
	})
}

func waitDropped(t *testing.T, l *Listener, sessions, queued int64) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if s, q := l.Dropped(); s == sessions && q == queued {
			return
		}
	}
	s, q := l.Dropped()
	t.Fatalf("dropped %d sessions and %d datagrams, want %d and %d", s, q, sessions, queued)
}

func TestCloseEndsSessions(t *testing.T) {
	l := listen(t, ListenConfig{})
	client(t, l).Write([]byte("x"))
	s := accept(t, l)
	s.Read(make([]byte, 8))
	done := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 8))
		done <- err
	}()
	l.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("read after Close: no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a session's read outlived its listener")
	}
	if _, err := l.Accept(); err == nil {
		t.Fatal("Accept after Close: no error")
	}
}
