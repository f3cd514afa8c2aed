package control_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
)

const (
	typeUpper  control.Type = 1 // a request: the payload in upper case, please
	typeAnswer control.Type = 2
)

// A relay, a server node answering requests in a handler, and a client
// node asking it within a cooperation. In a real network each runs in a
// process of its own: `vlink relay` for the relay, and each node holds
// only its own key, vlink.NodeKey(network key, its name).
func Example() {
	networkKey := []byte("an example key, at least 16 bytes")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	relay, _ := control.NewRelay(control.RelayConfig{})
	l, err := relay.Listen(ctx, "127.0.0.1:0", networkKey)
	if err != nil {
		log.Fatal(err)
	}
	go relay.Serve(l)
	defer relay.Close()

	join := func(name string) *control.Node {
		n, err := control.Connect(ctx, control.Config{
			Name:   name,
			Key:    vlink.NodeKey(networkKey, name),
			Relays: []string{l.Addr().String()},
		})
		if err != nil {
			log.Fatal(err)
		}
		return n
	}
	server := join("server")
	defer server.Close()
	server.Handle(typeUpper, func(m *control.Message) {
		m.Reply(context.Background(), typeAnswer, []byte(strings.ToUpper(string(m.Payload))))
	})

	client := join("client")
	defer client.Close()
	coop := client.Cooperate(control.Expect{From: "server", Type: typeAnswer})
	if err := coop.Send(ctx, "server", typeUpper, []byte("hello, relay")); err != nil {
		log.Fatal(err)
	}
	replies, err := coop.Wait(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s answered %q\n", replies[0].From, replies[0].Payload)
	// Output: server answered "HELLO, RELAY"
}

// Scatter/gather: one cooperation, one request to each of several
// nodes, one reply expected from each.
func ExampleCooperation_scatterGather() {
	networkKey := []byte("an example key, at least 16 bytes")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	relay, _ := control.NewRelay(control.RelayConfig{})
	l, _ := relay.Listen(ctx, "127.0.0.1:0", networkKey)
	go relay.Serve(l)
	defer relay.Close()
	join := func(name string) *control.Node {
		n, err := control.Connect(ctx, control.Config{Name: name, Key: vlink.NodeKey(networkKey, name), Relays: []string{l.Addr().String()}})
		if err != nil {
			log.Fatal(err)
		}
		return n
	}

	workers := []string{"w1", "w2", "w3"}
	for _, name := range workers {
		w := join(name)
		defer w.Close()
		w.Handle(typeUpper, func(m *control.Message) {
			m.Reply(context.Background(), typeAnswer, []byte(name+" done"))
		})
	}
	boss := join("boss")
	defer boss.Close()
	var expect []control.Expect
	for _, w := range workers {
		expect = append(expect, control.Expect{From: w, Type: typeAnswer})
	}
	coop := boss.Cooperate(expect...)
	for _, w := range workers {
		coop.Send(ctx, w, typeUpper, []byte("work"))
	}
	replies, err := coop.Wait(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range replies {
		fmt.Println(string(r.Payload))
	}
	// Output:
	// w1 done
	// w2 done
	// w3 done
}
