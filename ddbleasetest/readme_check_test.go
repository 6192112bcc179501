package ddbleasetest_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDocsShowUserTest fails when the test example of docs/testing.md and
// user_test.go differ: the go block under "## Tests of your own" must be
// the text between user_test.go's markers.
func TestDocsShowUserTest(t *testing.T) {
	src, err := os.ReadFile("user_test.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)// readme:begin[^\n]*\n(.*)\n// readme:end`).FindSubmatch(src)
	if m == nil {
		t.Fatal("user_test.go has no readme:begin/end markers")
	}
	doc, err := os.ReadFile("../docs/testing.md")
	if err != nil {
		t.Fatal(err)
	}
	r := regexp.MustCompile("(?s)\n## Tests of your own\n.*?```go\n(.*?)```\n").FindSubmatch(doc)
	if r == nil {
		t.Fatal(`docs/testing.md has no go block under "## Tests of your own"`)
	}
	if want, got := strings.TrimSpace(string(m[1])), strings.TrimSpace(string(r[1])); want != got {
		t.Errorf("docs/testing.md's test example differs from ddbleasetest/user_test.go; copy the text between the markers into it\ndocs/testing.md:\n%s\nuser_test.go:\n%s", got, want)
	}
}
