package ddblease_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/ddblease/ddblease/internal/ddbtest"
	"go.uber.org/goleak"
)

var srv *ddbtest.Server

func TestMain(m *testing.M) {
	srv = ddbtest.Start()
	code := m.Run()
	srv.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
