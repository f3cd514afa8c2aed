package preload

import (
	"sync"
	"time"

	"github.com/vlink-dev/vlink/vlink"
)

// How long the agent keeps the far side's answer about a name: long
// enough that a program resolving a name before each connect pays one
// round trip, not one per connect; short enough that a name created on
// the far side is found soon. A negative answer is kept shorter, as
// resolvers keep theirs (RFC 2308).
const (
	lookupTTL         = time.Minute
	negativeLookupTTL = 10 * time.Second
	maxLookups        = 4096
	// maxLookupWait bounds what a far side that does not answer costs a
	// program's getaddrinfo; the stand-ins come then.
	maxLookupWait = 10 * time.Second
)

// lookupCache holds the far side's answers, by name and port (the port
// can choose the route, and so who answers).
type lookupCache struct {
	mu sync.Mutex
	m  map[lookupKey]lookupEntry
}

type lookupKey struct {
	name string
	port uint16
}

type lookupEntry struct {
	families vlink.Families // 0: no such name
	expires  time.Time
}

func (c *lookupCache) get(k lookupKey, now time.Time) (vlink.Families, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || now.After(e.expires) {
		return 0, false
	}
	return e.families, true
}

func (c *lookupCache) put(k lookupKey, f vlink.Families, now time.Time) {
	ttl := lookupTTL
	if f == 0 {
		ttl = negativeLookupTTL
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[lookupKey]lookupEntry{}
	}
	if len(c.m) >= maxLookups {
		for k, e := range c.m {
			if now.After(e.expires) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxLookups {
			clear(c.m) // all fresh: start over rather than grow
		}
	}
	c.m[k] = lookupEntry{families: f, expires: now.Add(ttl)}
}
