// Package chaos is the fault-injection suite: replicas run as separate OS
// processes against a DynamoDB-compatible server, behind fault-injecting
// proxies, under a seeded plan of kills, deploys, pauses, lost responses,
// server errors, throttling and clock offsets. Each replica records what it
// did; a checker then reads those records and the tables and reports every
// violation of the library's guarantees.
//
// The suite lives in chaos_test.go; this package holds the parts: the
// replica's main (RunReplica), the proxy, the plan and the checker.
package chaos
