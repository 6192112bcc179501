//go:build !linux

package main

import (
	"syscall"
	"time"
)

func childAttr() *syscall.SysProcAttr { return nil }

func cpuTime() time.Duration { return 0 }

func procCPU(int) time.Duration { return 0 }

func rss() (cur, peak int64) { return 0, 0 }
