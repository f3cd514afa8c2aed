//go:build linux

package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// connectGateway starts a real sshd and a vlink serve that lets keyed
// dialers reach it, and returns the ssh client arguments that reach sshd
// through "vlink connect --stack zstd" as ProxyCommand.
func connectGateway(t *testing.T) (s *realserver.SSHD, serve *proc, sshArgs []string) {
	t.Helper()
	testenv.Programs(t, "ssh")
	s = realserver.StartSSHD(t, realserver.SSHDOptions{})
	key := filepath.Join(t.TempDir(), "vlink.key")
	if _, stderr, err := run(10*time.Second, nil, vlinkBin, "key", "--out", key); err != nil {
		t.Fatalf("vlink key: %v: %s", err, stderr)
	}
	serve, gw := startVLink(t, "serve", "--allow", s.Addr, "--key-file", key, "--log-level", "debug")
	proxy := fmt.Sprintf("%s connect --stack zstd --via %s --key-file %s --known-nodes none %%h %%p", vlinkBin, gw, key)
	sshArgs = []string{"-F", "none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
		"-o", "UserKnownHostsFile=" + s.KnownHosts, "-i", s.UserKey.Private,
		"-p", strconv.Itoa(s.Port), "-o", "ProxyCommand=" + proxy}
	return s, serve, sshArgs
}

// TestConnectProxyCommand runs OpenSSH's ssh with vlink connect as its
// ProxyCommand, through vlink serve to a real sshd, as a user would:
// bytes each way checked by SHA-256, the remote command's exit status,
// and a git clone through core.sshCommand.
func TestConnectProxyCommand(t *testing.T) {
	s, serve, sshArgs := connectGateway(t)
	dest := s.User + "@" + s.Host
	ssh := func(stdin []byte, command string) ([]byte, string, error) {
		t.Helper()
		var in io.Reader // nil: /dev/null
		if stdin != nil {
			in = bytes.NewReader(stdin)
		}
		return run(2*time.Minute, in, "ssh", append(sshArgs, dest, command)...)
	}

	t.Run("upload", func(t *testing.T) {
		data := genData(16<<20, 21)
		out, stderr, err := ssh(data, "sha256sum")
		if err != nil {
			t.Fatalf("ssh: %v: %s", err, stderr)
		}
		if got, _, _ := strings.Cut(string(out), " "); got != testnet.Sum(data) {
			t.Errorf("sshd's sha256sum of 16 MiB sent through vlink connect: %q, want %s", out, testnet.Sum(data))
		}
	})
	t.Run("download", func(t *testing.T) {
		data := genData(16<<20, 22)
		path := filepath.Join(t.TempDir(), "data.bin")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		out, stderr, err := ssh(nil, "cat "+path)
		if err != nil {
			t.Fatalf("ssh: %v: %s", err, stderr)
		}
		if len(out) != len(data) || testnet.Sum(out) != testnet.Sum(data) {
			t.Errorf("ssh cat through vlink connect: %d bytes, want %d with the file's SHA-256", len(out), len(data))
		}
	})
	t.Run("exit status", func(t *testing.T) {
		_, stderr, err := ssh(nil, "exit 7")
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 7 {
			t.Errorf("ssh 'exit 7' through vlink connect: %v, want exit status 7; stderr: %s", err, stderr)
		}
	})
	t.Run("git clone", func(t *testing.T) {
		testenv.Programs(t, "git")
		dir := t.TempDir()
		src := filepath.Join(dir, "src")
		git := func(args ...string) string {
			t.Helper()
			out, stderr, err := run(time.Minute, nil, "git", append([]string{"-c", "user.name=vlink", "-c", "user.email=vlink@example.invalid"}, args...)...)
			if err != nil {
				t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, stderr)
			}
			return strings.TrimSpace(string(out))
		}
		git("init", "-q", src)
		content := genData(4<<20, 23)
		if err := os.WriteFile(filepath.Join(src, "data.bin"), content, 0o644); err != nil {
			t.Fatal(err)
		}
		git("-C", src, "add", "data.bin")
		git("-C", src, "commit", "-q", "-m", "data")
		head := git("-C", src, "rev-parse", "HEAD")

		// core.sshCommand is run by the shell: quote the ProxyCommand.
		cmd := "ssh"
		for _, a := range sshArgs {
			cmd += " '" + a + "'"
		}
		dst := filepath.Join(dir, "clone")
		git("-c", "core.sshCommand="+cmd, "clone", "-q", fmt.Sprintf("ssh://%s:%d%s", dest, s.Port, src), dst)
		if got := git("-C", dst, "rev-parse", "HEAD"); got != head {
			t.Errorf("the clone's HEAD is %s, want %s", got, head)
		}
		got, err := os.ReadFile(filepath.Join(dst, "data.bin"))
		if err != nil || testnet.Sum(got) != testnet.Sum(content) {
			t.Errorf("the clone's data.bin: %d bytes, error %v; want %d with the committed SHA-256", len(got), err, len(content))
		}
	})
	// Every ssh went through the gateway, compressed: four ssh runs, and
	// git's.
	fwd := regexp.MustCompile(`msg=forwarding remote=\S+ stack=zstd target=` + regexp.QuoteMeta(s.Addr) + ` `)
	if n := len(fwd.FindAllString(serve.Output(), -1)); n != 4 {
		t.Errorf("vlink serve forwarded %d zstd connections to sshd, want 4:\n%s", n, serve.Output())
	}
	if strings.Contains(serve.Output(), "level=WARN") || strings.Contains(serve.Output(), "level=INFO msg=\"connection failed") {
		t.Errorf("vlink serve warned or failed a connection:\n%s", serve.Output())
	}
}

// TestConnectServeKilled kills the gateway while vlink connect carries a
// live ssh session: vlink connect must exit with status 1 and say why,
// though its stdin is still open, not end as if the stream were whole.
func TestConnectServeKilled(t *testing.T) {
	s, serve, sshArgs := connectGateway(t)
	proxy := ""
	for i, a := range sshArgs {
		if a == "-o" && strings.HasPrefix(sshArgs[i+1], "ProxyCommand=") {
			proxy = strings.TrimPrefix(sshArgs[i+1], "ProxyCommand=")
		}
	}
	args := strings.Fields(strings.NewReplacer("%h", s.Host, "%p", strconv.Itoa(s.Port)).Replace(proxy))
	cmd := exec.Command(args[0], args[1:]...)
	stdin, err := cmd.StdinPipe() // held open: only the cut may end vlink connect
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	var stderr bytes.Buffer
	stdout := &testnet.Buffer{}
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// sshd's banner came through: the connection is up, and sshd waits
	// for ours.
	deadline := time.Now().Add(startTimeout)
	for !strings.HasPrefix(stdout.String(), "SSH-2.0-") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no SSH banner from sshd through vlink connect; stderr:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	serve.Kill()
	<-serve.Done()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), "vlink connect: receiving from") {
			t.Errorf("vlink connect after its gateway was killed: %v (want exit status 1), stderr:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("vlink connect still running 30 s after its gateway was killed; stderr:\n%s", stderr.String())
	}
}
