//go:build !unix

package main

import (
	"errors"
	"io"
	"syscall"
)

// proc is a running COMMAND; exec needs process groups and signals, which
// this system does not have.
type proc struct {
	pid  int
	done chan struct{}
	end  procEnd
}

type procEnd struct {
	code int
	sig  syscall.Signal
	err  error
}

func startProc(argv, env []string, stdout, stderr io.Writer, keep int) (*proc, error) {
	return nil, errors.New("exec is not supported on this system")
}

func (p *proc) tail() string { return "" }

func (p *proc) signal(sig syscall.Signal) {}

func (p *proc) kill() {}
