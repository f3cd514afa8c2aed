//go:build linux

package docs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// TestReadmeExamples runs the shell examples of the README, then those of
// the guide, as a newcomer would: one bash session in a copy of the
// checkout, where the README's own install block puts vlink on the PATH
// (nothing else does), each example as written, one after the other. The
// session has a network namespace of its own, so the examples' fixed
// ports collide with no other test. Each example must end with status 0,
// print what its marker expects, and leave the checkout as it was, but
// for new files in its root (keys, config files): a build that writes
// into the tree, as "go build -o vlink" did, fails here.
func TestReadmeExamples(t *testing.T) {
	testenv.Netns(t, "bash", "git", "ss", "python3", "curl", "cc", "iperf3", "socat", "socksify", "dnsmasq", "dig")
	root := moduleRoot(t)
	var examples []example
	for _, e := range readExamples(t, root) {
		if e.run {
			examples = append(examples, e)
		}
	}
	sh, err := script(examples)
	if err != nil {
		t.Fatal(err)
	}

	work := t.TempDir()
	checkout := filepath.Join(work, "vlink") // as git clone names it
	out := filepath.Join(work, "out")
	home := filepath.Join(work, "home")
	gopath := filepath.Join(work, "go")
	for _, d := range []string{out, home} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := sessionEnv(t, home, gopath, out)
	copyCheckout(t, root, checkout, env)
	scriptFile := filepath.Join(work, "examples.sh")
	if err := os.WriteFile(scriptFile, []byte(sh), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(work, "session.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()

	cmd := exec.Command("bash", scriptFile)
	cmd.Dir = checkout
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("bash in a new network namespace: %v", err)
	}
	netns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal(err)
	}
	// Whatever the examples left running dies with the test, before
	// TempDir's removal: every process of the namespace is theirs.
	t.Cleanup(func() { killNamespace(t, netns) })

	timeout := 8 * time.Minute
	if d, ok := t.Deadline(); ok && time.Until(d)-30*time.Second < timeout {
		timeout = time.Until(d) - 30*time.Second
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(timeout):
		killNamespace(t, netns)
		runErr = fmt.Errorf("still running after %v, killed", timeout)
		<-done
	}
	t.Logf("%d examples in %v", len(examples), time.Since(start).Round(time.Millisecond))

	for n, e := range examples {
		stdout, _ := os.ReadFile(filepath.Join(out, strconv.Itoa(n)+".out"))
		status, err := os.ReadFile(filepath.Join(out, strconv.Itoa(n)+".status"))
		if err != nil {
			stderr, _ := os.ReadFile(filepath.Join(out, strconv.Itoa(n)+".err"))
			session, _ := os.ReadFile(logFile.Name())
			t.Fatalf("%s: the example failed (bash: %v):\n%s\nits standard output:\n%s\nits standard error:\n%s\nthe session's:\n%s",
				e, runErr, e.text, tail(stdout), tail(stderr), tail(session))
		}
		for _, want := range e.expect {
			if !bytes.Contains(stdout, []byte(want)) {
				t.Errorf("%s: the example's output does not hold %q:\n%s\nits standard output:\n%s", e, want, e.text, tail(stdout))
			}
		}
		for _, line := range strings.Split(strings.TrimSpace(string(status)), "\n") {
			if line == "" {
				continue
			}
			if path, ok := strings.CutPrefix(line, "?? "); !ok || strings.Contains(path, "/") {
				t.Errorf("%s: the example changed the checkout (git status: %q); an example may only add files to the folder it runs in", e, line)
			}
		}
	}
	if runErr != nil {
		t.Errorf("bash: %v", runErr)
	}
	which, _ := os.ReadFile(filepath.Join(out, "which"))
	if got, want := strings.TrimSpace(string(which)), filepath.Join(gopath, "bin", "vlink"); got != want {
		t.Errorf("the examples ran vlink from %q, want %q, where the README's go install puts it", got, want)
	}
}

// sessionEnv is a newcomer's environment: a home of its own, Go's
// default GOPATH there with its bin folder not on the PATH (the README
// says to add it), and the module and build caches of this machine, so
// that nothing is downloaded (the namespace has no network) and only the
// copy's own packages compile.
func sessionEnv(tb testing.TB, home, gopath, out string) []string {
	tb.Helper()
	goenv := func(name string) string {
		b, err := exec.Command("go", "env", name).Output()
		if err != nil {
			tb.Fatalf("go env %s: %v", name, err)
		}
		return strings.TrimSpace(string(b))
	}
	path := []string{filepath.Join(goenv("GOROOT"), "bin"),
		"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}
	return []string{
		"PATH=" + strings.Join(path, ":"),
		"HOME=" + home,
		"GOPATH=" + gopath,
		"GOCACHE=" + goenv("GOCACHE"),
		"GOMODCACHE=" + goenv("GOMODCACHE"),
		"GOPROXY=off",
		"GOTOOLCHAIN=local",
		"LANG=C.UTF-8",
		"TMPDIR=" + os.TempDir(),
		"VLINK_OUT=" + out,
	}
}

// copyCheckout copies the files git knows of (tracked or not ignored)
// into dst and commits them there, so that git status shows what the
// examples change: the working tree as it is, README edits included.
func copyCheckout(tb testing.TB, root, dst string, env []string) {
	tb.Helper()
	list := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	list.Dir = root
	files, err := list.Output()
	if err != nil {
		testenv.Missing(tb, "needs a git checkout of vlink to copy (git ls-files in %s: %v)", root, err)
	}
	for _, f := range strings.Split(strings.TrimSuffix(string(files), "\x00"), "\x00") {
		src := filepath.Join(root, f)
		fi, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted, not yet committed
		}
		if err != nil {
			tb.Fatal(err)
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		if err := copyFile(src, filepath.Join(dst, f), fi.Mode().Perm()); err != nil {
			tb.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"init", "-q"},
		{"add", "-A"},
		{"-c", "user.name=vlink", "-c", "user.email=vlink@example.invalid", "-c", "commit.gpgsign=false",
			"commit", "-q", "-m", "the checkout, as the examples find it"},
	} {
		c := exec.Command("git", args...)
		c.Dir, c.Env = dst, env
		if b, err := c.CombinedOutput(); err != nil {
			tb.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, b)
		}
	}
}

func copyFile(src, dst string, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// killNamespace stops every process of the network namespace netns
// ("net:[INODE]"): SIGTERM, then SIGKILL to those still there 10 s later.
func killNamespace(tb testing.TB, netns string) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		for _, pid := range namespacePids(netns) {
			syscall.Kill(pid, sig)
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			if len(namespacePids(netns)) == 0 {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	tb.Errorf("processes %v of the examples' namespace outlive SIGKILL", namespacePids(netns))
}

// namespacePids lists the processes whose network namespace is netns.
func namespacePids(netns string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		if ns, err := os.Readlink("/proc/" + ent.Name() + "/ns/net"); err == nil && ns == netns {
			pids = append(pids, pid)
		}
	}
	return pids
}

// tail is the end of a long output, enough to read a failure.
func tail(b []byte) string {
	const max = 6000
	if len(b) > max {
		return "..." + string(b[len(b)-max:])
	}
	return string(b)
}
