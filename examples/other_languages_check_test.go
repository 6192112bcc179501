package examples_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// examples/other-languages-check installs nothing on the system: run in
// an active virtual environment without boto3, it says that boto3 is
// missing there and how to install it, exits 1, and runs neither apt-get
// nor sudo (each is replaced on PATH by a script that records the call).
func TestOtherLanguagesCheckInstallsNothing(t *testing.T) {
	for _, tool := range []string{"bash", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	dir := t.TempDir()
	venv := filepath.Join(dir, "venv")
	if out, err := exec.Command("python3", "-m", "venv", "--without-pip", venv).CombinedOutput(); err != nil {
		t.Skipf("python3 cannot make a virtual environment: %v: %s", err, out)
	}
	stubs, called := filepath.Join(dir, "bin"), filepath.Join(dir, "called")
	require.NoError(t, os.Mkdir(stubs, 0o755))
	for _, name := range []string{"apt-get", "sudo", "apt"} {
		script := "#!/bin/sh\necho \"" + name + " $*\" >> " + called + "\nexit 1\n"
		require.NoError(t, os.WriteFile(filepath.Join(stubs, name), []byte(script), 0o755))
	}
	cmd := exec.Command("bash", "other-languages-check")
	cmd.Env = append(os.Environ(), "PATH="+stubs+":"+filepath.Join(venv, "bin")+":"+os.Getenv("PATH"),
		"VIRTUAL_ENV="+venv, "PYTHON=")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 1, ee.ExitCode(), "%s", out)
	assert.Contains(t, string(out), "boto3 is missing for "+filepath.Join(venv, "bin", "python"))
	assert.Contains(t, string(out), "pip install boto3")
	assert.NotContains(t, string(out), "== TypeScript", "nothing ran")
	_, err = os.Stat(called)
	assert.True(t, os.IsNotExist(err), "apt-get or sudo was run: %s", strings.TrimSpace(readOr(called)))
}

func readOr(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
