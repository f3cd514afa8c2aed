//go:build !unix

package netconn

import "time"

// processCPU is not measured here.
func processCPU() time.Duration { return 0 }
