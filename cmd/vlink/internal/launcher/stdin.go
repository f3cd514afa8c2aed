package launcher

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
)

// A stdinFeed hands vlink launch's standard input to the ranks --stdin
// names: one rank (0 by default, as mpirun), every rank (all, as srun
// --input=all), or none (their input is empty). The ranks that take it
// subscribe as they start; it reads once every one has, so none misses
// the start, and writes each chunk to each in turn: a rank that does not
// read holds the others back, as a pipe would. A rank that fails a write
// (it exited) is dropped; the end of the input ends everyone's.
type stdinFeed struct {
	src  io.Reader
	all  bool
	rank int // without all: the rank that takes it; -1 for none
	want int // subscribers before reading starts

	mu   sync.Mutex
	subs []stdinSink
}

type stdinSink struct {
	write func([]byte) error
	close func()
}

// newStdinFeed parses --stdin for a job of n workers.
func newStdinFeed(which string, n int, src io.Reader) (*stdinFeed, error) {
	f := &stdinFeed{src: src, rank: -1}
	switch which {
	case "none":
	case "all":
		f.all, f.want = true, n
	default:
		r, err := strconv.Atoi(which)
		if err != nil || r < 0 || r >= n {
			return nil, fmt.Errorf("--stdin %q: want all, none or a rank, 0 to %d", which, n-1)
		}
		f.rank, f.want = r, 1
	}
	return f, nil
}

// wants reports whether rank r takes the input.
func (f *stdinFeed) wants(r int) bool { return f.all || f.rank == r }

// direct returns the file rank r may read itself, in place of a copy:
// the input when r alone takes it and it is no terminal (a worker in a
// process group of its own that read the terminal would be stopped).
func (f *stdinFeed) direct(r int) *os.File {
	if file, ok := f.src.(*os.File); ok && !f.all && f.rank == r && !isTerminal(file) {
		return file
	}
	return nil
}

// subscribe adds a rank's sink; the last one expected starts the copy.
func (f *stdinFeed) subscribe(write func([]byte) error, close func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subs = append(f.subs, stdinSink{write, close})
	if len(f.subs) == f.want {
		go f.pump(slices.Clone(f.subs))
	}
}

func (f *stdinFeed) pump(subs []stdinSink) {
	if file, ok := f.src.(*os.File); ok && inBackground(file) {
		// Run in the background of a terminal, as mpirun ... & would
		// be stopped reading it: the input ends at once instead.
		for _, s := range subs {
			s.close()
		}
		return
	}
	buf := make([]byte, 32<<10)
	for len(subs) > 0 {
		n, err := f.src.Read(buf)
		if n > 0 {
			live := subs[:0]
			for _, s := range subs {
				if s.write(buf[:n]) == nil {
					live = append(live, s)
				} else {
					s.close()
				}
			}
			subs = live
		}
		if err != nil {
			break
		}
	}
	for _, s := range subs {
		s.close()
	}
}
