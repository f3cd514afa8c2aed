package control

import (
	"bytes"
	"testing"
)

// TestCloseFlushes: a node that replies and closes at once still gets
// its reply to the asker, as a socket's close sends what was written.
func TestCloseFlushes(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	asker := connect(t, r.addr, "asker")
	for i := range 20 {
		leaver := connect(t, r.addr, "leaver")
		replied := make(chan struct{})
		leaver.Handle(typeEcho, func(m *Message) {
			m.Reply(ctxT(t), typeReply, bytes.Repeat([]byte{byte(i)}, 32<<10))
			close(replied)
		})
		coop := asker.Cooperate(Expect{From: "leaver", Type: typeReply})
		if err := coop.Send(ctxT(t), "leaver", typeEcho, []byte("last words?")); err != nil {
			t.Fatal(err)
		}
		<-replied
		leaver.Close()
		replies, err := coop.Wait(ctxT(t))
		if err != nil || len(replies[0].Payload) != 32<<10 {
			t.Fatalf("round %d: the reply of a node that closed right after it: %v", i, err)
		}
	}
}
