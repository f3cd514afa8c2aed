package testnet

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// StartHelper runs the test binary's test named test in a process of its
// own, with env added to the environment, as a helper a test measures
// apart from itself. The helper prints "addr A" once it listens on A;
// StartHelper returns A and the helper's later output. The helper is
// killed, if it is still running, when the test ends.
func StartHelper(tb testing.TB, test string, env ...string) (addr string, out *bufio.Scanner) {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	out = bufio.NewScanner(stdout)
	for addr == "" && out.Scan() {
		fmt.Sscanf(out.Text(), "addr %s", &addr)
	}
	if addr == "" {
		tb.Fatalf("helper %s printed no address", test)
	}
	return addr, out
}
