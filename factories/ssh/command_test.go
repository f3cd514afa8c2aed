package ssh_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/vlink-dev/vlink/factories/ssh"
	"github.com/vlink-dev/vlink/internal/realserver"
)

// TestCommand runs commands on OpenSSH's sshd through the factory's
// shared connection: their input, output, error and exit status arrive
// as ssh's would, and a connection that drops under a command is
// ErrLost, not a status.
func TestCommand(t *testing.T) {
	closeAll(t)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{})
	ctx := context.Background()
	for _, tc := range []struct {
		name, command, stdin, stdout, stderr string
		status                               int
	}{
		{"output and status", "echo out; echo err >&2; exit 3", "", "out\n", "err\n", 3},
		{"input", "tr a-z A-Z", "hello\n", "HELLO\n", "", 0},
		{"not found", "exec /nonexistent/vlink", "", "", "/nonexistent/vlink", 127},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := factory(t, s, ssh.Options{})
			cmd, err := f.Start(ctx, tc.command, nil)
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				io.WriteString(cmd.Stdin, tc.stdin)
				cmd.Stdin.Close()
			}()
			var out, errb bytes.Buffer
			done := make(chan struct{})
			go func() { io.Copy(&errb, cmd.Stderr); close(done) }()
			io.Copy(&out, cmd.Stdout)
			<-done
			err = cmd.Wait()
			status := 0
			var ee *gossh.ExitError
			if errors.As(err, &ee) {
				status = ee.ExitStatus()
			} else if err != nil {
				t.Fatalf("Wait: %v", err)
			}
			if status != tc.status || out.String() != tc.stdout || !strings.Contains(errb.String(), tc.stderr) {
				t.Errorf("status %d, stdout %q, stderr %q; want %d, %q, %q in stderr", status, out.String(), errb.String(), tc.status, tc.stdout, tc.stderr)
			}
		})
	}
	t.Run("connection lost", func(t *testing.T) {
		fw := &droppable{}
		f := factory(t, s, ssh.Options{NoShare: true})
		cmd, err := f.Start(ctx, "sleep 60", fw)
		if err != nil {
			t.Fatal(err)
		}
		fw.drop()
		waited := make(chan error, 1)
		go func() {
			io.Copy(io.Discard, cmd.Stdout)
			waited <- cmd.Wait()
		}()
		select {
		case err := <-waited:
			if !errors.Is(err, ssh.ErrLost) {
				t.Errorf("Wait after the connection dropped: %v, want ErrLost", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("Wait still waits 15 s after the connection dropped")
		}
	})
}
