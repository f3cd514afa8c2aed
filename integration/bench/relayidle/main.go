// Command relayidle registers N idle nodes with a vlink relay and holds
// them, so that relay_idle.sh can weigh what each costs the relay. Each
// node proves its own key, derived from the network key, as any node
// does, or with -owner-key, its own certificate, signed here by the
// owner for a key made here; the nodes only keep their control
// connections alive.
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
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

func main() {
	relay := flag.String("relay", "", "the relay's `HOST:PORT`")
	keyFile := flag.String("key-file", "", "the network key `FILE`")
	ownerFile := flag.String("owner-key", "", "sign each node a certificate with the owner's key in `FILE` instead (vlink owner init)")
	n := flag.Int("n", 1000, "register `N` nodes")
	prefix := flag.String("prefix", "idle", "name the nodes `PREFIX`0, PREFIX1, ...")
	par := flag.Int("parallel", 32, "register `P` nodes at a time")
	flag.Parse()
	var (
		key   []byte
		owner *nodecert.OwnerKey
		trust *nodecert.Trust
		err   error
	)
	if *ownerFile != "" {
		if owner, err = nodecert.ReadOwnerKeyFile(*ownerFile); err != nil {
			log.Fatal(err)
		}
		if trust, err = nodecert.NewTrust(owner.Public(), ""); err != nil {
			log.Fatal(err)
		}
	} else if key, err = vlink.ReadKeyFile(*keyFile); err != nil {
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
			cfg := control.Config{Name: name, Key: vlink.NodeKey(key, name), Relays: []string{*relay}}
			if owner != nil {
				cfg.Key, cfg.Member = nil, member(owner, trust, name)
			}
			node, err := control.Connect(ctx, cfg)
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

// member makes the node called name a member: a fresh key and its
// certificate, signed by owner.
func member(owner *nodecert.OwnerKey, trust *nodecert.Trust, name string) *vlink.Member {
	priv := vlink.NewIdentity()
	pub, err := vlink.IdentityPublic(priv)
	if err != nil {
		log.Fatal(err)
	}
	cert, err := nodecert.Sign(owner, nodecert.Template{Name: name, Kind: nodecert.KindNode, PublicKey: pub})
	if err != nil {
		log.Fatal(err)
	}
	return &vlink.Member{Cert: cert, Private: priv, Trust: trust}
}
