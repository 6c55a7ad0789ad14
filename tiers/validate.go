package tiers

import (
	"errors"
	"fmt"
	"time"
)

// ErrInvalidPolicy is wrapped by every error Validate returns.
var ErrInvalidPolicy = errors.New("tiers: invalid policy")

// FieldError names the invalid field of a policy, in the config's spelling
// ("tiers[1].window"). Its message is "field: problem", so that config can
// prefix it with a file, line and path. It wraps ErrInvalidPolicy.
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Problem }

// Unwrap returns ErrInvalidPolicy.
func (e *FieldError) Unwrap() error { return ErrInvalidPolicy }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// Validate reports the first invalid field of p as a *FieldError, or nil.
// Limits are 1..MaxLimit (hard and global limits 0..MaxLimit, 0 meaning
// none); windows and periods are at least 1µs and at most MaxDuration, or
// Unbounded where allowed (active periods and cooldowns); an active period of
// 0 is valid (Normalize removes the tier); at most MaxTiers tiers. A token
// bucket's capacity times its period in µs, divided by gcd(refill, period),
// must not exceed 2^53 (the fixed-point balance must stay exact), 2^52 for
// a post-paid bucket (Overdraft), whose balance may go negative.
func Validate(p *Policy) error {
	if p == nil {
		return fieldErr("policy", "missing")
	}
	limit := func(field string, v, lo int64) error {
		if v < lo {
			return fieldErr(field, "must be >= %d", lo)
		}
		if v > MaxLimit {
			return fieldErr(field, "must be <= %d", MaxLimit)
		}
		return nil
	}
	dur := func(field string, d time.Duration, lo time.Duration, unbounded bool) error {
		if d == Unbounded {
			if unbounded {
				return nil
			}
			return fieldErr(field, "must not be unbounded")
		}
		if d < 0 {
			return fieldErr(field, "must be >= 0")
		}
		if d < lo {
			if lo == time.Microsecond {
				return fieldErr(field, "must be > 0 (at least 1µs)")
			}
			return fieldErr(field, "must be at least %v", lo)
		}
		if d > MaxDuration {
			return fieldErr(field, "must be at most %v or unbounded", MaxDuration)
		}
		return nil
	}
	switch p.Kind {
	case KindTiers:
		if len(p.Tiers) > MaxTiers {
			return fieldErr("tiers", "at most %d tiers", MaxTiers)
		}
		if err := limit("hard_limit", p.HardLimit, 0); err != nil {
			return err
		}
		if err := limit("global_limit", p.GlobalLimit, 0); err != nil {
			return err
		}
		for i, t := range p.Tiers {
			f := fmt.Sprintf("tiers[%d].", i)
			if err := limit(f+"limit", t.Limit, 1); err != nil {
				return err
			}
			if err := dur(f+"window", t.Window, time.Microsecond, false); err != nil {
				return err
			}
			if err := dur(f+"active", t.Active, 0, true); err != nil {
				return err
			}
			if err := dur(f+"cooldown", t.Cooldown, 0, true); err != nil {
				return err
			}
		}
	case KindTokenBucket:
		b := p.Bucket
		if err := limit("token_bucket.capacity", b.Capacity, 1); err != nil {
			return err
		}
		if err := limit("token_bucket.refill", b.Refill, 1); err != nil {
			return err
		}
		if err := dur("token_bucket.per", b.Per, time.Microsecond, false); err != nil {
			return err
		}
		if _, _, capU, ok := bucketUnits(&b); !ok {
			return fieldErr("token_bucket.capacity", "too large for refill %d per %v (capacity × per / gcd(refill, per in µs) must be <= 2^53)", b.Refill, b.Per)
		} else if p.Overdraft && capU > maxOverdraftUnits {
			return fieldErr("token_bucket.capacity", "too large for post-paid counting with refill %d per %v (capacity × per / gcd(refill, per in µs) must be <= 2^52)", b.Refill, b.Per)
		}
	case KindFixedWindow:
		// 0 rejects every request (requests_per_unit: 0).
		if err := limit("requests_per_unit", p.Window.Limit, 0); err != nil {
			return err
		}
		if unitMicros(p.Window.Unit) == 0 {
			return fieldErr("unit", "unknown unit %d", p.Window.Unit)
		}
	case KindQuota:
		if err := limit("quota.limit", p.Quota.Limit, 1); err != nil {
			return err
		}
		if _, known := windowLimit(p); !known {
			return fieldErr("quota.period", "unknown period %d", p.Quota.Period)
		}
	default:
		return fieldErr("kind", "unknown kind %d", p.Kind)
	}
	if p.Concurrency {
		return validateConcurrency(p)
	}
	return nil
}

// validateConcurrency checks what a concurrency limit is: one tier, active
// for ever, no cooldown, no hard or global limit, counting for admission.
// Its fields are named as the configuration's concurrency block names them
// (concurrency.limit, concurrency.ttl).
func validateConcurrency(p *Policy) error {
	switch {
	case p.Kind != KindTiers:
		return fieldErr("concurrency", "applies only to burst tiers (kind %v)", p.Kind)
	case len(p.Tiers) != 1:
		return fieldErr("concurrency", "has exactly one tier, not %d", len(p.Tiers))
	case p.Tiers[0].Active != Unbounded:
		return fieldErr("concurrency", "its tier is active for ever, not for %v", p.Tiers[0].Active)
	case p.Tiers[0].Cooldown != 0:
		return fieldErr("concurrency", "its tier has no cooldown, not %v", p.Tiers[0].Cooldown)
	case p.HardLimit != 0:
		return fieldErr("hard_limit", "does not apply to a concurrency limit")
	case p.GlobalLimit != 0:
		return fieldErr("global_limit", "does not apply to a concurrency limit")
	case p.Overdraft:
		return fieldErr("overdraft", "does not apply to a concurrency limit (a slot is held before the request runs, never after)")
	}
	return nil
}
