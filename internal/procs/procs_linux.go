// Package procs reads the kernel's process table under /proc, for the
// commands that must find what the processes they started left behind
// (vlink exec's and vlink launch's subreaper).
package procs

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Children returns the live children of pid (zombies left out).
func Children(pid int) []int { return children(pid, false) }

// Zombies returns the children of pid that have exited and wait to be
// reaped.
func Zombies(pid int) []int { return children(pid, true) }

func children(pid int, zombies bool) []int {
	entries, _ := os.ReadDir("/proc")
	parent := strconv.Itoa(pid)
	var pids []int
	for _, ent := range entries {
		p, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 2 && f[1] == parent && (f[0] == "Z") == zombies {
			pids = append(pids, p)
		}
	}
	return pids
}
