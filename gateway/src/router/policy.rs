//! Routing policies: given the replicas that may take a request (they serve its model, are
//! healthy, not ejected and under their concurrency cap) and each one's load score, which one
//! gets it, and why (for `sluice_gateway_routing_decisions_total{policy,reason}`).
//!
//! - `round-robin`: in turn, ignoring load.
//! - `least-load`: the least loaded replica; ties are broken at random. This scans every
//!   candidate rather than sampling two (the power of two choices): with the handful of
//!   replicas a model has, two choices misses the least loaded one a third of the time (of
//!   three), and a replica whose batch just finished could sit idle while the others queued.
//!   Herding is not the risk it is for a balancer working from polled figures alone: the
//!   score counts this gateway's own requests in flight the moment they are sent, so each
//!   gateway sends one request to an idle replica, not a burst, before it stops looking idle.
//! - `prefix-affinity`: the replica that ranks first for the request's affinity key (its
//!   `x-session-id`, else its prompt prefix; see `affinity`), unless its score is more than
//!   `threshold` above the least loaded candidate's; then the next in rank that is within it
//!   (bounded load). Requests without a key fall back to least-load.

use std::sync::atomic::{AtomicUsize, Ordering};

use rand::Rng;

use crate::router::affinity;
use crate::router::remote::ReplicaUrl;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    RoundRobin,
    LeastLoad,
    PrefixAffinity,
}

impl Policy {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "round-robin" => Ok(Self::RoundRobin),
            "least-load" => Ok(Self::LeastLoad),
            "prefix-affinity" => Ok(Self::PrefixAffinity),
            other => Err(format!(
                "--policy: '{other}' is not a policy (round-robin, least-load, prefix-affinity)"
            )),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::RoundRobin => "round-robin",
            Self::LeastLoad => "least-load",
            Self::PrefixAffinity => "prefix-affinity",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    RoundRobin,
    LeastLoad,
    /// The prefix's first-ranked replica took it.
    AffinityHit,
    /// The session's first-ranked replica took it.
    SessionHit,
    /// The first-ranked replica was too loaded; a lower-ranked one took it.
    LoadFallback,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Self::RoundRobin => "round_robin",
            Self::LeastLoad => "least_load",
            Self::AffinityHit => "affinity_hit",
            Self::SessionHit => "session_hit",
            Self::LoadFallback => "load_fallback",
        }
    }
}

/// A request's affinity key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub hash: u64,
    /// From `x-session-id` rather than the prompt.
    pub session: bool,
}

#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub url: &'a ReplicaUrl,
    pub score: f64,
}

/// Chooses among `cands` (non-empty, else `None`); returns the index and the reason.
pub fn choose(
    policy: Policy,
    cands: &[Candidate<'_>],
    key: Option<Key>,
    threshold: f64,
    turn: &AtomicUsize,
    rng: &mut impl Rng,
) -> Option<(usize, Reason)> {
    if cands.is_empty() {
        return None;
    }
    match (policy, key) {
        (Policy::RoundRobin, _) => {
            let i = turn.fetch_add(1, Ordering::Relaxed) % cands.len();
            Some((i, Reason::RoundRobin))
        }
        (Policy::LeastLoad, _) | (Policy::PrefixAffinity, None) => {
            Some((least_loaded(cands, rng), Reason::LeastLoad))
        }
        (Policy::PrefixAffinity, Some(key)) => {
            let least = cands.iter().map(|c| c.score).fold(f64::INFINITY, f64::min);
            let mut ranked: Vec<(u64, usize)> = cands
                .iter()
                .enumerate()
                .map(|(i, c)| (affinity::weight(key.hash, c.url), i))
                .collect();
            ranked.sort_unstable_by(|a, b| b.cmp(a));
            let (rank, &(_, i)) = ranked
                .iter()
                .enumerate()
                .find(|(_, &(_, i))| cands[i].score <= least + threshold)
                .expect("the least loaded candidate is within any threshold ≥ 0");
            let reason = match (rank, key.session) {
                (0, true) => Reason::SessionHit,
                (0, false) => Reason::AffinityHit,
                _ => Reason::LoadFallback,
            };
            Some((i, reason))
        }
    }
}

/// The candidate with the lowest score, a tie broken uniformly at random (reservoir
/// sampling over the tied ones), so equally idle replicas share the load.
fn least_loaded(cands: &[Candidate<'_>], rng: &mut impl Rng) -> usize {
    let mut best = 0;
    let mut ties = 1u32;
    for (i, c) in cands.iter().enumerate().skip(1) {
        let low = cands[best].score;
        if c.score < low {
            best = i;
            ties = 1;
        } else if c.score == low {
            ties += 1;
            if rng.random_range(0..ties) == 0 {
                best = i;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn urls(n: usize) -> Vec<ReplicaUrl> {
        (0..n)
            .map(|i| ReplicaUrl::parse(&format!("http://r{i}:80")).unwrap())
            .collect()
    }

    fn cands<'a>(urls: &'a [ReplicaUrl], scores: &[f64]) -> Vec<Candidate<'a>> {
        urls.iter()
            .zip(scores)
            .map(|(url, &score)| Candidate { url, score })
            .collect()
    }

    #[test]
    fn round_robin_takes_turns() {
        let u = urls(3);
        let c = cands(&u, &[9.0, 0.0, 0.0]);
        let turn = AtomicUsize::new(0);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let picks: Vec<usize> = (0..6)
            .map(|_| {
                choose(Policy::RoundRobin, &c, None, 0.0, &turn, &mut rng)
                    .unwrap()
                    .0
            })
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        assert!(choose(Policy::RoundRobin, &[], None, 0.0, &turn, &mut rng).is_none());
    }

    #[test]
    fn least_load_takes_the_minimum_and_spreads_ties() {
        let u = urls(4);
        let turn = AtomicUsize::new(0);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut pick = |scores: &[f64]| {
            let c = cands(&u[..scores.len()], scores);
            choose(Policy::LeastLoad, &c, None, 0.0, &turn, &mut rng)
                .unwrap()
                .0
        };
        // Always the least loaded, wherever it sits.
        for _ in 0..50 {
            assert_eq!(pick(&[1.0, 5.0, 3.0]), 0);
            assert_eq!(pick(&[4.0, 4.0, 0.5]), 2);
            assert_eq!(pick(&[4.0, 2.0]), 1);
        }
        assert_eq!(pick(&[7.0]), 0);
        // Ties at the minimum share the requests; the loaded one gets none.
        let mut seen = [0; 4];
        for _ in 0..3000 {
            seen[pick(&[2.0, 9.0, 2.0, 2.0])] += 1;
        }
        assert_eq!(seen[1], 0, "{seen:?}");
        for i in [0, 2, 3] {
            assert!((800..1200).contains(&seen[i]), "{seen:?}");
        }
    }

    #[test]
    fn affinity_sticks_until_the_owner_is_too_loaded() {
        let u = urls(4);
        let turn = AtomicUsize::new(0);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let key = Key {
            hash: affinity::fnv1a(b"shared system prompt"),
            session: false,
        };
        let even = cands(&u, &[1.0, 1.0, 1.0, 1.0]);
        let (owner, why) = choose(
            Policy::PrefixAffinity,
            &even,
            Some(key),
            2.0,
            &turn,
            &mut rng,
        )
        .unwrap();
        assert_eq!(why, Reason::AffinityHit);
        for _ in 0..10 {
            assert_eq!(
                choose(
                    Policy::PrefixAffinity,
                    &even,
                    Some(key),
                    2.0,
                    &turn,
                    &mut rng
                )
                .unwrap(),
                (owner, Reason::AffinityHit)
            );
        }
        // The owner 3 above the least loaded (threshold 2): the next in rank within it.
        let mut scores = [1.0; 4];
        scores[owner] = 4.0;
        let loaded = cands(&u, &scores);
        let (other, why) = choose(
            Policy::PrefixAffinity,
            &loaded,
            Some(key),
            2.0,
            &turn,
            &mut rng,
        )
        .unwrap();
        assert_ne!(other, owner);
        assert_eq!(why, Reason::LoadFallback);
        // Sessions report their own reason.
        let session = Key {
            hash: affinity::session_key("s-1"),
            session: true,
        };
        assert_eq!(
            choose(
                Policy::PrefixAffinity,
                &even,
                Some(session),
                2.0,
                &turn,
                &mut rng
            )
            .unwrap()
            .1,
            Reason::SessionHit
        );
        // No key: least-load.
        assert_eq!(
            choose(Policy::PrefixAffinity, &even, None, 2.0, &turn, &mut rng)
                .unwrap()
                .1,
            Reason::LeastLoad
        );
    }
}
