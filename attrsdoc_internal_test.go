package ddblease

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// docAttribute is a row of docs/deploy.md's list of the items' attributes.
type docAttribute struct {
	typ  string
	on   []string // kinds of item
	line int
}

// docAttributes reads the table under "### The attributes of the items" in
// docs/deploy.md: | `name` | TYPE | kind, kind |.
func docAttributes(t *testing.T) map[string]docAttribute {
	t.Helper()
	b, err := os.ReadFile("docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	start := slices.Index(lines, "### The attributes of the items")
	if start < 0 {
		t.Fatal(`docs/deploy.md has no section "### The attributes of the items"`)
	}
	row := regexp.MustCompile("^\\| `([^`]+)` \\| ([A-Z]+) \\| ([a-z ,]+) \\|$")
	got := map[string]docAttribute{}
	inTable := false
	for i := start + 1; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(l, "#") {
			break
		}
		if !strings.HasPrefix(l, "|") {
			if inTable {
				break
			}
			continue
		}
		inTable = true
		if l == "| attribute | type | on |" || l == "|---|---|---|" {
			continue
		}
		m := row.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("docs/deploy.md:%d: %q is not a row | `name` | TYPE | kinds |", i+1, l)
			continue
		}
		if d, dup := got[m[1]]; dup {
			t.Errorf("docs/deploy.md:%d: %q is listed twice (also line %d)", i+1, m[1], d.line)
		}
		var on []string
		for _, k := range strings.Split(m[3], ",") {
			on = append(on, strings.TrimSpace(k))
		}
		got[m[1]] = docAttribute{typ: m[2], on: on, line: i + 1}
	}
	if len(got) == 0 {
		t.Fatal("docs/deploy.md lists no attribute under \"### The attributes of the items\"")
	}
	return got
}

// sourceAttribute is a constant of attrs.go naming an attribute.
type sourceAttribute struct {
	constant string
	typ      string // from the constant's comment ("// N: ..."), or ""
}

// sourceAttributes reads attrs.go's string constants whose value is in
// itemAttributes, with the type their comments give, and the constants
// named attr* or member* that itemAttributes leaves out.
func sourceAttributes(t *testing.T) (attrs map[string]sourceAttribute, unlisted []string) {
	t.Helper()
	fs := token.NewFileSet()
	f, err := parser.ParseFile(fs, "attrs.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	typeRe := regexp.MustCompile(`^(S|N|BOOL|SS|M)\b`)
	attrs = map[string]sourceAttribute{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			for i, n := range v.Names {
				if i >= len(v.Values) {
					continue
				}
				lit, ok := v.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				val, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				if !itemAttributes[val] {
					if (strings.HasPrefix(n.Name, "attr") || strings.HasPrefix(n.Name, "member")) && val != noSession {
						unlisted = append(unlisted, n.Name)
					}
					continue
				}
				a := sourceAttribute{constant: n.Name}
				if v.Comment != nil {
					a.typ = typeRe.FindString(strings.TrimSpace(v.Comment.Text()))
				}
				attrs[val] = a
			}
		}
	}
	return attrs, unlisted
}

// recordTypes returns the DynamoDB type of each attribute of a record
// struct, from its fields' Go types.
func recordTypes(t *testing.T, record any) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(rt reflect.Type)
	walk = func(rt reflect.Type) {
		for i := range rt.NumField() {
			f := rt.Field(i)
			if f.Anonymous {
				walk(f.Type)
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("dynamodbav"), ",")
			switch {
			case f.Type == reflect.TypeOf(sAttr{}):
				out[name] = "S"
			case f.Type == reflect.TypeOf(nAttr{}):
				out[name] = "N"
			case f.Type == reflect.TypeOf(boolAttr{}):
				out[name] = "BOOL"
			case f.Type == reflect.TypeOf([]string{}) && opts == "stringset":
				out[name] = "SS"
			default:
				t.Fatalf("%T.%s: no DynamoDB type known for %v", record, f.Name, f.Type)
			}
		}
	}
	walk(reflect.TypeOf(record))
	return out
}

// docs/deploy.md lists every attribute the library writes on its items,
// and only those (itemAttributes and attrs.go's constants), each with the
// type attrs.go's comments and the records' fields give it, and, for the
// lease and run items, on exactly the attributes their records decode: a
// user keying an index by one of these names reads there which type the
// library writes.
func TestDeployDocListsEveryAttribute(t *testing.T) {
	doc := docAttributes(t)
	src, unlisted := sourceAttributes(t)
	for _, c := range unlisted {
		t.Errorf("attrs.go: constant %s names an attribute that itemAttributes leaves out", c)
	}
	for v := range itemAttributes {
		if _, ok := src[v]; !ok {
			t.Errorf("itemAttributes lists %q, which no string constant of attrs.go names", v)
		}
	}
	lease := recordTypes(t, leaseItem{})
	run := recordTypes(t, runItem{})
	want := map[string]string{} // attribute -> type, from the source
	for v, a := range src {
		types := map[string]string{}
		if a.typ != "" {
			types["its comment in attrs.go"] = a.typ
		}
		if ty, ok := lease[v]; ok {
			types["leaseItem's field"] = ty
		}
		if ty, ok := run[v]; ok {
			types["runItem's field"] = ty
		}
		if len(types) == 0 {
			t.Errorf("attrs.go: %s (%q) gives no type: add one to its comment (// S, // N, // BOOL, // SS, // M)", a.constant, v)
			continue
		}
		for from, ty := range types {
			if want[v] == "" {
				want[v] = ty
			} else if ty != want[v] {
				t.Errorf("%q: %s says %s, another source %s", v, from, ty, want[v])
			}
		}
	}
	for _, v := range slices.Sorted(maps.Keys(want)) {
		d, ok := doc[v]
		switch {
		case !ok:
			t.Errorf("docs/deploy.md does not list %q (%s, %s in attrs.go)", v, want[v], src[v].constant)
		case d.typ != want[v]:
			t.Errorf("docs/deploy.md:%d: %q is %s, but the library writes it as %s", d.line, v, d.typ, want[v])
		}
	}
	kinds := map[string]bool{"lease": true, "run": true, "job entry": true, "pool entry": true, "member": true}
	for _, v := range slices.Sorted(maps.Keys(doc)) {
		d := doc[v]
		if _, ok := src[v]; !ok {
			t.Errorf("docs/deploy.md:%d: %q is not an attribute of the library's items (itemAttributes)", d.line, v)
		}
		for _, k := range d.on {
			if !kinds[k] {
				t.Errorf("docs/deploy.md:%d: %q is on %q, not a kind of item (%v)", d.line, v, k, slices.Sorted(maps.Keys(kinds)))
			}
		}
		_, inLease := lease[v]
		inLease = inLease || v == attrTriggers // decoded by hand (pendingTriggers)
		if slices.Contains(d.on, "lease") != inLease {
			t.Errorf("docs/deploy.md:%d: %q on the lease item: %v, but leaseItem decodes it: %v", d.line, v, slices.Contains(d.on, "lease"), inLease)
		}
		if _, inRun := run[v]; slices.Contains(d.on, "run") != inRun {
			t.Errorf("docs/deploy.md:%d: %q on the run item: %v, but runItem decodes it: %v", d.line, v, slices.Contains(d.on, "run"), inRun)
		}
	}
}
