//go:build linux

package procs

import (
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
)

// TestChildren finds a child while it runs, among the zombies once it
// exited, and nowhere once it is reaped.
func TestChildren(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	pid := cmd.Process.Pid
	if got := Children(os.Getpid()); !slices.Contains(got, pid) {
		t.Fatalf("Children = %v, want %d among them", got, pid)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for deadline := time.Now().Add(5 * time.Second); !slices.Contains(Zombies(os.Getpid()), pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Zombies = %v, want %d among them once killed", Zombies(os.Getpid()), pid)
		}
	}
	if got := Children(os.Getpid()); slices.Contains(got, pid) {
		t.Fatalf("Children = %v holds the zombie %d", got, pid)
	}
	cmd.Wait()
	if got := append(Children(os.Getpid()), Zombies(os.Getpid())...); slices.Contains(got, pid) {
		t.Fatalf("%d still listed after it was reaped: %v", pid, got)
	}
}
