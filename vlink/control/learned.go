package control

import (
	"context"
	"errors"
	"time"
)

// What a node's dials learn, as Happy Eyeballs caches (RFC 8305 §4.4):
// the path that won the last dial to a node stays first for a while, and
// the paths the ladder tries before it are left out, so a dial that can
// only be relayed does not wait out the direct paths' staggers every
// time (spliceStagger, relayStagger), nor a splice the reverse path's.
const (
	// learnedTTL is how long a winner is remembered; after it, the next
	// dial climbs the whole ladder again, so a path that opened (a
	// firewall rule, a new NAT) is found.
	learnedTTL = 10 * time.Minute
	// maxLearned bounds the nodes remembered: the oldest is forgotten.
	maxLearned = 1024
)

// learnedPath is what the last dial to a node found.
type learnedPath struct {
	won Paths
	at  time.Time
}

// narrow returns paths without those the ladder tries before the path
// that won the last dial to name, if that was within learnedTTL.
func (n *Node) narrow(name string, paths Paths) Paths {
	n.mu.Lock()
	l, ok := n.learned[name]
	n.mu.Unlock()
	if !ok || time.Since(l.at) > learnedTTL || paths&l.won == 0 {
		return paths
	}
	switch l.won {
	case PathSplice:
		return paths &^ PathReverse
	case PathRelay:
		return paths &^ (PathReverse | PathSplice)
	}
	return paths
}

// learn records the path a dial to name took; forget drops what was
// learned, after a dial by it failed.
func (n *Node) learn(name, path string) {
	won := map[string]Paths{"reverse": PathReverse, "splice": PathSplice, "relay": PathRelay}[path]
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.learned[name]; !ok && len(n.learned) >= maxLearned {
		var oldest string
		for k, l := range n.learned {
			if oldest == "" || l.at.Before(n.learned[oldest].at) {
				oldest = k
			}
		}
		delete(n.learned, oldest)
	}
	n.learned[name] = learnedPath{won: won, at: now}
}

func (n *Node) forget(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.learned, name)
}

// dialLearning is DialPaths for the dials where the network picks the
// path (DialNode, DialNodeWays): the path that won is remembered for 10
// minutes, and the next dials to the node leave out the paths that lost
// to it, falling back on all of paths if that fails. A dial whose stack
// chose its paths (DialPaths, the rendezvous factories) neither uses nor
// feeds what was learned.
func (n *Node) dialLearning(ctx context.Context, name string, port uint16, paths Paths) (*Conn, error) {
	if narrowed := n.narrow(name, paths); narrowed != paths {
		c, err := n.DialPaths(ctx, name, port, narrowed)
		if err == nil {
			for i, s := range c.ladder {
				if p := map[string]Paths{"reverse": PathReverse, "splice": PathSplice}[s.Path]; paths&p != 0 && narrowed&p == 0 {
					c.ladder[i].Note = "left out: " + c.path + " won the last dial to " + name
				}
			}
			n.learn(name, c.path)
			return c, nil
		}
		var de *DeliveryError
		if ctx.Err() != nil || (errors.As(err, &de) && de.Code != CodeUnreachable && de.Code != CodeTimeout) {
			return nil, err // the node's answer, whatever the path
		}
		n.forget(name)
	}
	c, err := n.DialPaths(ctx, name, port, paths)
	if err != nil {
		return nil, err
	}
	n.learn(name, c.path)
	return c, nil
}
