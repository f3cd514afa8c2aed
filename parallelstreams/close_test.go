package parallelstreams

import (
	"testing"

	"github.com/vlink-dev/vlink/factories/quic"
	"github.com/vlink-dev/vlink/vlink"
)

// TestCloseWhileCreditFlows: the sender writes and closes at once, as a
// relay does when its side ends, while the receiver is still taking the
// stream's tail and granting credit for it. The receiver must get every
// byte and a clean end. Over QUIC, a stream closed outright tells the
// peer to stop sending (STOP_SENDING), so that credit's write failed and
// took the receiver's session down before the tail arrived: 3 runs in 20
// failed so before the sender drained its substreams on Close.
func TestCloseWhileCreditFlows(t *testing.T) {
	t.Cleanup(quic.CloseAll)
	l := listen(t, vlink.ListenConfig{Quic: true})
	c, s := dialPair(t, l, "parallel:streams=4,window=1M+quic")
	const n = 8 << 20
	done := make(chan error, 1)
	go func() {
		_, err := sendSum(s, 8, n)
		if err == nil {
			err = s.Close()
		}
		done <- err
	}()
	got, ok, err := prefixCheck(c, 8)
	if werr := <-done; werr != nil {
		t.Fatalf("sender: %v", werr)
	}
	if err != nil || got != n || !ok {
		t.Fatalf("receiver got %d of %d bytes (intact %v), then %v", got, n, ok, err)
	}
}
