// Command relayidle registers N idle nodes with a vlink relay and holds
// them, so that relay_idle.sh can weigh what each costs the relay. Each
// node proves its own key, derived from the network key, as any node
// does; the nodes only keep their control connections alive.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
)

func main() {
	relay := flag.String("relay", "", "the relay's `HOST:PORT`")
	keyFile := flag.String("key-file", "", "the network key `FILE`")
	n := flag.Int("n", 1000, "register `N` nodes")
	prefix := flag.String("prefix", "idle", "name the nodes `PREFIX`0, PREFIX1, ...")
	par := flag.Int("parallel", 32, "register `P` nodes at a time")
	flag.Parse()
	key, err := vlink.ReadKeyFile(*keyFile)
	if err != nil {
		log.Fatal(err)
	}
	var (
		mu    sync.Mutex
		nodes []*control.Node
		done  atomic.Int64
		sem   = make(chan struct{}, *par)
		wg    sync.WaitGroup
		start = time.Now()
	)
	for i := 0; i < *n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			name := fmt.Sprintf("%s%d", *prefix, i)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			node, err := control.Connect(ctx, control.Config{Name: name, Key: vlink.NodeKey(key, name), Relays: []string{*relay}})
			if err != nil {
				log.Fatalf("%s: %v", name, err)
			}
			mu.Lock()
			nodes = append(nodes, node)
			mu.Unlock()
			if k := done.Add(1); k%1000 == 0 {
				fmt.Fprintf(os.Stderr, "%d nodes registered (%v)\n", k, time.Since(start).Round(time.Millisecond))
			}
		}()
	}
	wg.Wait()
	fmt.Printf("registered %d nodes in %v\n", *n, time.Since(start).Round(time.Millisecond))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	for _, node := range nodes {
		node.Close()
	}
}
