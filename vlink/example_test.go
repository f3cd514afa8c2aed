package vlink_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

// An HTTP client and server talking through a zstd stack: the server's
// listener mirrors whatever its policy allows, the client's Dialer plugs
// into http.Transport.
func ExampleDialer_httpTransport() {
	lc := vlink.ListenConfig{Policy: vlink.Policy{Layers: []string{"zstd", "lz4"}}}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	type stackKey struct{}
	srv := &http.Server{
		// Each connection the listener accepts says what the dialer asked for.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			stack := "plain tcp"
			if vc, ok := c.(*vlink.Conn); ok && vc.Hello() != nil {
				stack = vc.Hello().Stack.String()
			}
			return context.WithValue(ctx, stackKey{}, stack)
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello over %s", r.Context().Value(stackKey{}))
		}),
	}
	go srv.Serve(l)
	defer srv.Close()

	d := &vlink.Dialer{Stack: vlink.MustParse("zstd:level=3")}
	transport := &http.Transport{DialContext: d.DialContext}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}
	resp, err := client.Get("http://" + l.Addr().String() + "/")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Status, string(body))
	// Output: 200 OK hello over zstd:level=3
}

// A listener that requires the pre-shared key and lets dialers ask for
// lz4 only: a dialer asking for zstd is refused with a reason it can
// test, one asking for lz4 gets through, and the server sees each
// client's stack.
func ExampleListenConfig_policy() {
	key := []byte("a key of at least sixteen bytes!")
	lc := vlink.ListenConfig{Policy: vlink.Policy{Key: key, Layers: []string{"lz4"}}}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "you came over %s\n", c.(*vlink.Conn).Hello().Stack)
			c.Close()
		}
	}()

	for _, stack := range []string{"zstd", "lz4"} {
		d := vlink.Dialer{Stack: vlink.MustParse(stack), Key: key}
		c, err := d.Dial("tcp", l.Addr().String())
		if errors.Is(err, vlink.ErrNotAllowed) {
			fmt.Println(stack+":", "refused, layer not allowed")
			continue
		} else if err != nil {
			panic(err)
		}
		msg, _ := io.ReadAll(c)
		c.Close()
		fmt.Print(stack+": ", string(msg))
	}
	// Output:
	// zstd: refused, layer not allowed
	// lz4: you came over lz4
}

// A Dialer driven by routing rules, as vlink.Dial reads them from the
// user's configuration: one destination through a compressing stack,
// every other one direct, as net.Dial would.
func ExampleNewConfig() {
	l, err := vlink.Listen("tcp", "127.0.0.1:0") // mirrors any stack, takes plain TCP too
	if err != nil {
		panic(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			stack := "plain TCP"
			if h := c.(*vlink.Conn).Hello(); h != nil {
				stack = h.Stack.String()
			}
			fmt.Fprintln(c, stack)
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	cfg, err := vlink.NewConfig(
		[]selector.Rule{{Host: "127.0.0.1", Ports: port, Stack: "zstd:level=1"}},
		selector.Rule{Action: selector.Direct}, // the default route
		nil)
	if err != nil {
		panic(err)
	}
	d := vlink.Dialer{Config: cfg}
	for _, addr := range []string{l.Addr().String(), "localhost:" + port} {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			panic(err)
		}
		msg, _ := io.ReadAll(c)
		c.Close()
		fmt.Printf("%s: %s", strings.Replace(addr, port, "PORT", 1), msg)
	}
	// Output:
	// 127.0.0.1:PORT: zstd:level=1
	// localhost:PORT: plain TCP
}

// A proxy URL, as users paste them, is a stack's layer; its user-info is
// kept for the dial but never shown, the user name included.
func ExampleParse_proxyURL() {
	s, err := vlink.Parse("zstd+socks5h://alice:secret@proxy.example")
	if err != nil {
		panic(err)
	}
	fmt.Println(s)
	// Output: zstd+socks5:addr=proxy.example:1080,password=REDACTED,resolve=remote,user=REDACTED+tcp
}
