package launcher

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// maxHosts bounds what a host range or a hostfile may expand to.
const maxHosts = 1 << 16

// expandHosts expands a host word's ranges, as Slurm's host lists and
// pdsh write them: "node[1-4,7]" is node1 to node4 and node7, leading
// zeros kept ("n[08-10]": n08 n09 n10), with any number of bracketed
// groups; a user@ before and a :port after stay on every name.
func expandHosts(word string) ([]string, error) {
	open := strings.IndexByte(word, '[')
	if open < 0 {
		if strings.ContainsRune(word, ']') {
			return nil, fmt.Errorf("host %q: a ] without its [", word)
		}
		return []string{word}, nil
	}
	end := strings.IndexByte(word[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("host %q: a [ without its ]", word)
	}
	end += open
	prefix, list, rest := word[:open], word[open+1:end], word[end+1:]
	tails, err := expandHosts(rest)
	if err != nil {
		return nil, err
	}
	var out []string
	for part := range strings.SplitSeq(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		a, errA := strconv.Atoi(lo)
		b, errB := strconv.Atoi(hi)
		if errA != nil || errB != nil || a < 0 || b < a || lo == "" {
			return nil, fmt.Errorf("host %q: %q is not a number or a range of numbers (1-4)", word, part)
		}
		width := 0
		if len(lo) > 1 && lo[0] == '0' {
			width = len(lo) // zero-padded, as written
		}
		for n := a; n <= b; n++ {
			for _, tail := range tails {
				if len(out) >= maxHosts {
					return nil, fmt.Errorf("host %q: more than %d names", word, maxHosts)
				}
				out = append(out, fmt.Sprintf("%s%0*d%s", prefix, width, n, tail))
			}
		}
	}
	return out, nil
}

// readHostfile reads a hostfile as mpirun takes one: a host (ranges
// allowed) per line, optionally "slots=N" for how many workers it runs
// before the next host gets one (1 without), "#" comments. It returns
// each host repeated by its slots, in order: the ssh spawner runs rank R
// on the R-th entry, modulo their number.
func readHostfile(name string) ([]string, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseHostfile(f, name)
}

func parseHostfile(r io.Reader, name string) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		slots := 1
		for _, f := range fields[1:] {
			switch k, v, _ := strings.Cut(f, "="); k {
			case "slots":
				var err error
				if slots, err = strconv.Atoi(v); err != nil || slots < 1 || slots > maxHosts {
					return nil, fmt.Errorf("%s:%d: slots=%q: want a number of workers, 1 or more", name, n, v)
				}
			case "max_slots", "max-slots":
				// A bound on oversubscription: ranks beyond the slots
				// start again at the first host, as with --ssh-servers.
			default:
				return nil, fmt.Errorf("%s:%d: %q: want HOST [slots=N]", name, n, f)
			}
		}
		hosts, err := expandHosts(fields[0])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		for _, h := range hosts {
			for range slots {
				if len(out) >= maxHosts {
					return nil, fmt.Errorf("%s: more than %d slots", name, maxHosts)
				}
				out = append(out, h)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s names no host", name)
	}
	return out, nil
}
