package main

import (
	"regexp"
	"strings"
	"testing"
)

// TestUsageLineAgreesWithFlags checks each command's --help: a flag its
// usage line names is written as in its flag list (launch's -n once was
// --n there), and a usage line that lists flags without "[flags]" lists
// every one of the command's own (bench's once left out --pings and
// --plot).
func TestUsageLineAgreesWithFlags(t *testing.T) {
	flagLine := regexp.MustCompile(`(?m)^  (--?[a-z0-9-]+)`)
	usageFlag := regexp.MustCompile(`(?:^|[\s\[|])(--?[a-z][a-z0-9-]*)`)
	common := map[string]bool{"--log-level": true, "--log-format": true, "-h": true}
	for _, c := range program.Commands {
		t.Run(c.Name, func(t *testing.T) {
			code, out, _ := runSync(c.Name, "--help")
			if code != 0 {
				t.Fatalf("%s --help: exit %d", c.Name, code)
			}
			usage, _, _ := strings.Cut(out, "\n")
			usage, _, _ = strings.Cut(usage, " -- ") // what follows -- is the program's
			listed := map[string]bool{}
			for _, m := range flagLine.FindAllStringSubmatch(out[strings.Index(out, "\nFlags:"):], -1) {
				listed[m[1]] = true
			}
			for _, m := range usageFlag.FindAllStringSubmatch(usage, -1) {
				if !listed[m[1]] {
					t.Errorf("the usage line writes %s, which the flag list does not:\n%s", m[1], usage)
				}
			}
			if strings.Contains(usage, "[flags]") {
				return
			}
			for f := range listed {
				if !common[f] && !strings.Contains(usage, f+" ") && !strings.Contains(usage, f+"]") {
					t.Errorf("the usage line lists flags but not %s:\n%s", f, usage)
				}
			}
		})
	}
}

// TestHelpSaysWhatWorks checks help texts that once sent the user to a
// command that fails or told them what does not happen: the node key's
// command (vlink key node NAME fails), what a dial to a node does without
// --reverse-listen (splices, then relays), and which stack carries a
// key to serve --quic or --shm (quic or shm alone sends no hello).
func TestHelpSaysWhatWorks(t *testing.T) {
	nodeKey := "made with vlink key --node NAME --key-file NETWORK_KEY"
	reverse := "a dial to a node tries the spliced path, both nodes connecting at once, then has the relay carry the bytes"
	for _, tc := range []struct {
		cmd  string
		want []string
	}{
		{"serve", []string{nodeKey, "vlink tunnel --stack zstd+quic;", "vlink tunnel --stack lz4+shm;", "--stack quic alone sends no hello", "--stack shm alone sends no hello"}},
		{"tunnel", []string{nodeKey, reverse}},
		{"connect", []string{nodeKey}},
		{"socks", []string{nodeKey, reverse}},
		{"exec", []string{nodeKey, reverse}},
		{"route", []string{nodeKey, reverse, "--key-file FILE"}},
	} {
		code, out, _ := runSync(tc.cmd, "--help")
		out = strings.Join(strings.Fields(out), " ") // unwrapped
		for _, w := range tc.want {
			if code != 0 || !strings.Contains(out, w) {
				t.Errorf("vlink %s --help (exit %d) does not say %q", tc.cmd, code, w)
			}
		}
	}
	_, man, _ := runSync("man")
	man = strings.ReplaceAll(man, `\-`, "-")
	for _, wrong := range []string{"vlink key node", "default: off, the relay carries them", "tunnel --stack quic,", "tunnel --stack shm,"} {
		if strings.Contains(strings.Join(strings.Fields(man), " "), wrong) {
			t.Errorf("the man page still says %q", wrong)
		}
	}
}
