package bench

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// corpusSeed makes every run send the same bytes, so results compare
// across runs and machines.
const corpusSeed = 0x766c696e6b // "vlink"

// textCorpus returns n bytes of application logs: text log lines and JSON
// records with the repetition and the entropy (ids, timestamps, addresses)
// that real logs have. It is what compression filters meet on a link that
// ships logs or API traffic.
func textCorpus(n int) []byte {
	r := rand.New(rand.NewPCG(corpusSeed, 1))
	pick := func(list []string) string { return list[r.IntN(len(list))] }
	b := make([]byte, 0, n+1024)
	t := time.Date(2025, 3, 11, 9, 0, 0, 0, time.UTC)
	for len(b) < n {
		t = t.Add(time.Duration(r.IntN(20_000)) * time.Microsecond)
		ts := t.Format("2006-01-02T15:04:05.000Z")
		reqID := strconv.FormatUint(r.Uint64(), 16)
		ip := fmt.Sprintf("10.%d.%d.%d", r.IntN(4), r.IntN(256), 1+r.IntN(254))
		switch r.IntN(5) {
		case 0, 1, 2:
			method, path := pick(methods), pick(paths)
			if strings.Contains(path, "%d") {
				path = fmt.Sprintf(path, r.IntN(100_000))
			}
			status := statuses[min(r.IntN(40), len(statuses)-1)]
			level := "INFO"
			if status >= 500 {
				level = "ERROR"
			} else if status >= 400 {
				level = "WARN"
			}
			b = fmt.Appendf(b, "%s %-5s http: %s %s status=%d bytes=%d duration=%.3fms remote=%s:%d req=%s\n",
				ts, level, method, path, status, r.IntN(64<<10), r.Float64()*250, ip, 1024+r.IntN(64511), reqID)
		default:
			b = fmt.Appendf(b, `{"time":"%s","level":"info","service":"%s","event":"%s","user_id":%d,"amount":%d.%02d,"currency":"%s","client_ip":"%s","user_agent":"%s","trace_id":"%s","tags":["%s","%s"]}`+"\n",
				ts, pick(services), pick(events), r.IntN(1_000_000), r.IntN(500), r.IntN(100), pick(currencies),
				ip, pick(agents), reqID, pick(regions), pick(tiers))
		}
	}
	return b[:n]
}

// randomCorpus returns n bytes that do not compress: encrypted or already
// compressed payloads.
func randomCorpus(n int) []byte {
	var seed [32]byte
	copy(seed[:], "vlink bench random corpus")
	b := make([]byte, n)
	rand.NewChaCha8(seed).Read(b)
	return b
}

var (
	methods  = []string{"GET", "GET", "GET", "GET", "POST", "POST", "PUT", "DELETE"}
	paths    = []string{"/api/v1/users/%d", "/api/v1/orders/%d", "/api/v1/orders/%d/items", "/api/v1/search?q=item-%d", "/static/js/app.%d.js", "/healthz", "/metrics", "/login"}
	statuses = []int{
		200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200,
		200, 200, 200, 200, 200, 200, 200, 200, 201, 201, 204, 204, 301, 304, 304, 400, 401, 404, 429, 500, 503,
	}
	services   = []string{"billing", "auth", "search", "gateway", "inventory", "notifications"}
	events     = []string{"invoice.created", "invoice.paid", "session.started", "session.ended", "cart.updated", "item.viewed", "password.reset"}
	currencies = []string{"EUR", "USD", "GBP", "JPY"}
	agents     = []string{
		"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0 Safari/537.36",
		"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15",
		"Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:125.0) Gecko/20100101 Firefox/125.0",
		"curl/8.5.0",
		"Go-http-client/2.0",
	}
	regions = []string{"eu-west-1", "eu-central-1", "us-east-1", "ap-northeast-1"}
	tiers   = []string{"free", "pro", "enterprise"}
)
