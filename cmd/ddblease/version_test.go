package main

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The commit comes from the toolchain's VCS stamp, or else from a
// pseudo-version; a release's tag has none.
func TestBuildVersion(t *testing.T) {
	t.Parallel()
	const mod = "github.com/ddblease/ddblease/cmd/ddblease"
	lib := &debug.Module{Path: "github.com/ddblease/ddblease", Version: "v0.1.0", Replace: &debug.Module{Path: "../.."}}
	for _, c := range []struct {
		name     string
		version  string
		settings []debug.BuildSetting
		commit   string
	}{
		{"a checkout", "(devel)", []debug.BuildSetting{{Key: "vcs.revision", Value: "052d0b4195ec4abb17993774aa546202ab6967b6"}}, "052d0b4195ec4abb17993774aa546202ab6967b6"},
		{"a checkout through go.work", "(devel)", nil, ""},
		{"a release", "v1.2.3", nil, ""},
		{"a commit", "v0.0.0-20261203081500-052d0b4195ec", nil, "052d0b4195ec"},
		{"a commit after a tag", "v1.2.4-0.20261203081500-052d0b4195ec", nil, "052d0b4195ec"},
		{"a pre-release after a tag", "v1.2.4-rc.1.0.20261203081500-052d0b4195ec+dirty", nil, "052d0b4195ec"},
		{"a pre-release", "v1.2.4-rc.1", nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := buildVersion(&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: mod, Version: c.version},
				Deps: []*debug.Module{lib}, Settings: c.settings})
			assert.Equal(t, c.version, v.Version)
			assert.Equal(t, c.commit, v.Commit)
			assert.Equal(t, "v0.1.0 => ../..", v.Library)
		})
	}
}
