package ddblease

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// This file owns DefaultOwner: the owner id a replica takes by default (ECS
// task, pod, host).

// Environment variables DefaultOwner reads.
const (
	// ecsMetadataEnv is set by the ECS agent (platform 1.4.0 on Fargate,
	// agent 1.39.0 on EC2) to the task metadata endpoint, version 4.
	ecsMetadataEnv = "ECS_CONTAINER_METADATA_URI_V4"
	// podNameEnv and podNamespaceEnv are the variables a pod spec sets
	// from the downward API (fieldRef metadata.name, metadata.namespace).
	podNameEnv      = "POD_NAME"
	podNamespaceEnv = "POD_NAMESPACE"
)

// ownerMetadataTimeout bounds the request to the ECS task metadata
// endpoint.
const ownerMetadataTimeout = time.Second

// maxOwnerBase bounds the part of an owner id DefaultOwner takes from the
// environment, leaving room for the suffix under the 256-byte limit.
const maxOwnerBase = 230

// DefaultOwner returns this process's owner id: one that an operator can
// trace to the task, pod or process that holds a lease, followed by a
// random suffix drawn once per process, so that a process restarted with
// the same host name and pid (a container's pid 1, a pod restarted in
// place) is not taken for its previous life:
//
//   - on Amazon ECS (ECS_CONTAINER_METADATA_URI_V4 set), the task ARN read
//     from the task metadata endpoint, as in
//     "arn:aws:ecs:eu-west-1:111122223333:task/prod/0123abcd-5f3e9a01";
//   - on Kubernetes (KUBERNETES_SERVICE_HOST set), the pod name from
//     POD_NAME (set it from the downward API), else the hostname, which is
//     the pod name unless the pod spec sets another; prefixed by
//     POD_NAMESPACE and a slash when that is set, as in "prod/billing-7d9f-x2k4-5f3e9a01";
//   - elsewhere "<hostname>-<pid>-<suffix>".
//
// The metadata request is bounded by ctx and by one second; if it fails,
// DefaultOwner falls back to the hostname and pid without an error. Every
// call in a process returns the same suffix. When Options.Owner is empty,
// New and NewPool use this id, looking the task up once per process, for
// every handle of the process, except that a handle on a job (or a pool)
// for which the process already made one with the default owner gets the
// id followed by "-2", "-3" and so on: two handles of one process that
// contend for one job stay two contenders. So a process shows as one
// owner in `ddblease status` whatever number of jobs it leads. To log the
// owner a Lease uses, read Lease.Owner.
func DefaultOwner(ctx context.Context) string {
	return ownerBase(ctx) + "-" + processSuffix()
}

// processSuffix returns the random suffix of this process's owner id.
var processSuffix = sync.OnceValue(func() string { return randomID(4) })

// ownerBase returns the traceable part of DefaultOwner.
func ownerBase(ctx context.Context) string {
	if uri := os.Getenv(ecsMetadataEnv); uri != "" {
		if arn, err := ecsTaskARN(ctx, uri); err == nil {
			return arn
		}
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		pod := cleanOwnerPart(os.Getenv(podNameEnv))
		if pod == "" {
			pod = hostname()
		}
		if ns := cleanOwnerPart(os.Getenv(podNamespaceEnv)); ns != "" {
			pod = ns + "/" + pod
		}
		return truncate(pod, maxOwnerBase)
	}
	return fmt.Sprintf("%s-%d", truncate(hostname(), maxOwnerBase-12), os.Getpid())
}

// metadataClient asks the task metadata endpoint, a link-local address
// that no HTTP proxy configured for the application's traffic can reach,
// and keeps no connection open.
var metadataClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

// ecsTaskARN reads TaskARN from the task metadata endpoint's /task
// document.
func ecsTaskARN(ctx context.Context, uri string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, ownerMetadataTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(uri, "/")+"/task", nil)
	if err != nil {
		return "", err
	}
	resp, err := metadataClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("task metadata: %s", resp.Status)
	}
	var doc struct {
		TaskARN string `json:"TaskARN"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&doc); err != nil {
		return "", err
	}
	arn := cleanOwnerPart(doc.TaskARN)
	if arn == "" || len(arn) > maxOwnerBase {
		return "", fmt.Errorf("task metadata: unusable TaskARN %q", doc.TaskARN)
	}
	return arn, nil
}

func hostname() string {
	host, err := os.Hostname()
	if host = cleanOwnerPart(host); err != nil || host == "" {
		return "host"
	}
	return host
}

// cleanOwnerPart trims s and drops it if it is not a valid owner.
func cleanOwnerPart(s string) string {
	s = strings.TrimSpace(s)
	if s == "" || checkName("owner", s, 256) != nil {
		return ""
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// processOwner caches the traceable part of the default owner for the
// handles New and NewPool make (a failed metadata lookup is not cached),
// and numbers those handles by what they contend for.
var processOwner struct {
	sync.Mutex
	base string
	// taken holds, for each lease or pool item a handle with the default
	// owner contends for (by a hash of table and item: a pool of many jobs
	// keeps a few bytes a job here), the highest number given to one: 1
	// for the process's own id, n for the id followed by "-n". Two items
	// whose hashes collide at worst number a handle past the other's.
	taken map[uint64]uint32
	seed  maphash.Seed
}

// defaultOwner returns the owner of a new handle on table that contends
// for the items named (its job's lease, a pool's item and its jobs'): the
// process's id, numbered past the handles already made for any of them.
func defaultOwner(table string, contends []string) string {
	processOwner.Lock()
	defer processOwner.Unlock()
	base := processOwner.base
	if base == "" {
		base = ownerBase(context.Background())
		if os.Getenv(ecsMetadataEnv) == "" || strings.HasPrefix(base, "arn:") {
			processOwner.base = base
		}
	}
	base += "-" + processSuffix()
	if processOwner.taken == nil {
		processOwner.taken, processOwner.seed = map[uint64]uint32{}, maphash.MakeSeed()
	}
	key := func(c string) uint64 { return maphash.String(processOwner.seed, table+"\x00"+c) }
	n := uint32(1)
	for _, c := range contends {
		n = max(n, processOwner.taken[key(c)]+1)
	}
	for _, c := range contends {
		processOwner.taken[key(c)] = n
	}
	if n == 1 {
		return base
	}
	return base + "-" + strconv.FormatUint(uint64(n), 10)
}
