package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// hostPolicy is which names the servers of ddblease ui and ddblease local
// answer to: the Host of a request must be a loopback name (localhost,
// 127.0.0.1 or another loopback address, [::1]), or a name given with
// --allowed-host, with any port or none. A site whose name an attacker
// points at the server's address (DNS rebinding) is then not the server's
// origin: the browser sends the attacker's name as the Host, and the
// request is refused, reads too. The check is on whatever address the
// server listens: beyond loopback it still stops rebinding, but it is no
// access control (a client other than a browser sends any Host it likes).
type hostPolicy struct {
	allowed []string // lower case, without brackets or port
}

// hostList is the value of --allowed-host: names, the flag repeated or
// comma-separated.
type hostList []string

func (l *hostList) String() string { return strings.Join(*l, ",") }

func (l *hostList) Set(v string) error {
	for name := range strings.SplitSeq(v, ",") {
		name = strings.TrimSpace(name)
		if err := checkAllowedHost(name); err != nil {
			return err
		}
		*l = append(*l, name)
	}
	return nil
}

// allowedHostUsage is the help of --allowed-host.
const allowedHostUsage = "also answer to the Host `name` (a DNS name or IP address, any port; repeat or separate with commas); " +
	"without it only loopback names: localhost, 127.0.0.1, [::1]"

// checkAllowedHost says what is wrong with a name given to --allowed-host.
func checkAllowedHost(name string) error {
	bare := strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	switch {
	case name == "":
		return fmt.Errorf("an empty name")
	case net.ParseIP(bare) != nil:
		return nil
	case strings.Contains(name, ":"):
		return fmt.Errorf("%q: give the name without a port (any port is accepted)", name)
	case strings.ContainsAny(name, "/@?#* \t") || strings.Trim(name, ".") == "":
		return fmt.Errorf("%q is not a host name", name)
	}
	return nil
}

// newHostPolicy returns the policy that also admits the names given.
func newHostPolicy(names []string) hostPolicy {
	var p hostPolicy
	for _, n := range names {
		p.allowed = append(p.allowed, normalHost(n))
	}
	return p
}

// normalHost is a name as the policy compares it: lower case, without the
// brackets of an IPv6 address or a trailing dot.
func normalHost(name string) string {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if ip := net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")); ip != nil {
		return ip.String()
	}
	return name
}

// admits reports whether a request with this Host header is answered.
func (p hostPolicy) admits(host string) bool {
	name := host
	if h, port, err := net.SplitHostPort(host); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return false
		}
		name = h
	} else if strings.Count(host, ":") == 1 || strings.HasPrefix(host, "[") && !strings.HasSuffix(host, "]") {
		return false // a port that does not parse
	}
	name = normalHost(name)
	if name == "localhost" {
		return true
	}
	if ip := net.ParseIP(name); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, a := range p.allowed {
		if name == a {
			return true
		}
	}
	return false
}

// names lists what the policy admits, for messages.
func (p hostPolicy) names() string {
	return strings.Join(append([]string{"localhost", "127.0.0.1", "[::1]"}, p.allowed...), ", ")
}

// refusal is the answer to a request whose Host is not admitted: it names
// the Host and the flag that admits it.
func (p hostPolicy) refusal(cmd, host string) string {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	if name == "" {
		return fmt.Sprintf("request without a Host refused: ddblease %s answers only to %s", cmd, p.names())
	}
	return fmt.Sprintf("Host %q refused: ddblease %s answers only to %s (a name pointed at this address by another site is "+
		"how a page in your browser would read it); to serve this name, start it with --allowed-host %s", host, cmd, p.names(), name)
}

// handler answers the requests whose Host the policy admits with next, and
// the others with 421 Misdirected Request, written by refuse (each server
// writes errors in its clients' format), logging each refusal.
func (p hostPolicy) handler(cmd string, log *slog.Logger, refuse func(w http.ResponseWriter, code int, msg string), next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.admits(r.Host) {
			log.Warn("refused a request under a name not admitted", "host", r.Host, "method", r.Method, "path", r.URL.Path,
				"remote", r.RemoteAddr)
			refuse(w, http.StatusMisdirectedRequest, p.refusal(cmd, r.Host))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// listenWarning is what a server listening on addr prints on stderr when
// it is reachable beyond loopback, or "".
func (p hostPolicy) listenWarning(cmd string, addr net.Addr, who string) string {
	ip := addr.(*net.TCPAddr).IP
	if ip.IsLoopback() {
		return ""
	}
	msg := fmt.Sprintf("ddblease %s: listening beyond loopback (%s): anyone who can reach it can %s; the Host check "+
		"(answering only to %s) stops other sites' pages in a browser, not them", cmd, addr, who, p.names())
	if !ip.IsUnspecified() && !p.admits(ip.String()) {
		msg += fmt.Sprintf("; requests to %s itself are refused unless you add --allowed-host %s", ip, ip)
	}
	return msg
}

// dialHost is the host:port a client on this machine reaches a listener
// on addr by: 127.0.0.1 when it listens on every address.
func dialHost(addr net.Addr) string {
	a := addr.(*net.TCPAddr)
	ip := a.IP
	if ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(a.Port))
}
