package vlink_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"

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
