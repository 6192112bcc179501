package ddbleasetest_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ddblease/ddblease/internal/leakcheck"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := leakcheck.Find(5 * time.Second); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
