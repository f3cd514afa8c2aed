//go:build linux

package netconn_test

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/vlink"
)

// realFixture starts the real server for a layer when its programs are
// installed and it may run them (sshd needs root). In CI it must: a
// missing program fails the test there.
func realFixture(t *testing.T, layer string) (vlink.Stack, bool) {
	have := func(progs ...string) bool {
		for _, p := range progs {
			if _, err := exec.LookPath(p); err != nil {
				if _, err := os.Stat("/usr/sbin/" + p); err != nil {
					return false
				}
			}
		}
		return true
	}
	canSSHD := have("sshd", "ssh") && os.Geteuid() == 0
	switch layer {
	case "ssh":
		if !canSSHD && !realserver.InCI() {
			return vlink.Stack{}, false
		}
		s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
		return vlink.MustParse(fmt.Sprintf("ssh:host=%s,port=%d,user=%s,identity=%s,known-hosts=%s,agent=false,config=none",
			s.Host, s.Port, s.User, s.UserKey.Private, s.KnownHosts)), true
	case "socks4", "socks4a":
		if !canSSHD && !realserver.InCI() {
			return vlink.Stack{}, false
		}
		s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
		return vlink.MustParse(layer + ":addr=" + s.StartDynamic(t)), true
	case "socks5":
		if !have("danted") && !realserver.InCI() {
			return vlink.Stack{}, false
		}
		d := realserver.StartDante(t, false)
		return vlink.MustParse("socks5:addr=" + d.Addr), true
	}
	return vlink.Stack{}, false
}
