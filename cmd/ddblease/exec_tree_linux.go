package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A process that leaves COMMAND's process group (setsid, a detached
// spawn) is out of reach of a signal to the group. On Linux the
// supervisor keeps every descendant of COMMAND within reach: it is a child
// subreaper (PR_SET_CHILD_SUBREAPER), so that a descendant orphaned by
// its parent's exit is re-parented to it, not to init, and the tree of
// processes below it, read from /proc, holds all of them. Each process is
// signalled through a pidfd taken after checking its start time, so that a
// pid reused meanwhile by another process is never signalled.

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER of prctl(2).
const prSetChildSubreaper = 36

func becomeSubreaper() error {
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// procInfo is one process, as /proc/<pid>/stat shows it.
type procInfo struct {
	pid, ppid, pgrp int
	zombie          bool
	start           uint64 // start time since boot, in clock ticks: with pid, names one process
}

func readStat(pid int) (procInfo, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold anything
	if i < 0 {
		return procInfo{}, false
	}
	f := strings.Fields(s[i+1:]) // state ppid pgrp session ... starttime is the 20th
	if len(f) < 20 {
		return procInfo{}, false
	}
	p := procInfo{pid: pid, zombie: f[0] == "Z" || f[0] == "X"}
	var e1, e2, e3 error
	p.ppid, e1 = strconv.Atoi(f[1])
	p.pgrp, e2 = strconv.Atoi(f[2])
	p.start, e3 = strconv.ParseUint(f[19], 10, 64)
	return p, e1 == nil && e2 == nil && e3 == nil
}

// descendants returns the processes below root, parents before their
// children.
func descendants(root int) []procInfo {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]procInfo{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readStat(pid); ok {
			children[p.ppid] = append(children[p.ppid], p)
		}
	}
	var out []procInfo
	seen := map[int]bool{root: true}
	for queue := []int{root}; len(queue) > 0; queue = queue[1:] {
		for _, c := range children[queue[0]] {
			if !seen[c.pid] { // a pid reused while /proc was read could close a loop
				seen[c.pid] = true
				out = append(out, c)
				queue = append(queue, c.pid)
			}
		}
	}
	return out
}

// signalExact sends sig to p, unless p's pid now names another process.
func signalExact(p procInfo, sig syscall.Signal) {
	proc, err := os.FindProcess(p.pid) // holds a pidfd: the process found now
	if err != nil {
		return
	}
	defer func() { _ = proc.Release() }()
	if now, ok := readStat(p.pid); !ok || now.start != p.start {
		return // gone, or the pid was reused before the pidfd was taken
	}
	_ = proc.Signal(sig)
}

// signalOutside sends sig to each live process below root outside root's
// process group: those a signal to the group misses.
func signalOutside(root int, sig syscall.Signal) {
	for _, p := range descendants(root) {
		if !p.zombie && p.pgrp != root {
			signalExact(p, sig)
		}
	}
}

// killTree kills every process below root with SIGKILL, and looks again
// until none is left alive, or until bound has passed (a process in an
// uninterruptible sleep dies only when it wakes). A process forked
// meanwhile is the child of one seen alive, or, orphaned, of root when
// root is a subreaper: the next look finds it. With reap set (root is
// this process), it reaps the children it adopted, all but keep (COMMAND,
// which os/exec waits for). It reports whether none was left alive.
func killTree(root int, reap bool, keep int, bound time.Duration) bool {
	end := time.Now().Add(bound)
	for {
		live := 0
		for _, p := range descendants(root) {
			switch {
			case !p.zombie:
				live++
				signalExact(p, syscall.SIGKILL)
			case reap && p.ppid == root && p.pid != keep:
				var ws syscall.WaitStatus
				_, _ = syscall.Wait4(p.pid, &ws, syscall.WNOHANG, nil)
			}
		}
		if live == 0 || time.Now().After(end) {
			return live == 0
		}
		time.Sleep(time.Millisecond)
	}
}

// reapAdopted reaps the exited children of this process that it adopted
// as a subreaper, all but keep.
func reapAdopted(keep int) {
	self := os.Getpid()
	for _, p := range descendants(self) {
		if p.zombie && p.ppid == self && p.pid != keep {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(p.pid, &ws, syscall.WNOHANG, nil)
		}
	}
}
