package lab

import (
	"time"
)

// Iperf3 describes one iperf3 run between two hosts of a lab: a one-off
// server (iperf3 -s -1) in Server, a client in Client.
type Iperf3 struct {
	Client, Server string
	// Addr is where the client connects; empty: Server's address. Set it
	// to measure through something else (a vlink tunnel in the client,
	// say), with the server still started in Server.
	Addr string
	// Port of the server; 0: 5201.
	Port int
	// Streams is iperf3's -P; 0: 1.
	Streams int
	// Time is iperf3's -t; 0: 10s.
	Time time.Duration
	// Reverse makes the server send (-R).
	Reverse bool
	// Args are more client arguments (-C cubic, -w 8M, -Z, ...).
	Args []string
}

// Iperf3Result is what an iperf3 run measured.
type Iperf3Result struct {
	Bytes         int64   // received
	Seconds       float64 // receiver's duration
	BitsPerSecond float64 // received
	Retransmits   int64   // sender's TCP retransmissions
	// ClientCPU and ServerCPU are the user and system CPU time of the
	// two iperf3 processes (from wait4's rusage).
	ClientCPU, ServerCPU time.Duration
	// LabCPU is the CPU time this process used meanwhile: the delay
	// lines, and the kernel's receive path that their writes run.
	LabCPU time.Duration
	// LateP50 and LateP99 bound the median and 99th percentile of the
	// delay lines' own added delay during the run (DirStats.LateQuantile,
	// over every delay line of the lab, both directions); zero without a
	// delay line.
	LateP50, LateP99 time.Duration
	// Report is the client's --json report.
	Report []byte
}

// CPUPerGB is the iperf3 processes' CPU seconds (both ends) per GB
// (10^9 bytes) received.
func (r Iperf3Result) CPUPerGB() float64 {
	if r.Bytes == 0 {
		return 0
	}
	return (r.ClientCPU + r.ServerCPU).Seconds() / (float64(r.Bytes) / 1e9)
}

// LabCPUPerGB is LabCPU per GB received.
func (r Iperf3Result) LabCPUPerGB() float64 {
	if r.Bytes == 0 {
		return 0
	}
	return r.LabCPU.Seconds() / (float64(r.Bytes) / 1e9)
}

// Mbps is the received rate in Mbit/s.
func (r Iperf3Result) Mbps() float64 { return r.BitsPerSecond / 1e6 }

// iperfReport is the part of iperf3's --json report read here.
type iperfReport struct {
	Error string `json:"error"`
	End   struct {
		SumSent struct {
			Bytes       int64 `json:"bytes"`
			Retransmits int64 `json:"retransmits"`
		} `json:"sum_sent"`
		SumReceived struct {
			Bytes         int64   `json:"bytes"`
			Seconds       float64 `json:"seconds"`
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
	} `json:"end"`
}

// A Measurement is one labelled run of a series.
type Measurement struct {
	Label   string // the path measured: "veth", "delay line 0 ms", ...
	Streams int
	Limit   Bitrate // the path's rate limit; 0: none
	Iperf3Result
}
