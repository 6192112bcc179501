package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// Event is one line of a replica's history. T is the real time (the
// machine's wall clock, shared by all replicas) in Unix nanoseconds.
type Event struct {
	T       int64  `json:"t"`
	Replica string `json:"replica"`
	Kind    string `json:"kind"`
	// Job is the pool's job an event is about (a reading, a fn call, an
	// effect); empty for the one job of a replica that runs no pool and
	// for the events of the replica as a whole (start, exit).
	Job      string `json:"job,omitempty"`
	Fence    int64  `json:"fence,omitempty"`
	Slot     string `json:"slot,omitempty"`
	Deadline int64  `json:"deadline,omitempty"` // real time, Unix ns
	OK       bool   `json:"ok,omitempty"`
	Err      string `json:"err,omitempty"`
	// B and A bracket a reading (EvBelief, EvCtxEnd) or a call (EvEffect,
	// EvRun, EvReturn): real times, Unix ns, taken just before and just
	// after it.
	B    int64  `json:"b,omitempty"`
	A    int64  `json:"a,omitempty"`
	Form string `json:"form,omitempty"` // EvEffect: the guard form used
	Info string `json:"info,omitempty"` // EvObserved: the event kind
}

// Event kinds.
const (
	EvStart = "start" // process started; OK if it is race-enabled
	// EvBelief is one reading of IsLeader (State): OK if leader, Fence the
	// tenure's fence then (0 if not leader), Deadline the State's deadline
	// in real time. Only the readings on either side of a change are
	// recorded.
	EvBelief   = "belief"
	EvRun      = "run"      // fn called for a slot (B: entry); OK if its context was live
	EvCtxEnd   = "ctx-end"  // a leader context seen ended (A: an upper bound of its end)
	EvReturn   = "return"   // fn returned (A: after the last use of its context)
	EvEffect   = "effect"   // side effect through a guard form: OK if accepted; B: call start
	EvFinished = "finished" // run recorded as finished (OK) or refused
	EvExit     = "exit"     // RunSchedule returned (Err: what it returned)
	EvObserved = "observed" // an observer event, for information only
	// EvStall: the replica's process did not run from B to A (a ticker
	// every 5 ms arrived more than 250 ms late): a fault for liveness.
	EvStall = "stall"
	// EvTimedOut: a request of the library's got no answer within
	// CallTimeout (B: its send, A: its end), whatever held it up (the
	// server, the proxy, the replica's own process on a loaded machine): a
	// fault for the outcomes it explains, as a late answer the proxy saw.
	EvTimedOut = "timed-out"
)

// Recorder appends events to a file, one JSON object a line. Each event is
// one write system call, so a SIGKILL loses none that was recorded.
type Recorder struct {
	mu      sync.Mutex
	f       *os.File
	replica string
}

// NewRecorder opens path for appending.
func NewRecorder(path, replica string) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &Recorder{f: f, replica: replica}, nil
}

// Record writes e, stamped with the real time and the replica's name.
func (r *Recorder) Record(e Event) {
	e.T = time.Now().UnixNano()
	e.Replica = r.replica
	b, _ := json.Marshal(e)
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.f.Write(append(b, '\n'))
}

// Close closes the file.
func (r *Recorder) Close() error { return r.f.Close() }

// ReadEvents reads a history file. A torn last line (a process killed while
// writing) is ignored; any other bad line is an error.
func ReadEvents(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var evs []Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	var bad string
	for sc.Scan() {
		if bad != "" {
			return nil, fmt.Errorf("%s: bad event line %q", path, bad)
		}
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			bad = sc.Text()
			continue
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}
