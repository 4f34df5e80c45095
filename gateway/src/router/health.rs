//! Whether a replica may take requests: passive outlier ejection from request outcomes, and
//! the verdict of active health checks.
//!
//! - Passive: `eject_after` consecutive failures (a failed connect, a 502/503, a timeout, a
//!   broken stream) eject the replica for `base · 2^(k−1)` (capped at `max`), where `k` counts
//!   ejections since the replica last served a request well. A success resets both counts. A
//!   429 is not a failure: an overloaded replica is healthy, it is just full.
//! - Active: [`CHECKS_TO_DOWN`] failed checks in a row mark the replica down (one slow answer
//!   on a busy machine is not a death), until a check passes. A check that passes after the
//!   replica was down also lifts any ejection: the process answering now is usually a
//!   restarted one, and its predecessor's failures say nothing about it. A dead process is
//!   also ejected passively by the requests that fail on it, usually sooner.
//!
//! Pure state with explicit `Instant`s, so every rule is tested without sleeping.

use std::time::{Duration, Instant};

/// Consecutive failed health checks that mark a replica down.
pub const CHECKS_TO_DOWN: u32 = 2;

#[derive(Debug, Clone, Copy)]
pub struct EjectionPolicy {
    pub eject_after: u32,
    pub base: Duration,
    pub max: Duration,
}

impl Default for EjectionPolicy {
    fn default() -> Self {
        Self {
            eject_after: 3,
            base: Duration::from_secs(1),
            max: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Health {
    policy: EjectionPolicy,
    consecutive_failures: u32,
    ejections: u32,
    ejected_until: Option<Instant>,
    /// The active checks' verdict; `None` before the first.
    up: Option<bool>,
    failed_checks: u32,
}

/// What a recorded outcome changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    None,
    Ejected(Duration),
    Down,
    Up,
}

impl Health {
    pub fn new(policy: EjectionPolicy) -> Self {
        Self {
            policy,
            consecutive_failures: 0,
            ejections: 0,
            ejected_until: None,
            up: None,
            failed_checks: 0,
        }
    }

    /// May take requests at `now`: the last check passed and no ejection is in force.
    pub fn eligible(&self, now: Instant) -> bool {
        self.up == Some(true) && self.ejected_until.is_none_or(|t| now >= t)
    }

    pub fn is_up(&self) -> bool {
        self.up == Some(true)
    }

    pub fn is_ejected(&self, now: Instant) -> bool {
        self.ejected_until.is_some_and(|t| now < t)
    }

    pub fn success(&mut self) {
        self.consecutive_failures = 0;
        self.ejections = 0;
        self.ejected_until = None;
    }

    pub fn failure(&mut self, now: Instant) -> Transition {
        // Requests that were already in flight when the replica was ejected say nothing new.
        if self.is_ejected(now) {
            return Transition::None;
        }
        self.consecutive_failures += 1;
        if self.consecutive_failures < self.policy.eject_after {
            return Transition::None;
        }
        self.consecutive_failures = 0;
        self.ejections += 1;
        let factor = 1u32 << (self.ejections - 1).min(16);
        let period = self.policy.base.saturating_mul(factor).min(self.policy.max);
        self.ejected_until = Some(now + period);
        Transition::Ejected(period)
    }

    /// Records an active check.
    pub fn checked(&mut self, ok: bool) -> Transition {
        let was = self.up;
        if ok {
            self.failed_checks = 0;
        } else {
            self.failed_checks += 1;
            if was == Some(true) && self.failed_checks < CHECKS_TO_DOWN {
                return Transition::None;
            }
        }
        self.up = Some(ok);
        match (was, ok) {
            (Some(true), true) | (Some(false), false) => Transition::None,
            (None, false) | (Some(true), false) => Transition::Down,
            (_, true) => {
                if was == Some(false) {
                    self.success();
                }
                Transition::Up
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> Health {
        let mut h = Health::new(EjectionPolicy {
            eject_after: 2,
            base: Duration::from_secs(1),
            max: Duration::from_secs(3),
        });
        assert_eq!(h.checked(true), Transition::Up);
        h
    }

    #[test]
    fn consecutive_failures_eject_for_a_growing_capped_period() {
        let t = Instant::now();
        let mut h = health();
        assert!(h.eligible(t));
        assert_eq!(h.failure(t), Transition::None);
        assert_eq!(h.failure(t), Transition::Ejected(Duration::from_secs(1)));
        assert!(!h.eligible(t + Duration::from_millis(999)));
        // Failures while ejected (in-flight requests ending badly) do not extend it.
        assert_eq!(h.failure(t), Transition::None);
        let t1 = t + Duration::from_secs(1);
        assert!(h.eligible(t1));
        h.failure(t1);
        assert_eq!(h.failure(t1), Transition::Ejected(Duration::from_secs(2)));
        let t2 = t1 + Duration::from_secs(2);
        h.failure(t2);
        assert_eq!(h.failure(t2), Transition::Ejected(Duration::from_secs(3)));
        // A success resets the growth.
        let t3 = t2 + Duration::from_secs(3);
        h.success();
        h.failure(t3);
        assert_eq!(h.failure(t3), Transition::Ejected(Duration::from_secs(1)));
    }

    #[test]
    fn a_success_between_failures_resets_the_count() {
        let t = Instant::now();
        let mut h = health();
        h.failure(t);
        h.success();
        assert_eq!(h.failure(t), Transition::None);
        assert!(h.eligible(t));
    }

    #[test]
    fn checks_mark_down_and_a_recovery_lifts_the_ejection() {
        let t = Instant::now();
        let mut h = Health::new(EjectionPolicy::default());
        assert!(!h.eligible(t), "not eligible before the first check");
        assert_eq!(h.checked(false), Transition::Down);
        assert_eq!(h.checked(false), Transition::None);
        assert_eq!(h.checked(true), Transition::Up);
        for _ in 0..3 {
            h.failure(t);
        }
        assert!(!h.eligible(t));
        // Still up by checks: the ejection stays.
        assert_eq!(h.checked(true), Transition::None);
        assert!(!h.eligible(t));
        // One failed check is not enough to go down.
        assert_eq!(h.checked(false), Transition::None);
        assert!(h.is_up());
        assert_eq!(h.checked(false), Transition::Down);
        assert_eq!(h.checked(true), Transition::Up);
        assert!(h.eligible(t), "a restarted replica starts clean");
        assert_eq!(h.checked(false), Transition::None);
        assert_eq!(h.checked(true), Transition::None);
        assert_eq!(
            h.checked(false),
            Transition::None,
            "the count restarts after a pass"
        );
    }
}
