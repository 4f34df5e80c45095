//! Per-tenant token buckets for requests and tokens, checked before a request queues.
//!
//! Rate limits run *before* admission so that a tenant over its rate is told so at once with a
//! precise `Retry-After`, instead of taking a queue slot it may not use. The gateway reserves
//! `prompt + max_tokens` tokens up front (it cannot know the completion length in advance) and
//! refunds what was not generated when the request ends, so a tenant is charged for what it used
//! while a burst can never overshoot the limit by more than one request's reservation.
//!
//! Time is always passed in (`now: Instant`), never read here: tests drive the buckets with
//! synthetic instants and get exact answers without sleeping.
//!
//! Arithmetic is integral: a bucket counts in units of 1/60,000,000,000 of a token (a token per
//! minute is one unit per nanosecond), so refill over any whole number of nanoseconds is exact
//! and `retry_after` is the true wait rounded up to the nanosecond.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::tenants::{Tenant, Tenants};

/// Units per token: nanoseconds per minute, so a limit of `L` per minute refills `L` units per
/// nanosecond.
const UNITS_PER_TOKEN: u128 = 60_000_000_000;

/// A token bucket: holds at most `capacity` tokens, refills continuously at `capacity` per
/// minute, and starts full (a fresh tenant may burst up to its whole per-minute allowance).
#[derive(Debug, Clone)]
pub struct TokenBucket {
    per_minute: u64,
    /// Current level in units (see [`UNITS_PER_TOKEN`]).
    level: u128,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket for a limit of `per_minute` (must be > 0; `Tenants` refuses 0).
    pub fn new(per_minute: u64, now: Instant) -> TokenBucket {
        TokenBucket {
            per_minute,
            level: per_minute as u128 * UNITS_PER_TOKEN,
            last: now,
        }
    }

    /// The capacity in tokens (= the per-minute limit).
    pub fn capacity(&self) -> u64 {
        self.per_minute
    }

    fn capacity_units(&self) -> u128 {
        self.per_minute as u128 * UNITS_PER_TOKEN
    }

    /// Brings the level up to `now`. An instant earlier than the last one seen (callers on other
    /// threads take `Instant::now()` before contending for the lock) refills nothing and does not
    /// move the clock back.
    fn refill(&mut self, now: Instant) {
        if now > self.last {
            let elapsed = now.duration_since(self.last).as_nanos();
            let added = elapsed.saturating_mul(self.per_minute as u128);
            self.level = self.level.saturating_add(added).min(self.capacity_units());
            self.last = now;
        }
    }

    /// Whole tokens available at `now`.
    pub fn available(&mut self, now: Instant) -> u64 {
        self.refill(now);
        (self.level / UNITS_PER_TOKEN) as u64
    }

    /// How long until `tokens` are available (zero if they are now); `None` if `tokens` exceeds
    /// the capacity and so can never be available. Assumes `refill(now)` was just called.
    fn wait_for(&self, tokens: u64) -> Option<Duration> {
        if tokens > self.per_minute {
            return None;
        }
        let need = tokens as u128 * UNITS_PER_TOKEN;
        let deficit = need.saturating_sub(self.level);
        let nanos = deficit.div_ceil(self.per_minute as u128);
        Some(Duration::from_nanos(nanos as u64))
    }

    fn take(&mut self, tokens: u64) {
        self.level -= tokens as u128 * UNITS_PER_TOKEN;
    }

    fn give_back(&mut self, tokens: u64) {
        self.level = (self.level + tokens as u128 * UNITS_PER_TOKEN).min(self.capacity_units());
    }
}

/// Which limit a request ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Requests,
    Tokens,
}

/// A request refused by a tenant's rate limit (an OpenAI-style 429).
///
/// `retry_after` is `None` when the request can *never* fit: it asks for more tokens than the
/// tenant's whole per-minute allowance. Retrying such a request is pointless, so the HTTP layer
/// should send no `Retry-After` for it (OpenAI answers "Request too large ... on tokens per
/// min" the same way); `requested > limit_per_minute` then says by how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimited {
    pub limit: Which,
    /// The tenant's limit for `limit`, per minute.
    pub limit_per_minute: u64,
    /// What the request asked for from that bucket (1 for requests).
    pub requested: u64,
    pub retry_after: Option<Duration>,
}

impl RateLimited {
    /// The reason label for a rejection counter. A request too large for the token bucket counts
    /// as `rate_limit_tokens` too: it is the token limit it ran into.
    pub fn metric_label(&self) -> &'static str {
        match self.limit {
            Which::Requests => "rate_limit_requests",
            Which::Tokens => "rate_limit_tokens",
        }
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.limit {
            Which::Requests => "requests",
            Which::Tokens => "tokens",
        };
        match self.retry_after {
            Some(wait) => write!(
                f,
                "Rate limit reached for {what} per minute: limit {}, requested {}. \
                 Please try again in {:.3}s.",
                self.limit_per_minute,
                self.requested,
                wait.as_secs_f64()
            ),
            None => write!(
                f,
                "Request too large for {what} per minute: limit {}, requested {}. \
                 Reduce the prompt or max_tokens.",
                self.limit_per_minute, self.requested
            ),
        }
    }
}

impl std::error::Error for RateLimited {}

/// A tenant's buckets; `None` where the tenant has no such limit.
#[derive(Debug)]
struct Buckets {
    requests: Option<TokenBucket>,
    tokens: Option<TokenBucket>,
}

/// Per-tenant buckets, built once from the tenants.
///
/// One mutex per tenant: tenants never contend with each other, and a tenant's two buckets are
/// updated together under one lock, which is what makes the two-bucket take atomic.
#[derive(Debug)]
pub struct RateLimiter {
    by_tenant: HashMap<String, Arc<Mutex<Buckets>>>,
}

/// Tokens taken by a successful [`RateLimiter::check`]. Dropping it keeps them spent;
/// [`Reservation::refund`] gives back what the request did not use.
#[derive(Debug)]
#[must_use = "drop it to keep the tokens spent, or refund what the request did not use"]
pub struct Reservation {
    /// `None` when the tenant has no token limit (nothing to refund).
    buckets: Option<Arc<Mutex<Buckets>>>,
    tokens: u64,
}

impl Reservation {
    /// The tokens reserved.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Returns `unused_tokens` (at most the amount reserved) to the tenant's token bucket, e.g.
    /// `max_tokens - completion_tokens` when a generation stopped early. The request itself
    /// stays counted.
    pub fn refund(self, unused_tokens: u64, now: Instant) {
        let Some(buckets) = self.buckets else { return };
        let mut b = buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = b.tokens.as_mut() {
            bucket.refill(now);
            bucket.give_back(unused_tokens.min(self.tokens));
        }
    }
}

impl RateLimiter {
    /// Buckets for every tenant that has a limit, full at the moment of creation.
    pub fn new(tenants: &Tenants) -> RateLimiter {
        let now = Instant::now();
        let by_tenant = tenants
            .tenants()
            .filter(|t| t.requests_per_minute.is_some() || t.tokens_per_minute.is_some())
            .map(|t| {
                let buckets = Buckets {
                    requests: t
                        .requests_per_minute
                        .map(|l| TokenBucket::new(l as u64, now)),
                    tokens: t.tokens_per_minute.map(|l| TokenBucket::new(l, now)),
                };
                (t.name.clone(), Arc::new(Mutex::new(buckets)))
            })
            .collect();
        RateLimiter { by_tenant }
    }

    /// Takes one request and `tokens` tokens from `tenant`'s buckets, both or neither.
    ///
    /// When both buckets are short, the error reports the one with the longer wait: the client
    /// must wait for both, and the longer wait is the honest `Retry-After`. A tenant unknown to
    /// this limiter (not in the `Tenants` it was built from) is not limited.
    pub fn check(
        &self,
        tenant: &Tenant,
        tokens: u64,
        now: Instant,
    ) -> Result<Reservation, RateLimited> {
        let Some(buckets) = self.by_tenant.get(&tenant.name) else {
            return Ok(Reservation {
                buckets: None,
                tokens,
            });
        };
        // A poisoned lock only means another thread panicked mid-update; the bucket's numbers
        // are still sane (every update is a single assignment), so keep limiting.
        let mut b = buckets.lock().unwrap_or_else(|e| e.into_inner());
        let mut refused: Option<RateLimited> = None;
        if let Some(bucket) = b.requests.as_mut() {
            bucket.refill(now);
            let wait = bucket.wait_for(1);
            if wait != Some(Duration::ZERO) {
                refused = Some(RateLimited {
                    limit: Which::Requests,
                    limit_per_minute: bucket.capacity(),
                    requested: 1,
                    retry_after: wait,
                });
            }
        }
        if let Some(bucket) = b.tokens.as_mut() {
            bucket.refill(now);
            let wait = bucket.wait_for(tokens);
            if wait != Some(Duration::ZERO) {
                let this = RateLimited {
                    limit: Which::Tokens,
                    limit_per_minute: bucket.capacity(),
                    requested: tokens,
                    retry_after: wait,
                };
                // Keep the longer wait; "never fits" (None) outranks any finite wait.
                let keep_first = |first: &RateLimited| match (first.retry_after, wait) {
                    (None, _) => true,
                    (Some(_), None) => false,
                    (Some(a), Some(b)) => a >= b,
                };
                refused = match refused {
                    Some(r) if keep_first(&r) => Some(r),
                    _ => Some(this),
                };
            }
        }
        if let Some(r) = refused {
            return Err(r);
        }
        if let Some(bucket) = b.requests.as_mut() {
            bucket.take(1);
        }
        let has_token_bucket = match b.tokens.as_mut() {
            Some(bucket) => {
                bucket.take(tokens);
                true
            }
            None => false,
        };
        drop(b);
        Ok(Reservation {
            buckets: has_token_bucket.then(|| buckets.clone()),
            tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(rpm: Option<u32>, tpm: Option<u64>) -> Tenant {
        Tenant {
            name: "t".into(),
            weight: 1.0,
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
            max_concurrent: None,
            deadline_ms: None,
        }
    }

    /// A limiter over one tenant, with its buckets created at `t0`.
    fn limiter(t: &Tenant, t0: Instant) -> RateLimiter {
        let buckets = Buckets {
            requests: t
                .requests_per_minute
                .map(|l| TokenBucket::new(l as u64, t0)),
            tokens: t.tokens_per_minute.map(|l| TokenBucket::new(l, t0)),
        };
        RateLimiter {
            by_tenant: [(t.name.clone(), Arc::new(Mutex::new(buckets)))].into(),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn bucket_starts_full_and_refills_exactly() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(600, t0); // 10 per second
        assert_eq!(b.available(t0), 600);
        b.take(600);
        assert_eq!(b.available(t0), 0);
        assert_eq!(b.available(t0 + ms(99)), 0);
        assert_eq!(b.available(t0 + ms(100)), 1);
        assert_eq!(b.available(t0 + ms(1_000)), 10);
        assert_eq!(b.wait_for(11), Some(ms(100)));
        assert_eq!(b.available(t0 + Duration::from_secs(59)), 590);
        // Never above capacity, however long it idles.
        assert_eq!(b.available(t0 + Duration::from_secs(3_600)), 600);
        // An instant from the past refills nothing and leaves the clock where it was.
        b.take(600);
        assert_eq!(b.available(t0), 0);
        assert_eq!(b.available(t0 + Duration::from_secs(3_600) + ms(100)), 1);
    }

    #[test]
    fn retry_after_rounds_up_to_the_nanosecond() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(7, t0); // one token every 60/7 s
        b.take(7);
        b.refill(t0);
        assert_eq!(b.wait_for(1), Some(Duration::from_nanos(8_571_428_572)));
        assert_eq!(b.wait_for(7), Some(Duration::from_secs(60)));
        assert_eq!(b.wait_for(8), None);
        b.refill(t0 + Duration::from_nanos(8_571_428_571));
        assert_eq!(b.wait_for(1), Some(Duration::from_nanos(1)));
    }

    #[test]
    fn requests_limit_and_retry_after() {
        let t0 = Instant::now();
        let t = tenant(Some(2), None); // one request per 30 s
        let rl = limiter(&t, t0);
        let _ = rl.check(&t, 1_000_000, t0).unwrap();
        let _ = rl.check(&t, 0, t0 + Duration::from_secs(1)).unwrap();
        let err = rl.check(&t, 0, t0 + Duration::from_secs(1)).unwrap_err();
        assert_eq!(
            err,
            RateLimited {
                limit: Which::Requests,
                limit_per_minute: 2,
                requested: 1,
                retry_after: Some(Duration::from_secs(29)),
            }
        );
        assert_eq!(err.metric_label(), "rate_limit_requests");
        assert_eq!(
            err.to_string(),
            "Rate limit reached for requests per minute: limit 2, requested 1. \
             Please try again in 29.000s."
        );
        assert!(rl.check(&t, 0, t0 + Duration::from_secs(30)).is_ok());
    }

    #[test]
    fn two_bucket_take_is_atomic() {
        let t0 = Instant::now();
        let t = tenant(Some(60), Some(600)); // 1 request/s, 10 tokens/s
        let rl = limiter(&t, t0);
        let _ = rl.check(&t, 595, t0).unwrap();
        // Tokens short: no request is taken either.
        let err = rl.check(&t, 10, t0).unwrap_err();
        assert_eq!(err.limit, Which::Tokens);
        assert_eq!(err.retry_after, Some(ms(500)));
        assert_eq!(err.metric_label(), "rate_limit_tokens");
        for _ in 0..59 {
            let _ = rl.check(&t, 0, t0).unwrap();
        }
        // Requests now empty (60 taken); tokens still hold 5: a refused request takes none.
        let err = rl.check(&t, 5, t0).unwrap_err();
        assert_eq!(
            (err.limit, err.retry_after),
            (Which::Requests, Some(ms(1_000)))
        );
        let _ = rl.check(&t, 5, t0 + ms(1_000)).unwrap();
        // 5 + 10 refilled - 5 = 10 left; another second makes exactly 20, and 21 does not fit.
        assert_eq!(
            rl.check(&t, 21, t0 + ms(2_000)).unwrap_err().retry_after,
            Some(ms(100))
        );
        let _ = rl.check(&t, 20, t0 + ms(2_000)).unwrap();
    }

    #[test]
    fn both_short_reports_the_longer_wait() {
        let t0 = Instant::now();
        let t = tenant(Some(60), Some(60)); // 1 per second each
        let rl = limiter(&t, t0);
        let _ = rl.check(&t, 60, t0).unwrap();
        for _ in 0..59 {
            let _ = rl.check(&t, 0, t0).unwrap();
        }
        let err = rl.check(&t, 3, t0).unwrap_err();
        assert_eq!(
            (err.limit, err.retry_after),
            (Which::Tokens, Some(ms(3_000)))
        );
        let err = rl.check(&t, 0, t0 + ms(500)).unwrap_err();
        assert_eq!(
            (err.limit, err.retry_after),
            (Which::Requests, Some(ms(500)))
        );
    }

    #[test]
    fn refund_returns_unused_tokens_up_to_the_reservation() {
        let t0 = Instant::now();
        let t = tenant(None, Some(1_000));
        let rl = limiter(&t, t0);
        let r = rl.check(&t, 800, t0).unwrap();
        assert_eq!(r.tokens(), 800);
        assert_eq!(rl.check(&t, 300, t0).unwrap_err().limit, Which::Tokens);
        r.refund(500, t0);
        let r = rl.check(&t, 700, t0).unwrap();
        // A refund larger than the reservation returns only the reservation...
        r.refund(5_000, t0);
        let r = rl.check(&t, 700, t0).unwrap();
        r.refund(700, t0);
        // ...and never lifts the bucket past its capacity.
        let _ = rl.check(&t, 1_000, t0 + Duration::from_secs(600)).unwrap();
        let err = rl.check(&t, 1, t0 + Duration::from_secs(600)).unwrap_err();
        assert_eq!(err.retry_after, Some(ms(60)));
    }

    #[test]
    fn oversize_request_never_fits() {
        let t0 = Instant::now();
        let t = tenant(Some(10), Some(1_000));
        let rl = limiter(&t, t0);
        let err = rl.check(&t, 1_001, t0).unwrap_err();
        assert_eq!(
            err,
            RateLimited {
                limit: Which::Tokens,
                limit_per_minute: 1_000,
                requested: 1_001,
                retry_after: None,
            }
        );
        assert_eq!(
            err.to_string(),
            "Request too large for tokens per minute: limit 1000, requested 1001. \
             Reduce the prompt or max_tokens."
        );
        // It took nothing: the whole allowance is still there.
        let _ = rl.check(&t, 1_000, t0).unwrap();
        // "Never" outranks an empty request bucket.
        for _ in 0..9 {
            let _ = rl.check(&t, 0, t0).unwrap();
        }
        assert_eq!(rl.check(&t, 5_000, t0).unwrap_err().retry_after, None);
    }

    #[test]
    fn unlimited_and_unknown_tenants_pass() {
        let rl = RateLimiter::new(&Tenants::open());
        let now = Instant::now();
        let anon = Tenant::anonymous();
        for _ in 0..1_000 {
            let r = rl.check(&anon, u64::MAX, now).unwrap();
            r.refund(1, now);
        }
        let other = tenant(Some(1), Some(1));
        assert!(rl.check(&other, 10, now).is_ok());
    }
}
