package sim

// Pattern is a sample configuration of the page.
type Pattern struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	YAML        string `json:"yaml"`
}

// Patterns are the seed's four patterns and the cookbook's credit pool and
// hard and global limits.
var Patterns = []Pattern{
	{"simple", "5 requests per second, whatever happened before: the sixth within a second is rejected.", `key: user
tiers:
  - {limit: 5, window: 1s}
`},
	{"penalties", "5 per second; a burst reaches tier 2 (10 per second) for 5 s, which then cools down for 15 s: held to tier 1.", `key: user
tiers:
  - {limit: 5, window: 1s}
  - {limit: 10, window: 1s, active: 5s, cooldown: 15s}
`},
	{"punishment", "A buffer tier, then a prison tier: a domain that bursts through the buffer gets one request in the hour.", `key: user
tiers:
  - {limit: 5, window: 1s}
  - {limit: 10, window: 1s, active: 10s, cooldown: 1m, skippable: true}
  - {limit: 1, window: 1h, active: 1h}
`},
	{"batch", "A batch job: the first request opens a one-minute run of up to 50 requests, then nothing for the rest of the hour.", `key: job
tiers:
  - {limit: 50, window: 1m, active: 1m, cooldown: 59m}
`},
	{"credits", "A credit pool: 100 credits, 10 more per second; a request of N hits costs N.", `key: user
token_bucket: {capacity: 100, refill: 10, per: 1s}
`},
	{"hard-global", "Two tiers under a hard limit of 20 per second for the domain and a global limit of 2000 per second for the resource.", `key: user
tiers:
  - {limit: 10, window: 1s}
  - {limit: 50, window: 10s, active: 30s, cooldown: 5m}
hard_limit: 20
global_limit: 2000
`},
}
