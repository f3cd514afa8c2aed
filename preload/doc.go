// Package preload runs unmodified programs on VLink stacks: the agent side
// of "vlink exec".
//
// A small C library (shim/vlink_preload.c, loaded with LD_PRELOAD, no Go
// runtime inside) intercepts a program's connect, name resolution,
// getpeername and descriptor life cycle, and asks an [Agent] over a unix
// socket what to do per destination. The agent decides with the user's
// rules (a vlink.Config, as vlink.Dial reads it): a direct connect the shim
// makes itself; a connection through a stack, passed back as a descriptor
// (SCM_RIGHTS) when it is plain TCP, or relayed over loopback when the stack
// transforms the bytes; or a refusal. Names that only the far side can
// resolve get addresses from private ranges ([FakeIPv4], [FakeIPv6]) that
// the agent maps back to the name.
//
// With [AgentConfig.Serve], the program's listeners on the ports it names
// take VLink clients besides their own: the agent listens in their place
// and hands each client over (vlink exec --serve).
//
// [Inspect] tells the programs the shim cannot reach (static, Go, setuid).
// The agent and the shim are Linux-only; docs/ARCHITECTURE.md ("Preload")
// gives the design and its reasons.
package preload
