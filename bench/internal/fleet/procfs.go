package fleet

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// procStat returns the fields of /proc/pid/stat after the command's name
// (the first is the state, field 3).
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	return strings.Fields(s[i+1:]), nil
}

func procParent(pid int) (int, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return strconv.Atoi(f[1])
}

// ProcCPU is the CPU seconds (utime + stime, and with children cutime +
// cstime) of process pid, at 100 ticks a second (Linux's USER_HZ).
func ProcCPU(pid int, children bool) (float64, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	last := 13 // fields 14 and 15 of stat: utime, stime (indexes 11, 12 here)
	if children {
		last = 15 // and cutime, cstime
	}
	var ticks int64
	for _, v := range f[11:last] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return float64(ticks) / 100, nil
}

// Children are the pids of the running children of pid.
func Children(pid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := procParent(child); err == nil && ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

// TreeCPU is the CPU seconds of process pid, the children it reaped and
// its running children (PostgreSQL: the postmaster and its backends). A
// process it cannot read counts 0.
func TreeCPU(pid int) float64 {
	t, _ := ProcCPU(pid, true)
	for _, c := range Children(pid) {
		ct, _ := ProcCPU(c, false)
		t += ct
	}
	return t
}

// RSS is process pid's resident set size in bytes (VmRSS of
// /proc/pid/status).
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest) // "123456 kB"
			if len(f) < 1 {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// TreeRSS is the RSS of pid and its running children, in bytes (their
// shared pages counted in each).
func TreeRSS(pid int) int64 {
	t, _ := RSS(pid)
	for _, c := range Children(pid) {
		r, _ := RSS(c)
		t += r
	}
	return t
}
