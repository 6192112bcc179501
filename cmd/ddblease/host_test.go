package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostCase is a request under a Host, and whether it is answered.
type hostCase struct {
	host     string
	answered bool
}

// loopbackHosts are the names both servers answer to without a flag.
func loopbackHosts(port string) []hostCase {
	return []hostCase{
		{"127.0.0.1:" + port, true}, {"127.0.0.1", true}, {"localhost:" + port, true}, {"localhost", true},
		{"LocalHost:1234", true}, {"[::1]:" + port, true}, {"[::1]", true}, {"127.0.0.2:80", true},
		{"evil.example:" + port, false}, {"evil.example", false}, {"localhost.evil.example", false},
		{"10.1.2.3:" + port, false},
	}
}

// checkHosts sends one request per case to url (with method and body)
// and checks the answer: 421 naming the Host and --allowed-host, or
// answered (want, or any other status if want is 0).
func checkHosts(t *testing.T, client *http.Client, method, url, body string, want int, cases []hostCase) {
	t.Helper()
	for _, c := range cases {
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		require.NoError(t, err)
		req.Host = c.host
		req.Header.Set("Content-Type", "application/x-amz-json-1.0")
		req.Header.Set("X-Amz-Target", "DynamoDB_20120810.DescribeTable")
		resp, err := client.Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		if !c.answered {
			assert.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode, "Host %q: %s", c.host, b)
			assert.Contains(t, string(b), `Host \"`+c.host+`\" refused`, "the refusal names the Host")
			name, _, _ := strings.Cut(c.host, ":")
			assert.Contains(t, string(b), "--allowed-host "+name, "the refusal names the flag that admits it")
			continue
		}
		if want == 0 {
			assert.NotEqual(t, http.StatusMisdirectedRequest, resp.StatusCode, "Host %q: %s", c.host, b)
			continue
		}
		assert.Equal(t, want, resp.StatusCode, "Host %q: %s", c.host, b)
	}
}

// ddblease ui answers only to loopback names, also when it listens on
// every address: a rebinding site's name is refused, reads too.
func TestHostUIOnAllAddresses(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	history(t, table, "billing", time.Now().Add(-time.Hour), 1)
	p := startUI(t, baseEnv(), srv.URL, table, "--addr", "0.0.0.0:0")
	port := regexp.MustCompile(`:(\d+)/$`).FindStringSubmatch(p.url)[1]
	for _, path := range []string{"/", "/api/state", "/metrics"} {
		t.Run(path, func(t *testing.T) {
			checkHosts(t, p.client, "GET", p.url+strings.TrimPrefix(path, "/"), "", http.StatusOK, loopbackHosts(port))
		})
	}
	waitFor(t, "the warning about listening beyond loopback", func() bool {
		return strings.Contains(p.stderr.String(), "listening beyond loopback") &&
			strings.Contains(p.stderr.String(), "answering only to localhost, 127.0.0.1, [::1]")
	})
	waitFor(t, "the refusals logged", func() bool {
		return strings.Contains(p.stderr.String(), `host=evil.example:`+port)
	})
}

// --allowed-host admits more names, repeated or comma-separated, in any
// case and with any port; the others are still refused.
func TestHostUIAllowedHost(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	history(t, table, "billing", time.Now().Add(-time.Hour), 1)
	p := startUI(t, baseEnv(), srv.URL, table, "--allowed-host", "ui.example.com, Other.Example", "--allowed-host", "10.1.2.3",
		"--allowed-host", "[fd00::1]")
	cases := []hostCase{
		{"ui.example.com", true}, {"UI.EXAMPLE.COM:443", true}, {"other.example:8080", true}, {"10.1.2.3:8080", true},
		{"[fd00::1]:8080", true}, {"localhost:8080", true},
		{"evil.example", false}, {"example.com", false}, {"10.1.2.4:8080", false},
	}
	checkHosts(t, p.client, "GET", p.url+"api/state", "", http.StatusOK, cases)

	for _, bad := range []struct{ value, want string }{
		{"ui.example.com:443", `"ui.example.com:443": give the name without a port`},
		{"", "an empty name"},
		{"a,,b", "an empty name"},
		{"http://ui.example.com", "give the name without a port"},
		{"*.example.com", `"*.example.com" is not a host name`},
	} {
		fails(t, cli(t, baseEnv(), "--table", table, "ui", "--allowed-host", bad.value), 2, bad.want)
	}
}

// localProc is a running `ddblease local`.
type localProc struct {
	endpoint string
	stdout   string // what it printed before serving
	stderr   *lockedBuffer
}

// startLocal runs `ddblease local` on a free loopback port with args, and
// stops it (SIGINT, exit status 0) when the test ends.
func startLocal(t *testing.T, args ...string) *localProc {
	t.Helper()
	c := exec.Command(bin, append([]string{"local", "--addr", "127.0.0.1:0"}, args...)...)
	c.Env = append(baseEnv(), ddbleasetest.EndpointEnv+"=http://127.0.0.1:1") // not served instead
	out, err := c.StdoutPipe()
	require.NoError(t, err)
	p := &localProc{stderr: &lockedBuffer{}}
	c.Stderr = p.stderr
	require.NoError(t, c.Start())
	t.Cleanup(func() {
		_ = c.Process.Signal(syscall.SIGINT)
		assert.NoError(t, c.Wait(), "ddblease local exits 0 on an interrupt; stderr: %s", p.stderr.String())
	})
	// What it prints before serving ends with a line of advice; wait for
	// it for a while, and go on with what came.
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var printed strings.Builder
	deadline := time.After(10 * time.Second)
read:
	for {
		select {
		case line, more := <-lines:
			if !more {
				break read
			}
			printed.WriteString(line + "\n")
			if m := regexp.MustCompile(`at (http://\S+),`).FindStringSubmatch(line); m != nil && p.endpoint == "" {
				p.endpoint = m[1]
			}
			if strings.HasPrefix(line, "then, for instance") {
				break read
			}
		case <-deadline:
			break read
		}
	}
	go func() {
		for range lines {
		}
	}()
	p.stdout = printed.String()
	require.NotEmpty(t, p.endpoint, "ddblease local printed:\n%s\nstderr: %s", p.stdout, p.stderr.String())
	return p
}

// ddblease local answers only to loopback names too: a rebinding site can
// neither read nor write the development server.
func TestLocalHostPolicy(t *testing.T) {
	t.Parallel()
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	for _, addr := range []string{"127.0.0.1:0", "0.0.0.0:0"} {
		t.Run(addr, func(t *testing.T) {
			p := startLocal(t, "--addr", addr)
			port := regexp.MustCompile(`:(\d+)$`).FindStringSubmatch(p.endpoint)[1]
			checkHosts(t, client, "POST", p.endpoint+"/", `{"TableName":"leases"}`, 0, loopbackHosts(port))
			if addr == "0.0.0.0:0" {
				assert.Contains(t, p.stderr.String(), "listening beyond loopback")
			}
		})
	}
	t.Run("--allowed-host", func(t *testing.T) {
		p := startLocal(t, "--allowed-host", "dynamodb.test")
		checkHosts(t, client, "POST", p.endpoint+"/", `{"TableName":"leases"}`, 0, []hostCase{{"dynamodb.test:8000", true}, {"evil.example", false}})
	})

	// Through the SDK, as the command sees it: a refusal says why.
	p := startLocal(t)
	db := srv.Client(nil)
	_, err := db.DescribeTable(context.Background(), &dynamodb.DescribeTableInput{TableName: aws.String("leases")}, func(o *dynamodb.Options) {
		o.BaseEndpoint = &p.endpoint
		o.HTTPClient = hostClient{"evil.example"}
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `Host "evil.example" refused`)
	assert.Contains(t, err.Error(), "--allowed-host evil.example")
}

// hostClient sends every request under another Host.
type hostClient struct{ host string }

func (c hostClient) Do(r *http.Request) (*http.Response, error) {
	r.Host = c.host
	return http.DefaultTransport.RoundTrip(r)
}

// ddblease local prints the export lines a second terminal needs; run with
// nothing else from the environment, the command and ddbleasetest.Start
// work against it.
func TestLocalPrintsExports(t *testing.T) {
	p := startLocal(t)
	exports := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^export ([A-Z0-9_]+)=(\S+)$`).FindAllStringSubmatch(p.stdout, -1) {
		exports[m[1]] = strings.Trim(m[2], "'")
	}
	for _, name := range []string{"AWS_ENDPOINT_URL_DYNAMODB", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
		ddbleasetest.EndpointEnv} {
		assert.Contains(t, exports, name, "printed:\n%s", p.stdout)
	}
	assert.Equal(t, p.endpoint, exports["AWS_ENDPOINT_URL_DYNAMODB"])

	// A second terminal: no --endpoint, no region, no credentials but the
	// printed ones, and no AWS configuration files.
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "AWS_CONFIG_FILE=/nonexistent",
		"AWS_SHARED_CREDENTIALS_FILE=/nonexistent", "AWS_EC2_METADATA_DISABLED=true"}
	for k, v := range exports {
		env = append(env, k+"="+v)
	}
	run := func(args ...string) result {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c := exec.CommandContext(ctx, bin, args...)
		c.Env = env
		var out, errb strings.Builder
		c.Stdout, c.Stderr = &out, &errb
		err := c.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return result{out.String(), errb.String(), code}
	}
	assert.Contains(t, ok(t, run("--table", "leases", "create-table")), "is ready")
	r := run("--table", "leases", "exec", "worker", "--", "true")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, ok(t, run("--table", "leases", "status", "--json")), `"job": "worker"`)

	// The examples' server: ddbleasetest.Start serves the endpoint named.
	t.Setenv(ddbleasetest.EndpointEnv, exports[ddbleasetest.EndpointEnv])
	ext := ddbleasetest.Start()
	defer ext.Close()
	assert.False(t, ext.InProcess())
	_, err := ext.Client(nil).DescribeTable(context.Background(), &dynamodb.DescribeTableInput{TableName: aws.String("leases")})
	require.NoError(t, err, "the table the command created")
}
