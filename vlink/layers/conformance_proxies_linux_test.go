//go:build linux

package layers_test

import (
	"fmt"
	"testing"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/vlink"
)

// realFixture starts the real server for a layer when its programs are
// installed and it may run them (sshd needs root). Where nothing may be
// skipped (testenv.Strict) it must: a missing program fails the test.
func realFixture(t *testing.T, layer string) (vlink.Stack, bool) {
	canSSHD := testenv.Has("sshd", "ssh") && testenv.IsRoot()
	switch layer {
	case "ssh":
		if !canSSHD && !testenv.Strict() {
			return vlink.Stack{}, false
		}
		s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
		return vlink.MustParse(fmt.Sprintf("ssh:host=%s,port=%d,user=%s,identity=%s,known-hosts=%s,agent=false,config=none",
			s.Host, s.Port, s.User, s.UserKey.Private, s.KnownHosts)), true
	case "socks4", "socks4a":
		if !canSSHD && !testenv.Strict() {
			return vlink.Stack{}, false
		}
		s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
		return vlink.MustParse(layer + ":addr=" + s.StartDynamic(t)), true
	case "socks5":
		if !testenv.Has("danted") && !testenv.Strict() {
			return vlink.Stack{}, false
		}
		d := realserver.StartDante(t, false)
		return vlink.MustParse("socks5:addr=" + d.Addr), true
	}
	return vlink.Stack{}, false
}
