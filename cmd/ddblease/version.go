package main

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"
)

// versionView is what version prints: the build information the Go
// toolchain recorded in the binary.
type versionView struct {
	Module     string `json:"module"`
	Version    string `json:"version"` // "(devel)" for a build from a checkout
	Commit     string `json:"commit"`  // empty when the build recorded none (see buildVersion)
	CommitTime string `json:"commitTime,omitempty"`
	Modified   bool   `json:"modified"` // built from a checkout with changes not committed
	Library    string `json:"library"`  // the version of github.com/ddblease/ddblease built in
	Go         string `json:"go"`
}

func (e *env) version(_ context.Context, args []string) error {
	if len(args) != 0 {
		return usagef("version: takes no arguments")
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Errorf("version: the binary has no build information")
	}
	v := buildVersion(bi)
	if e.g.json {
		return writeJSON(e.out, v)
	}
	commit := "commit unknown"
	if v.Commit != "" {
		commit = "commit " + v.Commit
		if v.CommitTime != "" {
			commit += " of " + v.CommitTime
		}
		if v.Modified {
			commit += ", with changes not committed"
		}
	}
	_, err := fmt.Fprintf(e.out, "%s %s, %s; library %s; %s\n", v.Module, v.Version, commit, dash(v.Library), v.Go)
	return err
}

// buildVersion reads the version from the build information. The commit
// is the one the Go toolchain stamped (a build in a git checkout, outside
// workspace mode), or else the revision a pseudo-version names
// (go install …@<commit or branch>): its first 12 hex digits.
func buildVersion(bi *debug.BuildInfo) versionView {
	v := versionView{Module: bi.Main.Path, Version: bi.Main.Version, Go: bi.GoVersion}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.CommitTime = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	if v.Commit == "" {
		v.Commit = pseudoRevision(v.Version)
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/ddblease/ddblease" {
			v.Library = d.Version
			if d.Replace != nil {
				v.Library += " => " + d.Replace.Path
			}
		}
	}
	return v
}

// pseudoRevision returns the revision of a pseudo-version
// (v0.0.0-20261203081500-abcdef123456, v1.2.4-0.20261203081500-abcdef123456),
// or "".
func pseudoRevision(version string) string {
	version, _, _ = strings.Cut(version, "+") // +incompatible, +dirty
	i := strings.LastIndexByte(version, '-')
	if i < 0 {
		return ""
	}
	rev, rest := version[i+1:], version[:i]
	stamp := rest[max(strings.LastIndexAny(rest, "-."), 0)+1:]
	if len(rev) != 12 || strings.Trim(rev, "0123456789abcdef") != "" ||
		len(stamp) != 14 || strings.Trim(stamp, "0123456789") != "" {
		return ""
	}
	return rev
}
