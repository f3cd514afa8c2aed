// Package lab is vlink's WAN lab: it emulates wide-area links between
// network namespaces on one Linux machine, so that layers meant for long,
// lossy paths (parallel streams, compression) are measured on such paths,
// with real kernels' TCP and real programs at both ends.
//
// A Topology names hosts, each a network namespace, and links between
// them. A link with no delay, jitter or loss is a veth pair. A link with
// any of them is a delay line: a TUN device in each host and a forwarder
// in this process between them, which holds each packet for its one-way
// delay. Rate limits are tbf on the receiving side of each direction; a
// host may be a stateful nftables firewall. Every host reaches every
// other through the shortest path of links (hosts in between forward).
// Addresses are 10.77.N.1 and 10.77.N.2 on link N; Lab.Addr gives each
// host's.
//
//	l, err := lab.Up(ctx, lab.Topology{
//		Hosts: []lab.Host{{Name: "client"}, {Name: "server"}},
//		Links: []lab.Link{{A: "client", B: "server",
//			Rate: lab.Gbit, RTT: lab.Duration(50 * time.Millisecond), Loss: 0.001}},
//		Sysctls: lab.TCPSysctls,
//	})
//	defer l.Close()
//	ln, err := l.Listen("server", "tcp", l.Addr("server").String()+":9000") // a Go listener in server
//	cmd := l.Command("client", "iperf3", "-c", l.Addr("server").String())  // a program in client
//
// In tests, New brings a lab up and tears it down with the test, and skips
// (fails, in CI) where labs cannot run: they need Linux and root. Profile
// returns built-in topologies: "wan50" (1 Gbit/s, 50 ms RTT, 0.1% loss),
// "wan50-clean", "wan50-capped" (each flow shaped to 100 Mbit/s),
// "wan100m", "lan", "firewall", "ceiling". The command
// vlink-lab (cmd/vlink-lab) brings them up by hand.
//
// # Running code in a host
//
// Lab.Command runs a program in a host (through "ip netns exec"). Lab.Do
// runs a Go function with its OS thread in a host's namespace: the sockets
// it creates belong to that host for their whole life, whichever goroutine
// uses them; Listen, ListenPacket, DialContext and Dialer are built on it.
// Goroutines the function starts do not inherit the namespace: code that
// dials from several goroutines needs each dial wrapped (Dialer) or must
// run as a process in the host.
//
// # The delay line
//
// Each direction of a delay line is a reader and a writer goroutine. The
// reader stamps each packet with the time it is due and appends it to a
// byte ring (the read itself is the only copy; nothing is allocated per
// packet); the writer sends packets when due, oldest first, so it only
// ever waits for the head of a FIFO: one timer, no sorting. Jitter draws
// each packet's delay uniformly within ±Jitter but never lets a packet
// leave before the one ahead of it: real paths rarely reorder, and
// reordering would measure TCP's reordering recovery instead of the path.
// The ring is bounded (Link.Queue, drop-tail): it holds what is in flight
// on the wire.
//
// The TUN devices use virtio-net headers with TCP segmentation offload,
// so the kernel hands the line TCP super-packets of up to 64 KiB and takes
// them back whole: one read and one write per ~44 segments, which is what
// lets a user-space forwarder carry gigabits. Loss is drawn per segment
// (independently, with probability Loss, seeded by Topology.Seed): a
// super-packet that loses segments is cut around them, each run of kept
// segments rebuilt as Linux's own segmentation would (lengths, IDs,
// sequence numbers, flags, checksums). Loss lives in the delay line rather
// than in iptables' statistic match because that match sees super-packets
// too, and would drop 44 segments at a time; here the line also counts
// what it dropped (Lab.Stats).
//
// The line's own added delay (how late each write is after its due time)
// is counted too, and reported by Iperf3 and the ceiling measurement: the
// line is a process on a shared machine, and figures taken through it are
// only trustworthy while it keeps up. "vlink-lab ceiling" (Ceiling)
// measures how much it carries.
//
// # Rate limits
//
// A Rate shapes each direction with tbf where it is received: the
// receiving device's ingress is redirected to an ifb device whose tbf
// queue (Link.Buffer, one bandwidth-delay product by default) is the
// bottleneck's buffer. A queue on the sender's own device would be seen
// by its TCP as local back-pressure (TCP small queues) and would never
// overflow, unlike a router's on a real path.
//
// A FlowRate under the Rate caps each TCP connection, as a shaper with a
// queue per flow does (some carriers and middleboxes do): the ifb device
// has htb instead of tbf, a class for the link and 256 classes under it,
// each capped at FlowRate with one bandwidth-delay product of queue at
// that rate, chosen by a hash of the port of the link's A side. The
// kernels here have neither fq nor sfq, which would do this per flow
// exactly: connections whose A-side ports are 512 apart share a class
// (Linux gives the connections one process makes to one destination
// consecutive even ports, so 256 of them get one each).
//
// # Teardown and crashes
//
// Namespaces are named "vlab-PID-SEQ-HOST" after the owning process, and a
// state file in /run/vlink-lab describes each lab. Close kills the
// processes left in the lab's namespaces and deletes them; devices go with
// their namespace, and TUN devices with this process's descriptors. If the
// owner dies first, its lab is stale: the next Up, Clean, or "vlink-lab
// down" removes it. Sockets this process made in a lab keep its
// namespaces alive (anonymous) until they are closed.
//
// # Settings
//
// TCPSysctls, which the built-in profiles set in every host, let TCP
// buffers grow to 64 MiB and select CUBIC. Outside the initial namespace,
// Linux only accepts a default congestion control listed in
// net.ipv4.tcp_allowed_congestion_control; when a topology asks for one
// that is not, Up adds it to that list (a global, additive change, which
// Close does not undo). IPv6 is off in the lab's hosts.
package lab
