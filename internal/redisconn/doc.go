// Package redisconn owns Charon's connections to Redis: it reads every URL
// form (redis://, rediss://, their Sentinel and Cluster forms, unix://),
// applies the credentials and TLS that override a URL's, and opens the
// go-redis client that the stores (redisstore, rediscopy, redisshare) take.
// No other package parses a Redis URL or chooses how a connection fails.
//
// How a connection fails is part of Charon's answer to an outage. A refused
// dial, and a connection that is reset or closed under a command, are Redis'
// answer that it is down: Open's client returns them at once, with no
// go-redis retry and no backoff, so that the caller's failure mode answers
// while the caller still waits and the circuit breaker hears of the outage
// from the first calls (a Cluster client, which tries a node it cannot
// reach again up to MaxRedirects times, makes those attempts with no
// backoff between them). Only a Redis that is slow (a dial or a reply that
// takes its time) is waited for, up to the caller's deadline. A retried
// command is also a command that may run twice: a decision script that ran
// but whose reply was lost would count its hits again.
package redisconn
