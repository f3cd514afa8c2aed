package vlink_test

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// TestTargetWait: a dialer whose context lets it wait for its target
// longer than every listener would names that wait in its hello, and a
// listener with MaxTargetWait lets Admit take it, bounded, past its own
// handshake timeout, and cancels Admit as soon as the dialer hangs up.
func TestTargetWait(t *testing.T) {
	const handshake, beyond = 300 * time.Millisecond, 100 * time.Millisecond
	vlink.SetWaitBeyond(t, beyond)
	type admitted struct {
		wait     time.Duration // Hello.TargetWait
		deadline time.Duration // Admit's context's, from its start
		ended    time.Duration // when its context ended, if it did
		err      error         // and why
	}
	for _, tc := range []struct {
		name          string
		dialFor       time.Duration // the dialer's context
		maxWait       time.Duration // ListenConfig.MaxTargetWait
		reachedAfter  time.Duration // Admit's target answers then; 0: never
		hangUpAfter   time.Duration // the dialer gives up then; 0: never
		wantWait      [2]time.Duration
		wantDeadline  [2]time.Duration
		wantReached   bool
		wantEnded     [2]time.Duration
		wantCancelled bool
	}{
		{name: "reached past the handshake timeout", dialFor: 3 * time.Second, maxWait: 10 * time.Second, reachedAfter: time.Second,
			wantWait: [2]time.Duration{2 * time.Second, 3 * time.Second}, wantDeadline: [2]time.Duration{2 * time.Second, 3 * time.Second}, wantReached: true},
		{name: "bounded by MaxTargetWait", dialFor: 10 * time.Second, maxWait: time.Second,
			wantWait: [2]time.Duration{9 * time.Second, 10 * time.Second}, wantDeadline: [2]time.Duration{900 * time.Millisecond, time.Second},
			wantEnded: [2]time.Duration{900 * time.Millisecond, 2 * time.Second}},
		{name: "not moved without MaxTargetWait", dialFor: 3 * time.Second,
			wantWait: [2]time.Duration{2 * time.Second, 3 * time.Second}, wantDeadline: [2]time.Duration{0, handshake},
			wantEnded: [2]time.Duration{0, handshake + 500*time.Millisecond}},
		{name: "a wait within the usual is not said", dialFor: beyond / 2, maxWait: 10 * time.Second,
			wantDeadline: [2]time.Duration{0, handshake}, wantEnded: [2]time.Duration{0, handshake + 500*time.Millisecond}},
		{name: "the dialer hangs up", dialFor: 5 * time.Second, maxWait: 10 * time.Second, hangUpAfter: 500 * time.Millisecond,
			wantWait: [2]time.Duration{4 * time.Second, 5 * time.Second}, wantDeadline: [2]time.Duration{4 * time.Second, 5 * time.Second},
			wantEnded: [2]time.Duration{400 * time.Millisecond, 2 * time.Second}, wantCancelled: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan admitted, 1)
			l := listen(t, vlink.ListenConfig{
				HandshakeTimeout: handshake,
				MaxTargetWait:    tc.maxWait,
				Policy:           vlink.Policy{Targets: []selector.Rule{{Action: selector.Direct}}},
				Admit: func(ctx context.Context, h *vlink.Hello) (any, error) {
					start := time.Now()
					a := admitted{wait: h.TargetWait}
					dl, _ := ctx.Deadline()
					a.deadline = dl.Sub(start)
					defer func() { got <- a }()
					var reached <-chan time.Time
					if tc.reachedAfter > 0 {
						reached = time.After(tc.reachedAfter)
					}
					select {
					case <-reached:
						return nil, nil
					case <-ctx.Done():
						a.ended, a.err = time.Since(start), ctx.Err()
						return nil, vlink.TargetRefusal(ctx.Err())
					}
				},
			})
			ctx, cancel := context.WithTimeout(context.Background(), tc.dialFor)
			defer cancel()
			if tc.hangUpAfter > 0 {
				time.AfterFunc(tc.hangUpAfter, cancel)
			}
			d := vlink.Dialer{Stack: vlink.MustParse("test-xor"), Via: l.Addr().String()}
			start := time.Now()
			c, err := d.DialContext(ctx, "tcp", "example.com:80")
			took := time.Since(start)
			if err == nil {
				c.Close()
			}
			if (err == nil) != tc.wantReached {
				t.Errorf("dial: %v, want it to succeed: %v", err, tc.wantReached)
			}
			// Admit's time up before the dialer's: the dialer is told so
			// (a target that timed out), then and there.
			if !tc.wantReached && !tc.wantCancelled && tc.dialFor > tc.wantEnded[1] &&
				(!errors.Is(err, vlink.ErrUnreachable) || !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, syscall.ETIMEDOUT) || took > tc.wantEnded[1]) {
				t.Errorf("dial: %v after %v, want the refusal of a target that timed out within %v", err, took, tc.wantEnded[1])
			}
			var a admitted
			select {
			case a = <-got:
			case <-time.After(15 * time.Second):
				t.Fatal("Admit never returned")
			}
			within := func(what string, v time.Duration, r [2]time.Duration) {
				if v < r[0] || v > r[1] {
					t.Errorf("%s: %v, want within [%v, %v]", what, v, r[0], r[1])
				}
			}
			within("Hello.TargetWait", a.wait, tc.wantWait)
			within("Admit's deadline", a.deadline, tc.wantDeadline)
			if !tc.wantReached {
				within("Admit's context ended after", a.ended, tc.wantEnded)
			}
			if cancelled := errors.Is(a.err, context.Canceled); cancelled != tc.wantCancelled {
				t.Errorf("Admit's context ended with %v, want it canceled: %v", a.err, tc.wantCancelled)
			}
		})
	}
}
