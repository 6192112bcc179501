// Package sim is a deterministic simulation of ddblease; see sim_test.go.
package sim
