package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The metrics of /metrics: the table's state at the scrape, read as the
// page reads it, over the last --metrics-window. The labels are those of
// the otel module (ddblease_job, ddblease_run_status, ddblease_owner): a
// label "job" would clash with the scrape's own.
var (
	mReadOK = prometheus.NewDesc("ddblease_table_read_ok",
		"1 if every read of the table for this scrape succeeded, else 0.", nil, nil)
	mHasLeader = prometheus.NewDesc("ddblease_job_has_leader",
		"1 if a tenure holds the job's lease by its recorded expiry (held or draining), else 0.", []string{"ddblease_job"}, nil)
	mFence = prometheus.NewDesc("ddblease_job_fence",
		"The lease's fence: it grows by one with every new tenure and every forced release.", []string{"ddblease_job"}, nil)
	mRenewalAge = prometheus.NewDesc("ddblease_job_renewal_age_seconds",
		"Seconds since the holder last wrote the lease (acquisition or heartbeat), by the clock of ddblease ui.", []string{"ddblease_job"}, nil)
	mPaused = prometheus.NewDesc("ddblease_job_paused",
		"1 if an operator paused the job's schedule, else 0.", []string{"ddblease_job"}, nil)
	mLastStatus = prometheus.NewDesc("ddblease_job_last_run_status",
		"1 for the status of the job's run that finished last in the window, 0 for the other final statuses.", []string{"ddblease_job", "ddblease_run_status"}, nil)
	mLastEnd = prometheus.NewDesc("ddblease_job_last_run_end_timestamp_seconds",
		"When the job's run that finished last in the window finished (Unix seconds, the claimant's clock).", []string{"ddblease_job"}, nil)
	mRuns = prometheus.NewDesc("ddblease_job_runs",
		"Runs of the job whose slot is in the window, by status (of the newest --max-runs).", []string{"ddblease_job", "ddblease_run_status"}, nil)
	mPeriod = prometheus.NewDesc("ddblease_job_period_seconds",
		"The job's schedule period as its slots show it: the shortest gap between its latest slots in the window.", []string{"ddblease_job"}, nil)
	mPoolMembers = prometheus.NewDesc("ddblease_pool_members",
		"Live members of the pool.", []string{"ddblease_pool"}, nil)
	mMemberJobs = prometheus.NewDesc("ddblease_pool_member_jobs",
		"Jobs of the pool that the member holds.", []string{"ddblease_pool", "ddblease_owner"}, nil)
	mPoolOff = prometheus.NewDesc("ddblease_pool_jobs_off_balance",
		"Jobs that must move to another member, or be taken, for each live member of the pool to hold its share.", []string{"ddblease_pool"}, nil)
)

var finalStatuses = []string{"succeeded", "failed", "abandoned"}

// uiCollector exports one reading of the table.
type uiCollector struct{ st uiState }

func (c uiCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mReadOK, mHasLeader, mFence, mRenewalAge, mPaused, mLastStatus, mLastEnd,
		mRuns, mPeriod, mPoolMembers, mMemberJobs, mPoolOff} {
		ch <- d
	}
}

func (c uiCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		m, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, v, labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
	}
	ok := len(c.st.Errors) == 0
	for _, j := range c.st.Jobs {
		ok = ok && j.Error == ""
		gauge(mHasLeader, b2f(j.hasLeader), j.Job)
		gauge(mFence, float64(j.Fence), j.Job)
		if !j.renewed.IsZero() {
			gauge(mRenewalAge, c.st.Now.Sub(j.renewed).Seconds(), j.Job)
		}
		gauge(mPaused, b2f(j.Paused), j.Job)
		for st, n := range j.ByStatus {
			gauge(mRuns, float64(n), j.Job, st)
		}
		if r := j.LastEnded; r != nil {
			for _, st := range finalStatuses {
				gauge(mLastStatus, b2f(r.Status == st), j.Job, st)
			}
			gauge(mLastEnd, float64(r.FinishedAt.UnixMilli())/1000, j.Job)
		}
		if j.PeriodMs > 0 {
			gauge(mPeriod, float64(j.PeriodMs)/1000, j.Job)
		}
	}
	for _, p := range c.st.Pools {
		live := 0
		for _, m := range p.Members {
			if m.Live {
				live++
			}
			gauge(mMemberJobs, float64(len(m.Jobs)), p.Name, m.Owner)
		}
		gauge(mPoolMembers, float64(live), p.Name)
		gauge(mPoolOff, float64(p.OffBy), p.Name)
	}
	gauge(mReadOK, b2f(ok))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// metrics serves /metrics: one reading of the table per scrape.
func (s *uiServer) metrics(w http.ResponseWriter, r *http.Request) {
	now := s.e.now()
	reg := prometheus.NewRegistry()
	if err := reg.Register(uiCollector{s.read(r.Context(), now.Add(-s.o.metricsIn), now)}); err != nil {
		writeStatus(w, http.StatusInternalServerError, err.Error())
		return
	}
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}).ServeHTTP(w, r)
}
