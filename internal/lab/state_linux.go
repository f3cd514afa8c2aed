package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// List returns the labs on this machine, sorted by ID: from their state
// files, and from namespaces named after Prefix that have none
// (Orphan). Alive says whether the owner still runs.
func List() ([]Info, error) {
	byID := map[string]*Info{}
	ents, err := os.ReadDir(stateDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(stateDir, e.Name()))
		if err != nil {
			continue
		}
		var inf Info
		if json.Unmarshal(data, &inf) != nil || inf.ID != name {
			continue
		}
		inf.Alive = alive(inf.PID, inf.Start)
		byID[inf.ID] = &inf
	}
	nss, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range nss {
		id, pid, host, ok := parseNetnsName(e.Name())
		if !ok {
			continue
		}
		inf := byID[id]
		if inf == nil {
			inf = &Info{ID: id, PID: pid, Orphan: true, Alive: alive(pid, 0)}
			byID[id] = inf
		}
		if inf.Orphan {
			inf.Hosts = append(inf.Hosts, HostInfo{Name: host, Netns: e.Name()})
		}
	}
	out := make([]Info, 0, len(byID))
	for _, inf := range byID {
		out = append(out, *inf)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PID != out[j].PID {
			return out[i].PID < out[j].PID
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Clean removes every lab whose owner is dead, and returns them. Up
// calls it first, so a crashed test's lab lasts only until the next one.
func Clean() ([]Info, error) {
	infos, err := List()
	if err != nil {
		return nil, err
	}
	var removed []Info
	var errs []error
	for _, inf := range infos {
		if inf.Alive {
			continue
		}
		if err := Remove(inf); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, inf)
	}
	return removed, errors.Join(errs...)
}

// Remove tears down a lab by its description, whoever owns it: it kills
// the processes in its namespaces, deletes them and its state file. For a
// lab of this process, use Lab.Close; for one of a live process, that
// process loses its lab (its delay lines stop when their devices go).
func Remove(inf Info) error {
	var errs []error
	names := map[string]bool{}
	for _, h := range inf.Hosts {
		names[h.Netns] = true
	}
	// Namespaces of the lab that its file does not name (a host added
	// while the owner died mid-setup cannot be, but a file can be stale).
	if nss, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range nss {
			if id, _, _, ok := parseNetnsName(e.Name()); ok && id == inf.ID {
				names[e.Name()] = true
			}
		}
	}
	for n := range names {
		if _, _, _, ok := parseNetnsName(n); !ok {
			continue // never touch a namespace that is not the lab's
		}
		if _, err := os.Stat(filepath.Join(netnsDir, n)); err != nil {
			continue
		}
		if err := deleteNetns(n); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(filepath.Join(stateDir, inf.ID+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("lab %s: %w", inf.ID, errors.Join(errs...))
	}
	return nil
}
