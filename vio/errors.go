package vio

import (
	"errors"
	"fmt"
	"os"
)

// Errors a program tests with errors.Is.
var (
	// ErrBusy: an operation of that kind is already posted on the Sock.
	ErrBusy = errors.New("vio: an operation of this kind is already posted")
	// ErrWoken: Wait returned for a Wakeup, not an event.
	ErrWoken = errors.New("vio: woken up")
	// ErrTimeout: Wait's timeout passed with no event. It matches
	// os.ErrDeadlineExceeded.
	ErrTimeout = fmt.Errorf("vio: no event: %w", os.ErrDeadlineExceeded)
	// ErrInvalid: the arguments of a post make no sense (a minimum above
	// the buffer's size, say).
	ErrInvalid = errors.New("vio: invalid argument")
	// ErrNotConnected: a read or write was posted on a Sock whose connect
	// has not completed.
	ErrNotConnected = errors.New("vio: the connect has not completed")
)

// An OpError is the error of a posted operation.
type OpError struct {
	Op  Op
	Err error
}

func (e *OpError) Error() string { return "vio: " + e.Op.String() + ": " + e.Err.Error() }

func (e *OpError) Unwrap() error { return e.Err }
