package preload

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
)

// ShimSource is the C source of the preload shim. vlink exec compiles it
// once per user and source version (BuildShim), so that a checkout with Go
// and a C compiler is all it takes.
//
//go:embed shim/vlink_preload.c
var ShimSource []byte

// EnvPreload names a prebuilt shim, for systems without a C compiler (a
// package can ship the .so): vlink exec then uses it as is.
const EnvPreload = "VLINK_PRELOAD"

// ShimFlags are the compiler flags the shim is built with: C11, position
// independent, every warning an error in the tests.
var ShimFlags = []string{"-std=c11", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra"}

// ShimLibs are the libraries the shim links against.
var ShimLibs = []string{"-ldl", "-pthread"}

// ErrNoCompiler is matched when the shim must be built and no C compiler
// is found.
var ErrNoCompiler = errors.New("no C compiler found")

// compiler returns the C compiler to use: $CC, else cc, else gcc.
func compiler() (string, error) {
	if cc := os.Getenv("CC"); cc != "" {
		return exec.LookPath(cc)
	}
	for _, name := range []string{"cc", "gcc", "clang"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", ErrNoCompiler
}

// ShimPath returns the path of a built shim: $VLINK_PRELOAD if set,
// else the copy in dir (the user's cache when dir is empty) for this
// source, built now if it is not there yet.
func ShimPath(dir string) (string, error) {
	if p := os.Getenv(EnvPreload); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", EnvPreload, p, err)
		}
		return p, nil
	}
	return BuildShim(dir)
}

// BuildShim compiles ShimSource into dir/preload-HASH/libvlink-preload.so,
// where HASH covers the source, the flags and the architecture, and
// returns its path; a copy already there is reused. An empty dir means
// the user's cache directory (os.UserCacheDir()/vlink). The build writes
// a temporary file and renames it, so concurrent builds are safe.
func BuildShim(dir string) (string, error) {
	if dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("preload: no cache directory for the shim (%v); set %s to a built shim", err, EnvPreload)
		}
		dir = filepath.Join(cache, "vlink")
	}
	h := sha256.New()
	h.Write(ShimSource)
	fmt.Fprintf(h, "\x00%s\x00%s\x00%s/%s", strings.Join(ShimFlags, " "), strings.Join(ShimLibs, " "), runtime.GOOS, runtime.GOARCH)
	sub := filepath.Join(dir, "preload-"+hex.EncodeToString(h.Sum(nil))[:16])
	so := filepath.Join(sub, "libvlink-preload.so")
	if err := checkOwned(so); err == nil {
		return so, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	cc, err := compiler()
	if err != nil {
		return "", fmt.Errorf("preload: the shim must be compiled once, but %w (looked for $CC, cc, gcc, clang): "+
			"install one (apt install gcc libc6-dev) or set %s to a built libvlink-preload.so", ErrNoCompiler, EnvPreload)
	}
	if err := os.MkdirAll(sub, 0o700); err != nil {
		return "", fmt.Errorf("preload: %w", err)
	}
	src := filepath.Join(sub, fmt.Sprintf("vlink_preload.%d.c", os.Getpid()))
	tmp := filepath.Join(sub, fmt.Sprintf(".libvlink-preload.%d.so", os.Getpid()))
	defer os.Remove(src)
	defer os.Remove(tmp)
	if err := os.WriteFile(src, ShimSource, 0o600); err != nil {
		return "", fmt.Errorf("preload: %w", err)
	}
	args := append(append(append([]string{}, ShimFlags...), "-o", tmp, src), ShimLibs...)
	cmd := exec.Command(cc, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("preload: compiling the shim with %s: %w\n%s", cc, err, out.String())
	}
	if err := os.Rename(tmp, so); err != nil {
		return "", fmt.Errorf("preload: %w", err)
	}
	return so, nil
}

// checkOwned refuses a cached shim that someone else could have written:
// it is loaded into every program vlink exec runs.
func checkOwned(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Getuid() || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("preload: %s is not owned by you or is writable by others; remove it", path)
	}
	dir, err := os.Stat(filepath.Dir(path))
	if err == nil {
		if st, ok := dir.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() || dir.Mode().Perm()&0o022 != 0 {
			return fmt.Errorf("preload: %s is not owned by you or is writable by others; remove it", filepath.Dir(path))
		}
	}
	return err
}
