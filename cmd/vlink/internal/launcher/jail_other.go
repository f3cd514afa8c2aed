//go:build !linux

package launcher

import (
	"os/exec"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
)

// A jail: only Linux has cgroups and subreapers; elsewhere a process
// that leaves its worker's process group escapes the job.
type jail struct{}

func holdJob(e *base.Env, _ *guard) *jail {
	e.Log.Info("the job's processes are not held: only Linux can (cgroups, subreaper)")
	return nil
}
func (j *jail) start(cmd *exec.Cmd) error { return cmd.Start() }
func (j *jail) stop(time.Duration)        {}
func endCgroup(string, time.Duration)     {}
