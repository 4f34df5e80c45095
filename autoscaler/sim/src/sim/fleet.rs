//! The simulated fleet: node pools, replicas on them, start-up delays, billing, and applying a
//! decision's targets (the simulator's actuator).
//!
//! A new replica goes on the fullest node of its pool with room for its whole gang, else on a
//! new node; it serves after the node is up plus image pull and model load. Removing a replica
//! cancels one still starting (newest first) or drains the ready one holding the least work.
//! A node is billed from creation until its last replica is gone, then released at once.

use sluice_policy::mix;
use sluice_policy::profile::{CapacityType, Variant};

use crate::sim::replica::{Phase, Replica};

#[derive(Debug, Clone)]
pub struct Node {
    pub key: usize,
    pub free_gpus: u32,
    pub created_s: f64,
    pub ready_s: f64,
    pub released_s: Option<f64>,
    /// A Spot reclaim notice was received.
    pub doomed: bool,
}

/// One (variant, capacity type) the fleet can run.
#[derive(Debug, Clone)]
pub struct Pool {
    pub variant: Variant,
    pub capacity: CapacityType,
}

#[derive(Debug, Clone, Default)]
pub struct Billing {
    pub cost_usd: f64,
    pub gpu_hours: f64,
}

#[derive(Debug)]
pub struct Fleet {
    pub pools: Vec<Pool>,
    pub nodes: Vec<Node>,
    pub replicas: Vec<Replica>,
    pub billing: Billing,
    /// Nodes are billed from here on ([`Fleet::bill_from`]).
    billed_from_s: f64,
}

/// What the actuator did, for the event loop to schedule.
#[derive(Debug, Default)]
pub struct Applied {
    /// Replicas created, with the time they become ready.
    pub started: Vec<(usize, f64)>,
    /// New nodes (for Spot preemption draws).
    pub new_nodes: Vec<usize>,
    /// Replicas put into draining (may need retiring now if empty).
    pub draining: Vec<usize>,
    /// (key, changed) pairs: a scale event per key whose count changed.
    pub changed_keys: usize,
}

impl Fleet {
    pub fn new(pools: Vec<Pool>) -> Fleet {
        Fleet {
            pools,
            nodes: Vec::new(),
            replicas: Vec::new(),
            billing: Billing::default(),
            billed_from_s: f64::NEG_INFINITY,
        }
    }

    /// Starts the bill afresh at `at`: what was billed is dropped, nodes up are billed from
    /// `at` (a run's warm-up is not its cost).
    pub fn bill_from(&mut self, at: f64) {
        self.billing = Billing::default();
        self.billed_from_s = at;
    }

    /// Replicas of a key that count toward its target: starting or ready.
    pub fn live(&self, key: usize) -> impl Iterator<Item = usize> + '_ {
        self.replicas
            .iter()
            .enumerate()
            .filter(move |(_, r)| {
                r.key == key && matches!(r.phase, Phase::Starting { .. } | Phase::Ready)
            })
            .map(|(i, _)| i)
    }

    /// Creates a replica of `key` at `now`; `warm` makes it (and a new node) ready at once,
    /// for the fleet a run starts with.
    pub fn add_replica(
        &mut self,
        key: usize,
        now: f64,
        warm: bool,
        applied: &mut Applied,
    ) -> usize {
        let pool = &self.pools[key];
        let gang = pool.variant.gpus_per_replica;
        let free: Vec<u32> = self
            .nodes
            .iter()
            .map(|n| {
                if n.key == key && n.released_s.is_none() && !n.doomed {
                    n.free_gpus
                } else {
                    0
                }
            })
            .collect();
        let node = match mix::place_gang(&free, gang) {
            Some(i) => i,
            None => {
                let ready_s = if warm {
                    now
                } else {
                    now + pool.variant.startup.node_provision_s
                };
                self.nodes.push(Node {
                    key,
                    free_gpus: pool.variant.gpus_per_node,
                    created_s: now,
                    ready_s,
                    released_s: None,
                    doomed: false,
                });
                applied.new_nodes.push(self.nodes.len() - 1);
                self.nodes.len() - 1
            }
        };
        self.nodes[node].free_gpus -= gang;
        let v = &self.pools[key].variant;
        let ready_s = if warm {
            now
        } else {
            self.nodes[node].ready_s.max(now) + v.startup.image_pull_s + v.startup.model_load_s
        };
        let mut r = Replica::new(key, node, v, ready_s, now);
        if warm {
            r.phase = Phase::Ready;
        }
        self.replicas.push(r);
        let id = self.replicas.len() - 1;
        applied.started.push((id, ready_s));
        id
    }

    /// Frees a replica's GPUs and releases its node if empty.
    pub fn retire(&mut self, id: usize, now: f64) {
        let r = &mut self.replicas[id];
        if r.phase != Phase::Gone {
            r.phase = Phase::Gone;
        }
        let gang = self.pools[r.key].variant.gpus_per_replica;
        let node = r.node;
        let n = &mut self.nodes[node];
        n.free_gpus += gang;
        let all_free = n.free_gpus == self.pools[n.key].variant.gpus_per_node;
        if all_free && n.released_s.is_none() {
            self.release_node(node, now);
        }
    }

    pub fn release_node(&mut self, node: usize, now: f64) {
        let n = &mut self.nodes[node];
        if n.released_s.is_some() {
            return;
        }
        n.released_s = Some(now);
        let pool = &self.pools[n.key];
        let hours = (now - n.created_s.max(self.billed_from_s)).max(0.0) / 3600.0;
        self.billing.cost_usd += hours * pool.variant.node_price_per_hour(pool.capacity);
        self.billing.gpu_hours += hours * f64::from(pool.variant.gpus_per_node);
    }

    /// Brings each key's live replicas to its target.
    pub fn apply(&mut self, targets: &[u32], now: f64) -> Applied {
        let mut applied = Applied::default();
        for (key, &target) in targets.iter().enumerate() {
            let live: Vec<usize> = self.live(key).collect();
            let n = live.len() as u32;
            if target == n {
                continue;
            }
            applied.changed_keys += 1;
            if target > n {
                for _ in n..target {
                    self.add_replica(key, now, false, &mut applied);
                }
                continue;
            }
            // Cancel starting replicas first (newest first), then drain the least loaded.
            let mut starting_first: Vec<usize> = live
                .iter()
                .copied()
                .filter(|&i| !self.replicas[i].is_ready())
                .collect();
            starting_first.sort_by(|a, b| b.cmp(a));
            let mut ready: Vec<usize> = live
                .iter()
                .copied()
                .filter(|&i| self.replicas[i].is_ready())
                .collect();
            ready.sort_by_key(|&i| self.replicas[i].seqs());
            for id in starting_first
                .into_iter()
                .chain(ready)
                .take((n - target) as usize)
            {
                if self.replicas[id].is_ready() {
                    self.replicas[id].phase = Phase::Draining;
                    applied.draining.push(id);
                } else {
                    self.retire(id, now);
                }
            }
        }
        applied
    }

    /// Releases every node still up, at the end of the run.
    pub fn close(&mut self, now: f64) {
        for i in 0..self.nodes.len() {
            self.release_node(i, now);
        }
    }
}
