package launch

import "github.com/vlink-dev/vlink/factories/shm"

// sharedMemory is the transport between ranks of one host.
func sharedMemory() (namedTransport, error) { return shm.New(shm.Options{}) }
