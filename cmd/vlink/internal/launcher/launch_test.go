package launcher

import (
	"strings"
	"testing"
)

func TestCheckTemplate(t *testing.T) {
	for _, tc := range []struct {
		template, err string
	}{
		{"srun -n %N %C", ""},
		{"mpirun -np %N %C", ""},
		{"sh spawn.sh %N %D %P '%M' %% %C", ""},
		{"srun -n %N ./a.out", "never runs %C"},
		{"srun %X %C", "%X: the escapes are"},
		{"srun %C 100%", "lone %"},
		{"", "never runs %C"},
	} {
		t.Run(tc.template, func(t *testing.T) {
			err := checkTemplate(tc.template)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("checkTemplate(%q) = %v, want %q", tc.template, err, tc.err)
			}
		})
	}
}

func TestExpandTemplate(t *testing.T) {
	servers := []string{"n0", "n1", "n 2", "n3"}
	for _, tc := range []struct {
		template, want string
	}{
		{"srun -n %N %C", "srun -n 3 vlink launch --worker h:1 -- ./a.out"},
		{"cd %D && %C", "cd '/home/u/my job' && vlink launch --worker h:1 -- ./a.out"},
		{"run --hosts '%M' %P", "run --hosts 'n0 n1 'n 2'' ./a.out"},
		{"echo 100%% %%N", "echo 100% %N"},
		{"%C%C", "vlink launch --worker h:1 -- ./a.outvlink launch --worker h:1 -- ./a.out"},
	} {
		t.Run(tc.template, func(t *testing.T) {
			got := expandTemplate(tc.template, 3, "vlink launch --worker h:1 -- ./a.out", "/home/u/my job", servers, "./a.out")
			if got != tc.want {
				t.Errorf("expandTemplate(%q) = %q, want %q", tc.template, got, tc.want)
			}
		})
	}
}

func TestShellWord(t *testing.T) {
	for in, want := range map[string]string{
		"/usr/bin/vlink": "/usr/bin/vlink",
		"a b":            "'a b'",
		"it's":           `'it'\''s'`,
		"":               "''",
		"$HOME":          "'$HOME'",
		"--x=1,2":        "--x=1,2",
	} {
		if got := shellWord(in); got != want {
			t.Errorf("shellWord(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSummarize: ranks that ended alike are told together, in ranges.
func TestSummarize(t *testing.T) {
	hows := []string{"exited with status 0", "exited with status 0", "exited with status 0", "was killed by signal terminated",
		"exited with status 0", "", "exited with status 0", "exited with status 0"}
	var ws []*worker
	for r, how := range hows {
		ws = append(ws, &worker{rank: r, how: how})
	}
	want := "ranks 0-2, 4, 6-7: exited with status 0; rank 3: killed by signal terminated; rank 5: no end reported"
	if got := summarize(ws); got != want {
		t.Fatalf("summarize = %q\nwant        %q", got, want)
	}
}

// TestPick: an agent gets the rank its scheduler gave it when that one
// is free, else the lowest free rank, and none once all are given.
func TestPick(t *testing.T) {
	s := &customSpawner{taken: make([]bool, 4)}
	for i, tc := range []struct{ want, got int }{{2, 2}, {2, 0}, {-1, 1}, {9, 3}, {0, -1}} {
		if r := s.pick(tc.want); r != tc.got {
			t.Fatalf("pick %d: asked for %d, got %d, want %d", i, tc.want, r, tc.got)
		}
	}
	if s.started != 4 {
		t.Fatalf("started = %d, want 4", s.started)
	}
}

// TestExportEntry: -x takes NAME=VALUE, or NAME with its value here, and
// refuses what vlink launch sets itself.
func TestExportEntry(t *testing.T) {
	t.Setenv("VLINK_TEST_EXPORT", "from here")
	for _, tc := range []struct{ in, want, err string }{
		{"A=1", "A=1", ""},
		{"A=", "A=", ""},
		{"A=b=c", "A=b=c", ""},
		{"VLINK_TEST_EXPORT", "VLINK_TEST_EXPORT=from here", ""},
		{"VLINK_TEST_UNSET_X", "", "is not set here"},
		{"=x", "", "want NAME"},
		{"VLINK_RANK=3", "", "sets it for each worker"},
	} {
		got, err := exportEntry(tc.in)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("exportEntry(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}
