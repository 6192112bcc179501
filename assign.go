package ddblease

import (
	"cmp"
	"hash/fnv"
	"slices"
	"strconv"
)

// This file owns how a pool's jobs are shared out: Assign (the balancing
// policy, and the contract another would keep), the assignment a replica
// acts on from the members it last read, and the view its member item
// names so that replicas know when they act on the same one.

// Assign returns the assignment of jobs to replicas that every replica of a
// pool computes from the same live replicas: owner -> its jobs, sorted.
// Each replica gets len(jobs)/len(replicas) jobs, or one more. A replica
// that joins or leaves moves few jobs besides the ones it must (rendezvous
// hashing: each job goes to the replica ranked highest for it that has
// room).
//
// The contract a balancing policy keeps (assign is its one home, and the
// place for another policy): the result depends on the sets of jobs and
// replicas only, not on their order or duplicates, so that replicas that
// read the same members agree; each job goes to exactly one of the
// replicas; a replica that declines a job (an operator's resign request)
// gets it only if every replica declines it. Nothing else rests on it: a
// job has one leader at a time because its lease says so, whatever the
// replicas compute, and an assignment that replicas disagree on (their
// views differ for a heartbeat) delays a job's move, never doubles it. The
// even shares and the few moves are what the policy is for, not what the
// guarantees need.
func Assign(jobs, replicas []string) map[string][]string {
	return assign(jobs, replicas, nil)
}

// assign is Assign, with the jobs each replica declines (declined[replica]
// [job]): a replica that declines a job ranks last for it, and the jobs
// some replica declines are placed first, so that a decline moves its job
// whenever another replica can take it.
func assign(jobs, replicas []string, declined map[string]map[string]bool) map[string][]string {
	out := make(map[string][]string, len(replicas))
	if len(replicas) == 0 {
		return out
	}
	reps := slices.Clone(replicas)
	slices.Sort(reps)
	reps = slices.Compact(reps)
	js := slices.Clone(jobs)
	slices.Sort(js)
	js = slices.Compact(js)
	hashes := make(map[string]uint64, len(js))
	someDecline := map[string]bool{}
	for _, j := range js {
		hashes[j] = hash64(j)
		for _, r := range reps {
			someDecline[j] = someDecline[j] || declined[r][j]
		}
	}
	slices.SortFunc(js, func(a, b string) int {
		return cmp.Or(cmp.Compare(b2i(someDecline[b]), b2i(someDecline[a])), cmp.Compare(hashes[a], hashes[b]), cmp.Compare(a, b))
	})
	limit := (len(js) + len(reps) - 1) / len(reps)
	spare := len(js) - (limit-1)*len(reps) // replicas that may get the extra job
	type rank struct {
		rep      string
		declines bool
		h        uint64
	}
	ranks := make([]rank, len(reps))
	for _, j := range js {
		for i, r := range reps {
			ranks[i] = rank{r, declined[r][j], hash64(j + "\x00" + r)}
		}
		slices.SortFunc(ranks, func(a, b rank) int {
			return cmp.Or(cmp.Compare(b2i(a.declines), b2i(b.declines)), cmp.Compare(b.h, a.h), cmp.Compare(a.rep, b.rep))
		})
		for _, r := range ranks {
			n := len(out[r.rep])
			if n < limit-1 || n == limit-1 && spare > 0 {
				if n == limit-1 {
					spare--
				}
				out[r.rep] = append(out[r.rep], j)
				break
			}
		}
	}
	for _, v := range out {
		slices.Sort(v)
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func hash64(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	x := h.Sum64()
	// A finalizer spreads the bits of near keys (job-001, job-002).
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

// decline records an operator's move of job off this replica (a resign
// request, a forced release): this replica declines it, and renews its
// membership at once to say so. A job already declined is left as it is.
func (p *Pool) decline(job string) {
	p.mu.Lock()
	if p.declined[job] {
		p.mu.Unlock()
		return
	}
	if p.declined == nil {
		p.declined = map[string]bool{}
	}
	p.declined[job] = true
	p.mu.Unlock()
	p.log.Info("ddblease: an operator moved the job off this replica (a resign request or a forced release): "+
		"it declines it while the pool runs", "job", job)
	select {
	case p.declines <- struct{}{}:
	default:
	}
}

// assignment returns the owner of each job by the live members seen, and
// the view this replica acts on (viewOf).
func (p *Pool) assignment(seen poolView) (owners map[string]string, view string) {
	declined := map[string]map[string]bool{}
	for _, r := range seen.live {
		for _, job := range seen.members[r].declined {
			if declined[r] == nil {
				declined[r] = map[string]bool{}
			}
			declined[r][job] = true
		}
	}
	owners = map[string]string{}
	for rep, jobs := range assign(p.jobs, seen.live, declined) {
		for _, job := range jobs {
			owners[job] = rep
		}
	}
	return owners, p.viewOf(seen)
}

// alsoFor reports whether this replica campaigns for the jobs of its list
// assigned to replica to besides its own share: to runs another job list,
// and may not campaign for them.
func (p *Pool) alsoFor(seen poolView, to string) bool {
	m, ok := seen.members[to]
	return to != "" && to != p.opts.Owner && ok && m.jobs != p.jobsHash
}

// viewOf names what this replica's assignment depends on: its job list,
// and each live member with the jobs it declines. Replicas that act on
// the same view compute the same assignment.
func (p *Pool) viewOf(seen poolView) string {
	if len(seen.live) == 0 {
		return ""
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(p.jobsHash))
	for _, r := range seen.live {
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(r))
		for _, job := range seen.members[r].declined {
			_, _ = h.Write([]byte{1})
			_, _ = h.Write([]byte(job))
		}
	}
	return strconv.FormatUint(h.Sum64(), 36)
}

// listHash names a job list (sorted) in a member item.
func listHash(jobs []string) string {
	h := fnv.New64a()
	for _, j := range jobs {
		_, _ = h.Write([]byte(j))
		_, _ = h.Write([]byte{0})
	}
	return strconv.FormatUint(h.Sum64(), 36)
}
