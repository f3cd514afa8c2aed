package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Iperf3 runs iperf3 between two hosts and returns what it measured. The
// server is started in cfg.Server and gone when Iperf3 returns. ctx
// bounds the whole run.
func (l *Lab) Iperf3(ctx context.Context, cfg Iperf3) (Iperf3Result, error) {
	if err := needPrograms("iperf3"); err != nil {
		return Iperf3Result{}, err
	}
	port := cfg.Port
	if port == 0 {
		port = 5201
	}
	streams := max(cfg.Streams, 1)
	dur := cfg.Time
	if dur == 0 {
		dur = 10 * time.Second
	}
	addr := cfg.Addr
	if addr == "" {
		a := l.Addr(cfg.Server)
		if !a.IsValid() {
			return Iperf3Result{}, fmt.Errorf("lab %s: iperf3: server %q has no address", l.id, cfg.Server)
		}
		addr = a.String()
	}
	if host, p, err := net.SplitHostPort(addr); err == nil {
		addr = host
		port, _ = strconv.Atoi(p)
	}
	ctx, cancel := context.WithTimeout(ctx, dur+60*time.Second)
	defer cancel()

	var srvOut bytes.Buffer
	srv := l.CommandContext(ctx, cfg.Server, "iperf3", "-s", "-1", "-p", strconv.Itoa(port))
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	srv.WaitDelay = 5 * time.Second
	if err := srv.Start(); err != nil {
		return Iperf3Result{}, fmt.Errorf("iperf3 server: %w", err)
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Wait() }()
	stopServer := func() {
		srv.Process.Kill()
		<-srvDone
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	err := l.WaitListening(wctx, cfg.Server, port)
	wcancel()
	if err != nil {
		stopServer()
		return Iperf3Result{}, fmt.Errorf("iperf3 server: %w; output: %s", err, srvOut.Bytes())
	}

	args := []string{"-c", addr, "-p", strconv.Itoa(port), "--json",
		"-t", strconv.FormatFloat(dur.Seconds(), 'f', -1, 64), "-P", strconv.Itoa(streams)}
	if cfg.Reverse {
		args = append(args, "-R")
	}
	args = append(args, cfg.Args...)
	var out, errOut bytes.Buffer
	cli := l.CommandContext(ctx, cfg.Client, "iperf3", args...)
	cli.Stdout, cli.Stderr = &out, &errOut
	cli.WaitDelay = 5 * time.Second
	before, statsBefore := selfCPU(), l.Stats()
	cerr := cli.Run()
	labCPU := selfCPU() - before
	late := lateDelta(statsBefore, l.Stats())

	var rep iperfReport
	jerr := json.Unmarshal(out.Bytes(), &rep)
	if cerr != nil || jerr != nil || rep.Error != "" {
		stopServer()
		msg := rep.Error
		if msg == "" {
			msg = errOut.String()
		}
		return Iperf3Result{}, fmt.Errorf("iperf3 %v in %s: %v: %s", args, cfg.Client, cerr, msg)
	}
	// The one-off server exits by itself once the client is done.
	select {
	case err = <-srvDone:
	case <-time.After(10 * time.Second):
		stopServer()
		err = fmt.Errorf("did not exit after the test")
	}
	if err != nil {
		return Iperf3Result{}, fmt.Errorf("iperf3 server in %s: %v; output: %s", cfg.Server, err, srvOut.Bytes())
	}
	r := Iperf3Result{
		Bytes:         rep.End.SumReceived.Bytes,
		Seconds:       rep.End.SumReceived.Seconds,
		BitsPerSecond: rep.End.SumReceived.BitsPerSecond,
		Retransmits:   rep.End.SumSent.Retransmits,
		ClientCPU:     procCPU(cli.ProcessState.SysUsage()),
		ServerCPU:     procCPU(srv.ProcessState.SysUsage()),
		LabCPU:        labCPU,
		LateP50:       late.LateQuantile(0.5),
		LateP99:       late.LateQuantile(0.99),
		Report:        out.Bytes(),
	}
	return r, nil
}

func procCPU(u any) time.Duration {
	ru, ok := u.(*syscall.Rusage)
	if !ok {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// selfCPU is this process's user and system CPU time so far.
func selfCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// lateDelta returns the lateness histogram of every delay line between
// two snapshots, both directions summed.
func lateDelta(before, after []LinkStats) DirStats {
	var d DirStats
	for i := range after {
		for _, p := range [][2]DirStats{{after[i].AtoB, before[i].AtoB}, {after[i].BtoA, before[i].BtoA}} {
			for k := range d.LateHist {
				d.LateHist[k] += p[0].LateHist[k] - p[1].LateHist[k]
			}
		}
	}
	return d
}
