package preload

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Why the shim cannot reach a program; matched with errors.Is on the
// *UnreachableError Inspect returns.
var (
	// ErrStatic: a statically linked program never runs the dynamic
	// loader, so LD_PRELOAD is never read.
	ErrStatic = errors.New("statically linked")
	// ErrGoProgram: Go programs make their system calls themselves, not
	// through the C library the shim stands in for.
	ErrGoProgram = errors.New("a Go program")
	// ErrSecure: the loader ignores LD_PRELOAD for a set-user-ID,
	// set-group-ID or file-capability program that gains privileges.
	ErrSecure = errors.New("set-user-ID, set-group-ID or with file capabilities")
)

// An UnreachableError says that the shim cannot reach a program, and why.
type UnreachableError struct {
	Path string // the program (the interpreter, for a script)
	Via  string // the script that names it, if any
	Err  error  // ErrStatic, ErrGoProgram or ErrSecure
}

func (e *UnreachableError) Error() string {
	s := fmt.Sprintf("%s is %v", e.Path, e.Err)
	if e.Via != "" {
		s = fmt.Sprintf("%s (the interpreter of %s) is %v", e.Path, e.Via, e.Err)
	}
	switch {
	case errors.Is(e.Err, ErrStatic), errors.Is(e.Err, ErrGoProgram):
		return s + ": its connections would not go through the preload shim"
	}
	return s + ": the loader ignores LD_PRELOAD for it"
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// Inspect checks that the shim can reach the program at path (a file,
// not looked up in PATH): a dynamically linked ELF executable that is not
// a Go program and that the loader does not run in secure mode. A script
// is judged by its interpreter (the #! line, and the program "env" runs).
// It returns an *UnreachableError, another error if the file cannot be
// read, or nil. Programs the program runs later are not checked.
func Inspect(path string) error {
	via := ""
	for depth := 0; depth < 4; depth++ {
		interp, err := inspectFile(path)
		if err != nil {
			var ue *UnreachableError
			if errors.As(err, &ue) {
				ue.Via = via
			}
			return err
		}
		if interp == "" {
			return nil
		}
		if via == "" {
			via = path
		}
		path = interp
	}
	return nil
}

// inspectFile checks one file and returns the interpreter a script names.
func inspectFile(path string) (interp string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if secure(fi, path) {
		return "", &UnreachableError{Path: path, Err: ErrSecure}
	}
	head := make([]byte, 512)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	if bytes.HasPrefix(head, []byte("#!")) {
		return scriptInterpreter(head)
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return "", nil // neither a script nor ELF: let exec say what it is
	}
	defer ef.Close()
	dynamic := false
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			dynamic = true
		}
	}
	if ef.Section(".go.buildinfo") != nil || ef.Section(".note.go.buildid") != nil {
		return "", &UnreachableError{Path: path, Err: ErrGoProgram}
	}
	// Without an interpreter the loader never runs, so nothing reads
	// LD_PRELOAD: static executables, static PIE. The loader itself (run
	// as "ld-linux-x86-64.so.2 PROGRAM") is the exception: it is the one
	// that reads it.
	if !dynamic && !strings.HasPrefix(filepath.Base(path), "ld-") {
		return "", &UnreachableError{Path: path, Err: ErrStatic}
	}
	return "", nil
}

// scriptInterpreter returns the program a #! line runs.
func scriptInterpreter(head []byte) (string, error) {
	line, _, _ := bytes.Cut(head[2:], []byte("\n"))
	fields := strings.Fields(string(line))
	if len(fields) == 0 {
		return "", nil
	}
	interp := fields[0]
	if filepath.Base(interp) == "env" {
		// "#!/usr/bin/env [-S] [NAME=VALUE...] PROGRAM": the program is
		// looked up in PATH, as env does.
		for _, f := range fields[1:] {
			if strings.HasPrefix(f, "-") || strings.Contains(f, "=") {
				continue
			}
			p, err := exec.LookPath(f)
			if err != nil {
				return "", nil // env will say it is missing
			}
			return p, nil
		}
	}
	return interp, nil
}

// secure reports whether executing the file puts the loader in secure
// mode (AT_SECURE), where LD_PRELOAD is ignored.
func secure(fi os.FileInfo, path string) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	if fi.Mode()&os.ModeSetuid != 0 && int(st.Uid) != os.Getuid() {
		return true
	}
	if fi.Mode()&os.ModeSetgid != 0 && int(st.Gid) != os.Getgid() {
		return true
	}
	if os.Getuid() != 0 {
		if n, err := syscall.Getxattr(path, "security.capability", nil); err == nil && n > 0 {
			return true
		}
	}
	return false
}
