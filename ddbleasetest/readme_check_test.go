package ddbleasetest_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEShowsUserTest fails when the README's test example and
// user_test.go differ: the README's go block under "### Tests of your own"
// must be the text between user_test.go's markers.
func TestREADMEShowsUserTest(t *testing.T) {
	src, err := os.ReadFile("user_test.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)// readme:begin[^\n]*\n(.*)\n// readme:end`).FindSubmatch(src)
	if m == nil {
		t.Fatal("user_test.go has no readme:begin/end markers")
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	r := regexp.MustCompile("(?s)### Tests of your own\n.*?```go\n(.*?)```\n").FindSubmatch(readme)
	if r == nil {
		t.Fatal(`README.md has no go block under "### Tests of your own"`)
	}
	if want, got := strings.TrimSpace(string(m[1])), strings.TrimSpace(string(r[1])); want != got {
		t.Errorf("README.md's test example differs from ddbleasetest/user_test.go; copy the text between the markers into the README\nREADME:\n%s\nuser_test.go:\n%s", got, want)
	}
}
