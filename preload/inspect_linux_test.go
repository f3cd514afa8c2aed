package preload

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/vlink-dev/vlink/internal/testenv"
)

func TestInspect(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	progs := testenv.Programs(t, "sh", "go")
	sh, goTool := progs[0], progs[1]
	cases := []struct {
		name string
		path string
		want error
	}{
		{"dynamic", sh, nil},
		{"script", write("s.sh", "#!"+sh+" -e\necho hi\n", 0o755), nil},
		{"env script", write("e.sh", "#!/usr/bin/env -S sh -e\necho hi\n", 0o755), nil},
		{"go program", goTool, ErrGoProgram},
		{"script run by go", write("g.sh", "#!"+goTool+"\n", 0o755), ErrGoProgram},
		{"not elf", write("data", "hello", 0o755), nil},
	}
	// The static case needs a C compiler and a static C library: checked
	// in its subtest, so that a machine without them skips it by name.
	static := filepath.Join(dir, "static")
	cases = append(cases, struct {
		name string
		path string
		want error
	}{"static", static, ErrStatic})
	var staticErr error
	var staticOut []byte
	if cc, err := compiler(); err != nil {
		staticErr = err
	} else {
		src := write("static.c", "int main(void) { return 0; }\n", 0o644)
		staticOut, staticErr = exec.Command(cc, "-static", "-o", static, src).CombinedOutput()
	}
	if testenv.IsRoot() {
		b, err := os.ReadFile(sh)
		if err != nil {
			t.Fatal(err)
		}
		suid := write("suid", string(b), 0o755)
		if err := os.Chown(suid, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(suid, 0o755|os.ModeSetuid); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct {
			name string
			path string
			want error
		}{"setuid", suid, ErrSecure})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "static" && staticErr != nil {
				testenv.Missing(t, "needs a C compiler and a static C library (Debian: gcc, libc6-dev; %s installs them): %v\n%s", testenv.Install, staticErr, staticOut)
			}
			err := Inspect(tc.path)
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("Inspect(%s) = %v, want %v", tc.path, err, tc.want)
			}
			var ue *UnreachableError
			if tc.want != nil && (!errors.As(err, &ue) || ue.Path == "") {
				t.Errorf("error %v is not an *UnreachableError naming the program", err)
			}
		})
	}
	if err := Inspect(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing program: %v", err)
	}
}
