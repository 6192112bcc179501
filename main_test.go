package ddblease_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/ddblease/ddblease/internal/leakcheck"
)

var srv *ddbtest.Server

func TestMain(m *testing.M) {
	srv = ddbtest.Start()
	code := m.Run()
	srv.Close()
	if code == 0 {
		if err := leakcheck.Find(5*time.Second, srv.Close); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
