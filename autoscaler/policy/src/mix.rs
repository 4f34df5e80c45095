//! The cheapest mix of replicas that serves a demand at SLO, and node packing.
//!
//! Each (variant, capacity type) the policy may buy is an [`Offer`]: what one replica serves at
//! SLO and what it costs. The mix is a small integer program (minimise Σ nᵢ·priceᵢ subject to
//! Σ nᵢ·capacityᵢ ≥ demand and minᵢ ≤ nᵢ ≤ maxᵢ), solved exactly by depth-first search over the
//! offers sorted by cost per request, pruned by a lower bound: the remaining demand at the best
//! remaining cost per request. Fleets are tens of replicas and a few offers, so this is
//! microseconds, and exact beats a greedy fill that would round up to a whole H100 where two L4s
//! suffice.

use serde::{Deserialize, Serialize};

use crate::profile::{CapacityType, Variant};

/// One thing the mix may buy.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Offer {
    pub variant: String,
    pub capacity: CapacityType,
    /// Requests/s one replica serves at SLO (zero if ineligible).
    pub requests_per_s: f64,
    pub price_per_hour: f64,
    pub min: u32,
    pub max: u32,
}

/// Replica counts per offer (same order as the offers), with their totals.
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    pub counts: Vec<u32>,
    pub cost_per_hour: f64,
    pub requests_per_s: f64,
}

/// Evaluates given counts against the offers.
pub fn evaluate(offers: &[Offer], counts: &[u32]) -> Mix {
    let mut cost = 0.0;
    let mut rps = 0.0;
    for (o, &n) in offers.iter().zip(counts) {
        cost += o.price_per_hour * f64::from(n);
        rps += o.requests_per_s * f64::from(n);
    }
    Mix {
        counts: counts.to_vec(),
        cost_per_hour: cost,
        requests_per_s: rps,
    }
}

/// What an offer's capacity costs per request/s and hour; infinite for one that serves
/// nothing.
pub fn unit_cost(o: &Offer) -> f64 {
    if o.requests_per_s > 0.0 {
        o.price_per_hour / o.requests_per_s
    } else {
        f64::INFINITY
    }
}

/// The cheapest counts within the offers' bounds serving `demand` requests/s; if even every
/// offer at its max falls short, the max of every eligible offer (the best there is).
pub fn cheapest(offers: &[Offer], demand: f64) -> Mix {
    let mut order: Vec<usize> = (0..offers.len()).collect();
    let unit = unit_cost;
    order.sort_by(|&a, &b| unit(&offers[a]).total_cmp(&unit(&offers[b])));
    let all_max: Vec<u32> = offers
        .iter()
        .map(|o| {
            if o.requests_per_s > 0.0 {
                o.max.max(o.min)
            } else {
                o.min
            }
        })
        .collect();
    if evaluate(offers, &all_max).requests_per_s < demand {
        return evaluate(offers, &all_max);
    }
    let mut search = Search {
        offers,
        order: &order,
        // Best remaining cost per request from position i on (offers are sorted, so it is
        // the unit cost at i).
        best_unit: order.iter().map(|&i| unit(&offers[i])).collect(),
        counts: offers.iter().map(|o| o.min).collect(),
        best: None,
        demand,
    };
    let base = evaluate(offers, &search.counts);
    search.dfs(0, base.cost_per_hour, base.requests_per_s);
    let counts = search.best.map(|(_, c)| c).unwrap_or(all_max);
    evaluate(offers, &counts)
}

struct Search<'a> {
    offers: &'a [Offer],
    order: &'a [usize],
    best_unit: Vec<f64>,
    counts: Vec<u32>,
    best: Option<(f64, Vec<u32>)>,
    demand: f64,
}

/// Demand met within floating-point noise.
const EPS: f64 = 1e-9;

impl Search<'_> {
    fn dfs(&mut self, pos: usize, cost: f64, served: f64) {
        let best_cost = self.best.as_ref().map_or(f64::INFINITY, |b| b.0);
        let remaining = (self.demand - served).max(0.0);
        if remaining <= EPS {
            if cost < best_cost - EPS {
                self.best = Some((cost, self.counts.clone()));
            }
            return;
        }
        if pos == self.order.len() {
            return;
        }
        let lower = cost + remaining * self.best_unit[pos];
        if lower >= best_cost - EPS {
            return;
        }
        let i = self.order[pos];
        let o = &self.offers[i];
        if o.requests_per_s <= 0.0 {
            return self.dfs(pos + 1, cost, served);
        }
        let needed = ((remaining / o.requests_per_s) - EPS).ceil().max(0.0) as u32;
        let extra_max = o.max.saturating_sub(o.min).min(needed);
        // Most of the cheapest offer first: finds a good bound early.
        for extra in (0..=extra_max).rev() {
            self.counts[i] = o.min + extra;
            let e = f64::from(extra);
            self.dfs(
                pos + 1,
                cost + e * o.price_per_hour,
                served + e * o.requests_per_s,
            );
        }
        self.counts[i] = o.min;
    }
}

/// Nodes a pool needs for `replicas` of a variant: gangs whole on a node, so
/// `⌈replicas / ⌊GPUs per node ÷ GPUs per replica⌋⌉`.
pub fn nodes_for(v: &Variant, replicas: u32) -> u32 {
    replicas.div_ceil(v.replicas_per_node().max(1))
}

/// Where a gang of `gpus` goes among nodes with `free` GPUs each: the fullest node it fits on
/// (best fit keeps whole nodes free for large gangs), or `None` if it needs a new node.
pub fn place_gang(free: &[u32], gpus: u32) -> Option<usize> {
    free.iter()
        .enumerate()
        .filter(|(_, &f)| f >= gpus)
        .min_by_key(|(_, &f)| f)
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    fn offer(name: &str, rps: f64, price: f64) -> Offer {
        Offer {
            variant: name.into(),
            capacity: CapacityType::OnDemand,
            requests_per_s: rps,
            price_per_hour: price,
            min: 0,
            max: 100,
        }
    }

    /// Exhaustive search over small counts, to check the branch and bound against.
    fn brute(offers: &[Offer], demand: f64) -> f64 {
        let mut best = f64::INFINITY;
        for a in 0..=30u32 {
            for b in 0..=30u32 {
                let m = evaluate(offers, &[a, b]);
                if m.requests_per_s >= demand - EPS {
                    best = best.min(m.cost_per_hour);
                }
            }
        }
        best
    }

    #[test]
    fn cheapest_mix_matches_exhaustive_search() {
        // A big efficient replica and a small, pricier-per-request one.
        let offers = [offer("big", 16.0, 9.88), offer("small", 0.9, 0.842)];
        for demand in [0.5, 1.0, 5.0, 15.9, 16.5, 17.9, 20.0, 33.0, 40.0] {
            let m = cheapest(&offers, demand);
            assert!(m.requests_per_s >= demand - EPS, "{demand}");
            assert!(
                (m.cost_per_hour - brute(&offers, demand)).abs() < 1e-9,
                "{demand}: {m:?}"
            );
        }
        // Small demand takes the small replica, not a whole big one.
        assert_eq!(cheapest(&offers, 0.5).counts, [0, 1]);
        // Just above one big replica: topping up with small ones beats a second big one.
        assert_eq!(cheapest(&offers, 17.0).counts, [1, 2]);
    }

    #[test]
    fn bounds_are_respected_and_shortfall_returns_everything() {
        let mut offers = [offer("big", 16.0, 9.88), offer("small", 0.9, 0.842)];
        offers[0].max = 1;
        offers[1].min = 2;
        let m = cheapest(&offers, 30.0);
        assert_eq!(m.counts, [1, 16]);
        offers[1].max = 3;
        let m = cheapest(&offers, 30.0);
        assert_eq!(m.counts, [1, 3]);
        assert!(m.requests_per_s < 30.0);
        // Ineligible offers stay at their minimum.
        let offers = [offer("x", 0.0, 1.0), offer("y", 1.0, 1.0)];
        assert_eq!(cheapest(&offers, 2.5).counts, [0, 3]);
        assert_eq!(cheapest(&offers, 0.0).counts, [0, 0]);
    }

    #[test]
    fn gangs_pack_whole_onto_nodes() {
        let p = Profile::load("llama-3-8b").unwrap();
        let gang = p.variant("nvidia-h100-80gb-x8").unwrap();
        assert_eq!(nodes_for(gang, 3), 3);
        let mut v = gang.clone();
        v.gpus_per_replica = 3;
        // Two 3-GPU gangs per 8-GPU node; the two spare GPUs cannot hold a third.
        assert_eq!(v.replicas_per_node(), 2);
        assert_eq!(nodes_for(&v, 5), 3);
        assert_eq!(nodes_for(&v, 0), 0);
        // Best fit: the fullest node that still fits, never a split gang.
        assert_eq!(place_gang(&[8, 3, 4], 3), Some(1));
        assert_eq!(place_gang(&[2, 2, 2], 3), None);
        assert_eq!(place_gang(&[8, 5], 8), Some(0));
    }
}
