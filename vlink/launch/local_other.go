//go:build !linux

package launch

import "errors"

// sharedMemory is the transport between ranks of one host: none here,
// where package factories/shm does not run.
func sharedMemory() (namedTransport, error) {
	return nil, errors.New("launch: shared memory between ranks needs Linux")
}
