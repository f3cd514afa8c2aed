package testnet

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ScrapeMetrics reads a Prometheus text exposition at url (a vlink
// --metrics endpoint) and returns each series, name and labels as
// written, with its value.
func ScrapeMetrics(tb testing.TB, url string) map[string]float64 {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		tb.Fatalf("GET %s: %s, %s", url, resp.Status, resp.Header.Get("Content-Type"))
	}
	series := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			tb.Fatalf("%s: bad line %q", url, line)
		}
		series[line[:i]] = v
	}
	return series
}

// WaitMetrics scrapes url until every series of want has its value, for
// up to 10 s, and returns the last scrape; who names the process in the
// failure.
func WaitMetrics(tb testing.TB, who, url string, want map[string]float64) map[string]float64 {
	tb.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		got := ScrapeMetrics(tb, url)
		var wrong []string
		for k, v := range want {
			if got[k] != v {
				wrong = append(wrong, fmt.Sprintf("%s = %v, want %v", k, got[k], v))
			}
		}
		if len(wrong) == 0 {
			return got
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s's metrics:\n%s", who, strings.Join(wrong, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
