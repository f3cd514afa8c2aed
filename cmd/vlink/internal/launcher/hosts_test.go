package launcher

import (
	"slices"
	"strings"
	"testing"
)

func TestExpandHosts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{"node1", []string{"node1"}, ""},
		{"node[1-3,7]", []string{"node1", "node2", "node3", "node7"}, ""},
		{"n[08-10]", []string{"n08", "n09", "n10"}, ""},
		{"me@r[1-2]x:2222", []string{"me@r1x:2222", "me@r2x:2222"}, ""},
		{"a[1-2]b[3,5]", []string{"a1b3", "a1b5", "a2b3", "a2b5"}, ""},
		{"node[3-1]", nil, "not a number or a range"},
		{"node[x]", nil, "not a number or a range"},
		{"node[1-2", nil, "without its ]"},
		{"node1]", nil, "without its ["},
		{"n[0-99999]", nil, "more than"},
	} {
		got, err := expandHosts(tc.in)
		if !slices.Equal(got, tc.want) || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("expandHosts(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestParseHostfile(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{"# the cluster\nnode1 slots=2\nnode[2-3]\n\nnode4 slots=1 max_slots=4  # comment\n",
			[]string{"node1", "node1", "node2", "node3", "node4"}, ""},
		{"a slots=0\n", nil, "hosts:1: slots=\"0\""},
		{"a\nb cpus=4\n", nil, "hosts:2: \"cpus=4\": want HOST [slots=N]"},
		{"# nothing\n", nil, "names no host"},
		{"n[1-\n", nil, "hosts:1: host"},
	} {
		got, err := parseHostfile(strings.NewReader(tc.in), "hosts")
		if !slices.Equal(got, tc.want) || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("parseHostfile(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// FuzzHostfile: whatever the file, no panic, bounded output, and every
// host it returns comes from a line of it.
func FuzzHostfile(f *testing.F) {
	f.Add("node[1-4,7] slots=2\n# x\nb\n")
	f.Add("a[01-10]b[1-2]:22 slots=3")
	f.Fuzz(func(t *testing.T, in string) {
		hosts, err := parseHostfile(strings.NewReader(in), "f")
		if err != nil {
			return
		}
		if len(hosts) == 0 || len(hosts) > maxHosts {
			t.Fatalf("%d hosts", len(hosts))
		}
	})
}

func TestSplitHosts(t *testing.T) {
	got := splitHosts("a,node[1-3,7] b\tc,")
	if want := []string{"a", "node[1-3,7]", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("splitHosts = %q, want %q", got, want)
	}
}
