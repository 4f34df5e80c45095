//! From the policy's targets to replicas per `ServingPool` variant, with fallback by priority.
//!
//! The policy answers per (profile variant, capacity type); a `ServingPool` may list several
//! Deployments for one of those, and some may be unavailable for a while (out of stock, or Spot
//! just preempted). This module spreads each target over its entries by priority, each up to
//! its maximum, and moves what an entry cannot take to the next available entry by priority,
//! converted by their capacities at SLO (one H100 replica serves what several L4s do). It is
//! pure so every fallback rule is unit-tested without a cluster.

use sluice_policy::decision::{Decision, Target};
use sluice_policy::profile::CapacityType;

/// One `ServingPool` variant as allocation sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub name: String,
    pub profile_variant: String,
    pub capacity: CapacityType,
    pub priority: i32,
    pub min: u32,
    pub max: u32,
    /// Whether new replicas may be asked of it now.
    pub available: bool,
    /// For an unavailable entry: the replicas it keeps (ready, not preempted).
    pub keep: u32,
    /// Requests/s one replica serves at SLO for the current workload (1.0 when unknown, so
    /// replicas convert one for one).
    pub replica_rps: f64,
}

/// Desired replicas per entry (in the entries' order) and a sentence per move.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allocation {
    pub desired: Vec<u32>,
    pub notes: Vec<String>,
}

/// Spreads the decision's targets over the entries.
pub fn allocate(decision: &Decision, entries: &[Entry]) -> Allocation {
    let mut desired = vec![0u32; entries.len()];
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|&i| (entries[i].priority, i));
    let mut overflow_rps = 0.0;
    let mut notes = Vec::new();
    for t in decision.targets.iter().filter(|t| t.replicas > 0) {
        let (left, rps) = place(t, entries, &order, &mut desired);
        if left > 0 {
            overflow_rps += f64::from(left) * rps;
            notes.push(format!(
                "{left} {} {} replicas cannot be placed on their own variants: moved by priority",
                t.variant,
                t.capacity.as_str()
            ));
        }
    }
    notes.extend(move_overflow(entries, &order, &mut desired, overflow_rps));
    for (i, e) in entries.iter().enumerate() {
        if e.available {
            desired[i] = desired[i].max(e.min).min(e.max);
        }
    }
    Allocation { desired, notes }
}

/// Places target `t` on its own entries by priority, each up to what it may hold: the entries
/// for exactly its (variant, capacity), else the variant bought the other way. The replicas
/// left over, and the requests/s one of them serves.
fn place(t: &Target, entries: &[Entry], order: &[usize], desired: &mut [u32]) -> (u32, f64) {
    let cap = |e: &Entry| {
        if e.available {
            e.max
        } else {
            e.keep.min(e.max)
        }
    };
    let mut mine: Vec<usize> = order
        .iter()
        .copied()
        .filter(|&i| entries[i].profile_variant == t.variant && entries[i].capacity == t.capacity)
        .collect();
    if mine.is_empty() {
        mine = order
            .iter()
            .copied()
            .filter(|&i| entries[i].profile_variant == t.variant)
            .collect();
    }
    let mut left = t.replicas;
    for &i in &mine {
        let take = left.min(cap(&entries[i]).saturating_sub(desired[i]));
        desired[i] += take;
        left -= take;
    }
    let rps = mine
        .first()
        .map_or(1.0, |&i| entries[i].replica_rps)
        .max(1e-9);
    (left, rps)
}

/// Demand no entry of its own could take goes to the next available entry by priority,
/// converted by capacity at SLO. A sentence per move, and one if some has nowhere to go.
fn move_overflow(
    entries: &[Entry],
    order: &[usize],
    desired: &mut [u32],
    mut overflow_rps: f64,
) -> Vec<String> {
    let mut notes = Vec::new();
    for &i in order {
        if overflow_rps <= 1e-9 {
            break;
        }
        let e = &entries[i];
        if !e.available {
            continue;
        }
        let room = e.max.saturating_sub(desired[i]);
        if room == 0 {
            continue;
        }
        let rps = e.replica_rps.max(1e-9);
        let need = (overflow_rps / rps - 1e-9).ceil().max(1.0) as u32;
        let take = need.min(room);
        desired[i] += take;
        overflow_rps -= f64::from(take) * rps;
        notes.push(format!("{}: +{take} replicas of demand moved here", e.name));
    }
    if overflow_rps > 1e-9 {
        notes.push(format!(
            "{overflow_rps:.2} req/s of demand has nowhere to go: every available variant is at its maximum"
        ));
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policy::decision::Target;

    fn entry(name: &str, pv: &str, cap: CapacityType, prio: i32, max: u32, rps: f64) -> Entry {
        Entry {
            name: name.into(),
            profile_variant: pv.into(),
            capacity: cap,
            priority: prio,
            min: 0,
            max,
            available: true,
            keep: 0,
            replica_rps: rps,
        }
    }

    fn decision(targets: &[(&str, CapacityType, u32)]) -> Decision {
        Decision {
            targets: targets
                .iter()
                .map(|(v, c, n)| Target {
                    variant: v.to_string(),
                    capacity: *c,
                    replicas: *n,
                })
                .collect(),
            ..Decision::default()
        }
    }

    use CapacityType::{OnDemand, Spot};

    #[test]
    fn targets_land_on_their_own_entries() {
        let es = [
            entry("l4-spot", "l4", Spot, 0, 10, 2.0),
            entry("l4", "l4", OnDemand, 1, 10, 2.0),
        ];
        let a = allocate(&decision(&[("l4", Spot, 3), ("l4", OnDemand, 1)]), &es);
        assert_eq!(a.desired, vec![3, 1]);
        assert!(a.notes.is_empty());
    }

    #[test]
    fn a_capacity_type_without_an_entry_uses_the_other() {
        let es = [entry("l4", "l4", OnDemand, 0, 10, 2.0)];
        let a = allocate(&decision(&[("l4", Spot, 4)]), &es);
        assert_eq!(a.desired, vec![4]);
    }

    #[test]
    fn an_unavailable_entry_keeps_its_ready_and_moves_the_rest_by_priority() {
        let mut spot = entry("l4-spot", "l4", Spot, 0, 10, 2.0);
        spot.available = false;
        spot.keep = 1;
        let es = [
            spot,
            entry("h100", "h100", OnDemand, 2, 10, 8.0),
            entry("l4", "l4", OnDemand, 1, 10, 2.0),
        ];
        let a = allocate(&decision(&[("l4", Spot, 5)]), &es);
        // 4 L4 replicas' worth (8 req/s) go to the L4 on-demand entry (priority 1), not H100.
        assert_eq!(a.desired, vec![1, 0, 4]);
        assert_eq!(a.notes.len(), 2, "{:?}", a.notes);
    }

    #[test]
    fn overflow_converts_by_capacity_and_respects_maxima() {
        let es = [
            entry("l4", "l4", OnDemand, 0, 2, 2.0),
            entry("h100", "h100", OnDemand, 1, 1, 8.0),
        ];
        // 6 L4s wanted, 2 fit; 8 req/s left = one H100; the rest has nowhere to go.
        let a = allocate(&decision(&[("l4", OnDemand, 8)]), &es);
        assert_eq!(a.desired, vec![2, 1]);
        assert!(a.notes.last().unwrap().contains("nowhere"), "{:?}", a.notes);
    }

    #[test]
    fn minimums_hold_for_available_entries_only() {
        let mut a_ = entry("a", "l4", OnDemand, 0, 5, 1.0);
        a_.min = 2;
        let mut b = entry("b", "h100", OnDemand, 1, 5, 1.0);
        b.min = 1;
        b.available = false;
        b.keep = 0;
        let a = allocate(&decision(&[]), &[a_, b]);
        assert_eq!(a.desired, vec![2, 0]);
    }
}
