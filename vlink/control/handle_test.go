package control

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// typeMark tells a test node that everything sent to it before, by the
// same sender, has been through its receive path: the relay delivers
// each sender's messages in order, and the node reads them in order.
const typeMark Type = 4

// markedNode connects name with one handler slot, so that its handlers
// run one at a time in the order the node dispatched them, and a
// typeMark handler in place before it registers. It returns the marks'
// payloads as they arrive.
func markedNode(t *testing.T, relay, name string, mod ...func(*Config)) (*Node, <-chan string) {
	t.Helper()
	marks := make(chan string, 16)
	n := connect(t, relay, name, append([]func(*Config){func(c *Config) {
		c.MaxHandlers = 1
		c.Handlers = map[Type]Handler{typeMark: func(m *Message) { marks <- string(m.Payload) }}
	}}, mod...)...)
	return n, marks
}

// warnings is a slog.Handler counting the warnings.
type warnings struct {
	mu sync.Mutex
	n  int
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnings) WithGroup(string) slog.Handler                { return w }
func (w *warnings) Handle(context.Context, slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n++
	return nil
}

func (w *warnings) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// mark sends a mark from a to b and waits until b has it.
func mark(t *testing.T, a *Node, b string, marks <-chan string) {
	t.Helper()
	label := fmt.Sprintf("mark-%d", time.Now().UnixNano())
	if err := a.Send(ctxT(t), b, typeMark, []byte(label)); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-marks:
		if got != label {
			t.Fatalf("mark %q arrived, want %q", got, label)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the mark did not arrive")
	}
}

// labelled is a payload of size bytes starting with label.
func labelled(label string, size int) []byte {
	return append([]byte(label), make([]byte, max(0, size-len(label)))...)
}

// collect returns a handler reporting each payload's label.
func collect() (Handler, <-chan string) {
	got := make(chan string, 2*maxHeld)
	return func(m *Message) { got <- strings.TrimRight(string(m.Payload[:min(len(m.Payload), 32)]), "\x00") }, got
}

// expect reads len(want) labels from got and checks them, in order,
// failing at the first that differs.
func expect(t *testing.T, got <-chan string, want ...string) {
	t.Helper()
	var seen []string
	for i := range want {
		select {
		case s := <-got:
			seen = append(seen, s)
		case <-time.After(10 * time.Second):
			t.Fatalf("the handler saw %d messages, want %d: %s", len(seen), len(want), abbrev(seen))
		}
		if seen[i] != want[i] {
			t.Fatalf("the handler saw %s, want %s", abbrev(seen), abbrev(want[:i+1]))
		}
	}
}

// abbrev shortens a long list of labels for a failure message.
func abbrev(s []string) string {
	if len(s) <= 8 {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%d labels %q...%q", len(s), s[:4], s[len(s)-4:])
}

func send(t *testing.T, from *Node, to string, typ Type, payload []byte) {
	t.Helper()
	if err := from.Send(ctxT(t), to, typ, payload); err != nil {
		t.Fatal(err)
	}
}

// TestLateHandler: a handler registered after Connect gets the messages
// that arrived before it, in order, and then the ones that follow;
// cooperations take their replies as before.
func TestLateHandler(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	alice := connect(t, r.addr, "alice")
	echo(alice)
	handle := func(t *testing.T, bob *Node, typ Type, h Handler) { bob.Handle(typ, h) }
	for _, tt := range []struct {
		name string
		typ  Type
		// before runs on the fresh node bob, before alice's first message.
		before func(t *testing.T, bob *Node)
		early  []string // what alice sends before bob's handler
		// register installs bob's handler.
		register func(t *testing.T, bob *Node, typ Type, h Handler)
		want     []string // what the handler sees: early ones, then "late"
	}{
		{
			name:     "Handle after Connect",
			typ:      typeNote,
			early:    []string{"early-1", "early-2"},
			register: handle,
			want:     []string{"early-1", "early-2", "late"},
		},
		{
			name: "handler removed, then another",
			typ:  typeNote,
			before: func(t *testing.T, bob *Node) {
				bob.Handle(typeNote, func(*Message) { t.Error("the removed handler ran") })
				bob.Handle(typeNote, nil)
			},
			early:    []string{"between"},
			register: handle,
			want:     []string{"between", "late"},
		},
		{
			// bob has one handler slot, which the registering handler
			// holds: the kept message must not wait for it inside Handle.
			name:  "Handle from a handler",
			typ:   typeNote,
			early: []string{"early"},
			register: func(t *testing.T, bob *Node, typ Type, h Handler) {
				done := make(chan struct{})
				bob.Handle(typeEcho, func(*Message) { bob.Handle(typ, h); close(done) })
				send(t, alice, "bob", typeEcho, nil)
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Fatal("Handle, called from a handler, did not return")
				}
			},
			want: []string{"early", "late"},
		},
		{
			name: "a cooperation takes its reply",
			typ:  typeReply,
			before: func(t *testing.T, bob *Node) {
				c := bob.Cooperate(Expect{From: "alice", Type: typeReply})
				if err := c.Send(ctxT(t), "alice", typeEcho, nil); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Wait(ctxT(t)); err != nil {
					t.Fatal(err)
				}
			},
			register: handle,
			want:     []string{"late"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bob, marks := markedNode(t, r.addr, "bob")
			defer bob.Close()
			if tt.before != nil {
				tt.before(t, bob)
			}
			for _, s := range tt.early {
				send(t, alice, "bob", tt.typ, []byte(s))
			}
			mark(t, alice, "bob", marks) // what alice sent reached bob before his handler
			h, got := collect()
			tt.register(t, bob, tt.typ, h)
			send(t, alice, "bob", tt.typ, []byte("late"))
			expect(t, got, tt.want...)
		})
	}
}

// TestHeldBounds: a node keeps at most maxHeld messages and
// maxHeldBytes for handlers to come, and none older than heldAge; past
// that it drops the oldest, and says so in one line however many it
// drops in a burst. A handler registered later sees exactly what was
// kept, in order.
func TestHeldBounds(t *testing.T) {
	r := startRelay(t, RelayConfig{MaxQueue: 64 << 20}, "") // the relay refuses nothing
	alice := connect(t, r.addr, "alice")
	labels := func(prefix string, from, to int) []string {
		var s []string
		for i := from; i < to; i++ {
			s = append(s, fmt.Sprintf("%s-%d", prefix, i))
		}
		return s
	}
	big := maxHeldBytes / heldCost(&Message{From: "alice", Payload: make([]byte, MaxPayload)})
	for _, tt := range []struct {
		name    string
		size    int      // each payload's
		sent    []string // before bob's Handle
		expired int      // the first expired of sent are made older than heldAge
		kept    []string
	}{
		{"by count", 8, labels("small", 0, maxHeld+100), 0, labels("small", 100, maxHeld+100)},
		{"by bytes", MaxPayload, labels("big", 0, big+5), 0, labels("big", 5, big+5)},
		{"by age", 8, labels("msg", 0, 10), 7, labels("msg", 7, 10)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs warnings
			bob, marks := markedNode(t, r.addr, "bob", func(c *Config) { c.Logger = slog.New(&logs) })
			defer bob.Close()
			for i, s := range tt.sent {
				if i == tt.expired && i > 0 {
					mark(t, alice, "bob", marks)
					backdate(bob, heldAge+time.Second)
				}
				send(t, alice, "bob", typeNote, labelled(s, tt.size))
			}
			mark(t, alice, "bob", marks)
			count, bytes, _ := held(bob)
			if count > maxHeld || bytes > maxHeldBytes {
				t.Errorf("bob holds %d messages, %d bytes; bounds %d, %d", count, bytes, maxHeld, maxHeldBytes)
			}
			if n := logs.count(); n != 1 {
				t.Errorf("bob logged %d warnings about the drops, want 1", n)
			}
			h, got := collect()
			bob.Handle(typeNote, h)
			send(t, alice, "bob", typeNote, []byte("end"))
			expect(t, got, append(tt.kept, "end")...)
			if count, bytes, dropped := held(bob); count != 0 || bytes != 0 || dropped != uint64(len(tt.sent)-len(tt.kept)) {
				t.Errorf("bob holds %d messages, %d bytes after Handle, dropped %d; want none, none, %d", count, bytes, dropped, len(tt.sent)-len(tt.kept))
			}
		})
	}
}

// held returns what n holds for handlers to come, and how many it dropped.
func held(n *Node) (count, bytes int, dropped uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.held.msgs), n.held.bytes, n.held.dropped
}

// backdate makes what n holds older by d.
func backdate(n *Node, d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := range n.held.msgs {
		n.held.msgs[i].at = n.held.msgs[i].at.Add(-d)
	}
}
