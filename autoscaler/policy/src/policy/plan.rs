//! Turning a demand into replica targets: offers per variant, the mix (kept or switched),
//! node pools, and a complete [`Decision`].

use serde::{Deserialize, Serialize};

use crate::capacity::{self, Capacity, Planning, Slo, Workload};
use crate::decision::{Decision, PoolTarget, ReasonKind, Target};
use crate::mix::{self, Mix, Offer};
use crate::profile::{CapacityType, Profile};
use crate::signals::Signals;

/// Per-variant bounds a policy respects.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VariantLimits {
    pub variant: String,
    /// Never fewer replicas than this, traffic or not.
    pub min: u32,
    pub max: u32,
    /// While the model has had traffic recently, keep at least this many (a warm replica
    /// answers at once; a cold start takes minutes). Idle longer than the scale-to-zero delay,
    /// the floor falls to `min`.
    pub keep_warm: u32,
}

impl VariantLimits {
    pub fn new(variant: &str, max: u32) -> Self {
        VariantLimits {
            variant: variant.to_string(),
            min: 0,
            max,
            keep_warm: 0,
        }
    }
}

/// Every (variant, capacity type) a policy could buy, in a fixed order: on-demand then Spot
/// for each variant in the limits' order.
pub fn offer_keys(limits: &[VariantLimits]) -> Vec<(String, CapacityType)> {
    limits
        .iter()
        .flat_map(|l| {
            [CapacityType::OnDemand, CapacityType::Spot]
                .into_iter()
                .map(|c| (l.variant.clone(), c))
        })
        .collect()
}

/// Capacity at SLO of each limited variant for a workload. If no variant is eligible (every
/// prefill too slow for the TTFT target), they are computed again ignoring the TTFT share, so
/// the fleet still grows with the load; the second value says so. A variant that leaves more
/// prompts late on its own than the fastest eligible one is ruled out (see
/// [`without_slow_prefill`]).
pub fn capacities(
    profile: &Profile,
    limits: &[VariantLimits],
    w: &Workload,
    slo: &Slo,
    plan: &Planning,
) -> (Vec<Capacity>, bool) {
    let slow = SlowPrompts {
        shape: w,
        budget: &|_| capacity::SLOW_PROMPT_BUDGET,
    };
    capacities_within(profile, limits, w, slo, plan, &slow)
}

/// How [`without_slow_prefill`] rules a variant out: the share of first tokens each variant
/// may leave late with prompts it cannot prefill in time (beyond the fastest's), and the
/// request shape whose prompt tail measures it.
pub struct SlowPrompts<'a> {
    pub shape: &'a Workload,
    pub budget: &'a dyn Fn(&str) -> f64,
}

impl std::fmt::Debug for SlowPrompts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlowPrompts")
            .field("shape", self.shape)
            .finish_non_exhaustive()
    }
}

/// [`capacities`] for `w`, with variants ruled out for slow prefill as `slow` says.
pub fn capacities_within(
    profile: &Profile,
    limits: &[VariantLimits],
    w: &Workload,
    slo: &Slo,
    plan: &Planning,
    slow: &SlowPrompts<'_>,
) -> (Vec<Capacity>, bool) {
    let at = |plan: &Planning| -> Vec<Capacity> {
        limits
            .iter()
            .map(|l| {
                let v = profile
                    .variant(&l.variant)
                    .expect("limits name profile variants");
                capacity::at_slo(v, w, slo, plan)
            })
            .collect()
    };
    let caps = at(plan);
    if caps.iter().any(|c| c.requests_per_s > 0.0) {
        let caps = without_slow_prefill(profile, limits, slo, caps, slow);
        return (caps, false);
    }
    let relaxed = Planning {
        ttft_share: f64::INFINITY,
        ..*plan
    };
    (at(&relaxed), true)
}

/// `caps` less the variants whose replicas leave more than their `slow.budget`
/// ([`capacity::SLOW_PROMPT_BUDGET`] unless a policy says otherwise) of first tokens late
/// even idle ([`capacity::slow_prompt_share`] on `slow.shape`) beyond what the fastest
/// eligible variant leaves late (prompts no variant serves in time count against none). More
/// replicas of such a variant do not make its prompts faster, and the router sends long
/// prompts to any replica, so a mix holding it misses the SLO at any size: at a 200 ms TPOT
/// SLO, where the L4 is otherwise eligible, fleets of dozens of L4s met 97.7 % of
/// conversation requests where two H100s met 100 %.
fn without_slow_prefill(
    profile: &Profile,
    limits: &[VariantLimits],
    slo: &Slo,
    mut caps: Vec<Capacity>,
    slow: &SlowPrompts<'_>,
) -> Vec<Capacity> {
    let variants: Vec<_> = limits
        .iter()
        .map(|l| {
            profile
                .variant(&l.variant)
                .expect("limits name profile variants")
        })
        .collect();
    let shares: Vec<f64> = variants
        .iter()
        .map(|v| capacity::slow_prompt_share(v, slow.shape, slo))
        .collect();
    let fastest = shares
        .iter()
        .zip(&caps)
        .filter(|(_, c)| c.requests_per_s > 0.0)
        .map(|(s, _)| *s)
        .fold(f64::INFINITY, f64::min);
    for ((c, s), v) in caps.iter_mut().zip(&shares).zip(&variants) {
        if c.requests_per_s > 0.0 && s - fastest > (slow.budget)(&v.name) {
            *c = Capacity::ineligible(v);
        }
    }
    caps
}

/// Offers for the mix search, one per key of [`offer_keys`]. `allow` says per key whether it
/// may grow; a key that may not keeps its current count as its maximum (never more).
pub fn offers(
    profile: &Profile,
    limits: &[VariantLimits],
    caps: &[Capacity],
    current: &[u32],
    allow: impl Fn(&str, CapacityType) -> bool,
    floor: impl Fn(&VariantLimits) -> u32,
) -> Vec<Offer> {
    offer_keys(limits)
        .into_iter()
        .enumerate()
        .map(|(k, (name, cap))| {
            let li = k / 2;
            let l = &limits[li];
            let v = profile
                .variant(&name)
                .expect("limits name profile variants");
            let allowed = allow(&name, cap);
            // The floor applies to the on-demand key unless on-demand is not allowed.
            let floor_here = if allowed
                && (cap == CapacityType::OnDemand || !allow(&name, CapacityType::OnDemand))
            {
                floor(l)
            } else {
                0
            };
            let max = if allowed {
                l.max
            } else {
                current[k].min(l.max)
            };
            Offer {
                variant: name,
                capacity: cap,
                requests_per_s: caps[li].requests_per_s,
                price_per_hour: v.replica_price_per_hour(cap),
                min: floor_here.min(max),
                max,
            }
        })
        .collect()
}

/// Current replicas (ready, starting and pending) per key of [`offer_keys`].
pub fn current_counts(signals: &Signals, limits: &[VariantLimits]) -> Vec<u32> {
    offer_keys(limits)
        .iter()
        .map(|(n, c)| signals.provisioned(n, *c))
        .collect()
}

/// Ready replicas per key of [`offer_keys`].
pub fn ready_counts(signals: &Signals, limits: &[VariantLimits]) -> Vec<u32> {
    offer_keys(limits)
        .iter()
        .map(|(n, c)| signals.variant(n, *c).map_or(0, |v| v.ready))
        .collect()
}

/// Make before break: when the targets shrink some keys while others grow, the replicas being
/// removed keep serving until the ready capacity of what remains covers `demand` (a switch from
/// L4s to an H100 must not drop the L4s before the H100 is up). That holds for replicas the
/// capacity model values at nothing too (a variant ineligible for the mean request shape still
/// serves the requests it can). Starting replicas of a shrinking key may still be cancelled.
/// Returns whether it held anything back.
pub fn make_before_break(
    offers: &[Offer],
    current: &[u32],
    ready: &[u32],
    counts: &mut [u32],
    demand: f64,
) -> bool {
    let ready_after: f64 = offers
        .iter()
        .zip(counts.iter().zip(ready))
        .map(|(o, (&c, &r))| o.requests_per_s * f64::from(c.min(r)))
        .sum();
    let ready_now = mix::evaluate(offers, ready).requests_per_s;
    let short_after = ready_after + 1e-9 < demand;
    let loses_ready = ready_after + 1e-9 < ready_now;
    let replacing = counts.iter().zip(ready).any(|(&c, &r)| c > r);
    if !(short_after && (loses_ready || replacing)) {
        return false;
    }
    let mut held = false;
    for k in 0..counts.len() {
        if counts[k] < current[k] {
            let keep = current[k].min(ready[k]).max(counts[k]);
            held |= keep > counts[k];
            counts[k] = keep;
        }
    }
    held
}

/// While the ready replicas serve less than `demand`, the offers with every key's minimum
/// raised to its ready replicas and to those on their way (starting, pending) that the
/// shortfall needs, cheapest capacity first: replicas on their way are the quickest relief
/// there is, and a cheaper mix chosen instead would start its replicas from scratch, leaving
/// the fleet short for a whole start-up more (a switch of mix mid-ramp otherwise cancels
/// replicas minutes from ready, and can do so tick after tick). Those beyond the shortfall
/// may still be cancelled. `None` when the ready fleet covers the demand or nothing is on
/// its way.
pub fn keep_in_flight(
    offers: &[Offer],
    current: &[u32],
    ready: &[u32],
    demand: f64,
) -> Option<Vec<Offer>> {
    let ready_capacity = mix::evaluate(offers, ready).requests_per_s;
    let on_the_way = current.iter().zip(ready).any(|(&c, &r)| c > r);
    if ready_capacity + 1e-9 >= demand || !on_the_way {
        return None;
    }
    let mut order: Vec<usize> = (0..offers.len())
        .filter(|&k| offers[k].requests_per_s > 0.0)
        .collect();
    order.sort_by(|&a, &b| mix::unit_cost(&offers[a]).total_cmp(&mix::unit_cost(&offers[b])));
    let mut keep: Vec<u32> = ready.to_vec();
    let mut short = demand - ready_capacity;
    for k in order {
        while keep[k] < current[k] && short > 1e-9 {
            keep[k] += 1;
            short -= offers[k].requests_per_s;
        }
    }
    Some(
        offers
            .iter()
            .zip(&keep)
            .map(|(o, &n)| Offer {
                min: o.min.max(n.min(o.max)),
                ..o.clone()
            })
            .collect(),
    )
}

/// Seconds from asking to serving for a replica of each key of [`offer_keys`] (on a new node).
pub fn startup_times(profile: &Profile, limits: &[VariantLimits]) -> Vec<f64> {
    offer_keys(limits)
        .iter()
        .map(|(n, _)| profile.variant(n).map_or(0.0, |v| v.startup_s(true)))
        .collect()
}

/// A mix grows no replicas of a variant whose cost per request served is more than this
/// multiple of the cheapest variant's that may grow.
pub const DEAR_GROWTH_RATIO: f64 = 2.0;

/// `offers` with each variant that serves a request for more than [`DEAR_GROWTH_RATIO`]× the
/// cheapest growable variant's cost capped at its `current` count. A mix searched tick by
/// tick covers each small rise of a ramp with the replica whose price is lowest, not whose
/// cost per request is, and replicas on their way are then kept while the ready fleet is
/// short ([`keep_in_flight`]): on the `llama-3-70b` profile a diurnal ramp piled up 24
/// A100 ×4 replicas ($3.05 per thousand requests) where H100 ×2 and ×8 serve one for
/// $1.18–1.39. Dear replicas already there stay until the mix lets them go.
pub fn cap_dear_growth(offers: &[Offer], current: &[u32]) -> Vec<Offer> {
    // An offer that may not grow (Spot outside a stockout's end, say) keeps its count and is
    // no measure of what growing costs.
    let least = offers
        .iter()
        .zip(current)
        .filter(|(o, &n)| o.max > n)
        .map(|(o, _)| mix::unit_cost(o))
        .fold(f64::INFINITY, f64::min);
    offers
        .iter()
        .zip(current)
        .map(|(o, &n)| {
            let mut o = o.clone();
            if mix::unit_cost(&o) > DEAR_GROWTH_RATIO * least {
                o.max = o.max.min(n.max(o.min));
            }
            o
        })
        .collect()
}

/// The cheapest mix for `demand`, unless changing the current mix only in the direction the
/// demand moved (adding to it, or removing from it) is cheaper once the switch is paid for:
/// replicas a switch starts are billed through their start-up without serving, so the cheaper
/// mix must save that back within `amortise_s` seconds, or the current one is kept.
pub fn keep_or_switch(
    offers: &[Offer],
    current: &[u32],
    demand: f64,
    startup_s: &[f64],
    amortise_s: f64,
) -> (Mix, ReasonKind) {
    let best = mix::cheapest(offers, demand);
    let now = mix::evaluate(offers, current);
    let constrained: Vec<Offer> = offers
        .iter()
        .zip(current)
        .map(|(o, &n)| {
            let mut o = o.clone();
            let n = n.clamp(o.min, o.max.max(o.min));
            if now.requests_per_s < demand {
                o.min = n;
            } else {
                o.max = n;
            }
            o
        })
        .collect();
    let kept = mix::cheapest(&constrained, demand);
    let start_cost = |m: &Mix| -> f64 {
        m.counts
            .iter()
            .zip(current)
            .zip(offers.iter().zip(startup_s))
            .map(|((&n, &c), (o, &s))| {
                f64::from(n.saturating_sub(c)) * o.price_per_hour * s / 3600.0
            })
            .sum()
    };
    let kept_covers = kept.requests_per_s + 1e-9 >= demand.min(best.requests_per_s);
    let saving = (kept.cost_per_hour - best.cost_per_hour) * amortise_s / 3600.0;
    if kept_covers && saving <= start_cost(&best) - start_cost(&kept) + 1e-9 {
        (kept, ReasonKind::KeepMix)
    } else {
        (best, ReasonKind::CheapestMix)
    }
}

/// Fills a decision's targets (every key, zeros included) and node pools from counts per key.
pub fn fill_targets(
    decision: &mut Decision,
    profile: &Profile,
    limits: &[VariantLimits],
    counts: &[u32],
) {
    decision.targets.clear();
    decision.pools.clear();
    for ((name, cap), &n) in offer_keys(limits).into_iter().zip(counts) {
        let v = profile
            .variant(&name)
            .expect("limits name profile variants");
        decision.pools.push(PoolTarget {
            variant: name.clone(),
            capacity: cap,
            nodes: mix::nodes_for(v, n),
        });
        decision.targets.push(Target {
            variant: name,
            capacity: cap,
            replicas: n,
        });
    }
}
