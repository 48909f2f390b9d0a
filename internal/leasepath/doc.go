// Package leasepath holds the end-to-end tests of the runner's lease path
// (consumer.Leased) against a real Redis (dedup/redisdedup) and the webhook
// sink: redeliveries, concurrent runners, batches, slow handlers, lost
// leases, crashes, a Redis outage and a Redis restart, and a nil
// *redisdedup.Store given to NewRunner. It has no code of its own; the tests
// live here rather than in consumer so that importing consumer never pulls
// go-redis into a user's module graph.
package leasepath
