package ddbleaserobfig_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocSnippets checks that the code shown in docs/schedulers.md for
// this module is the code between "// snippet: NAME" and "// snippet: end"
// in the file the doc names, one tab of indentation less.
func TestDocSnippets(t *testing.T) { checkSnippets(t, "ddbleaserobfig/") }

var snippetRE = regexp.MustCompile("(?s)<!-- snippet: (\\S+) (\\S+) -->\n```go\n(.*?)\n```")

func checkSnippets(t *testing.T, prefix string) {
	doc, err := os.ReadFile("../docs/schedulers.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range snippetRE.FindAllStringSubmatch(string(doc), -1) {
		path, name, shown := m[1], m[2], m[3]
		if !strings.HasPrefix(path, prefix) {
			continue
		}
		n++
		src, err := os.ReadFile(filepath.Join("..", path))
		if err != nil {
			t.Errorf("snippet %s %s: %v", path, name, err)
			continue
		}
		_, rest, ok := strings.Cut(string(src), "// snippet: "+name+"\n")
		body, _, ok2 := strings.Cut(rest, "// snippet: end")
		if !ok || !ok2 {
			t.Errorf("%s has no snippet %q", path, name)
			continue
		}
		var lines []string
		for _, l := range strings.Split(strings.TrimRight(body, "\t\n"), "\n") {
			lines = append(lines, strings.TrimPrefix(l, "\t"))
		}
		if got := strings.Join(lines, "\n"); got != shown {
			t.Errorf("docs/schedulers.md shows snippet %s %s differently from the file:\n--- file\n%s\n--- doc\n%s", path, name, got, shown)
		}
	}
	if n == 0 {
		t.Errorf("docs/schedulers.md shows no snippet from %s", prefix)
	}
}
