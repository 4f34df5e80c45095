//! The discrete-event simulator: a trace through a gateway queue, least-load routing and
//! replicas batching by the profile's model, scaled by a [`Policy`] every tick.
//!
//! - [`replica`]: one replica's batching in closed form between events.
//! - [`fleet`]: nodes, replicas, start-up delays, billing; the simulator's actuator.
//! - [`gateway`]: the central queue and least-load routing.
//! - [`observe`]: the windows that become each tick's [`Signals`](sluice_policy::signals::Signals).
//! - [`warm`]: the warm-up a policy that acts on what it observes gets before the cut.
//! - [`run`](self::run()): the event loop.
//!
//! Events are arrivals (read in order from the trace), replica completions (one pending per
//! replica, invalidated by an epoch when its batch changes), replicas becoming ready, policy
//! ticks, and Spot reclaim notices and kills. Everything is deterministic for a seed.

pub mod fleet;
pub mod gateway;
pub mod observe;
pub mod replica;
pub mod warm;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use sluice_policy::capacity::{self, Planning, Slo};
use sluice_policy::decision::Decision;
use sluice_policy::policy::plan::offer_keys;
use sluice_policy::policy::{Policy, VariantLimits};
use sluice_policy::profile::{CapacityType, Profile, Variant};
use sluice_policy::timeline::Request;

use fleet::{Fleet, Pool};
use gateway::Gateway;
pub use gateway::QueueLimits;
use observe::Observer;
use replica::{Ord64, Phase, Progress};

/// How the fleet behaves, independent of the policy.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SimConfig {
    pub tick_s: f64,
    /// Long window of the arrival rate in the signals.
    pub window_s: f64,
    pub short_window_s: f64,
    pub latency_window_s: f64,
    /// The request shape's wider window, for when the long one holds few requests
    /// ([`Arrivals::wide`](sluice_policy::signals::Arrivals::wide)).
    #[serde(default = "shape_window_s")]
    pub shape_window_s: f64,
    /// Spot reclaims per node-hour (exponential lifetimes).
    pub spot_preemptions_per_node_hour: f64,
    /// Notice before a reclaimed Spot node disappears (GCE gives 30 s).
    pub spot_notice_s: f64,
    /// Requests still unfinished this long after the last arrival are counted as failed.
    pub max_drain_s: f64,
    /// The gateway runs with `--queue-late-after` at this share of the TTFT target, as
    /// deploy/k8s sets it (1.5 s for 2 s, leaving a quarter for the prefill once admitted):
    /// requests that waited longer yield to those still on time. `None`: first come, first
    /// served.
    #[serde(default = "queue_late_after_share")]
    pub queue_late_after_share: Option<f64>,
    /// The gateway's queue bound and timeouts ([`QueueLimits`]; `sluice serve`'s defaults).
    #[serde(default)]
    pub queue_limits: QueueLimits,
    /// The replicas run `sluice serve --max-prompt-tokens`: a longer prompt is refused (a
    /// 400) before it takes any prefill. The signals count its arrival and none of its
    /// tokens ([`observe`]). `None`: no such bound.
    #[serde(default)]
    pub max_prompt_tokens: Option<u32>,
    /// Each variant's replicas run their own `--max-prompt-tokens`: the longest prompt one
    /// serves alone within the SLO ([`Profile::longest_prompt_served`]), as `profiles`
    /// prints it. The gateway sends a prompt only to ready replicas that take it and refuses
    /// it while none does; the controller counts a refused prompt some variant serves in the
    /// request shape (the gateway's refused-prompt histogram). Not with `max_prompt_tokens`.
    #[serde(default)]
    pub per_variant_prompt_bounds: bool,
    pub seed: u64,
    /// Keep every tick's decision in [`Run::decisions`] (`simulate --decisions`); off for the
    /// oracle's replays and the suite, which read only the outcomes.
    #[serde(skip)]
    pub record_decisions: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            tick_s: 15.0,
            window_s: 60.0,
            short_window_s: 10.0,
            latency_window_s: 60.0,
            shape_window_s: shape_window_s(),
            spot_preemptions_per_node_hour: 0.0,
            spot_notice_s: 30.0,
            max_drain_s: 1800.0,
            queue_late_after_share: queue_late_after_share(),
            queue_limits: QueueLimits::default(),
            max_prompt_tokens: None,
            per_variant_prompt_bounds: false,
            seed: 1,
            record_decisions: false,
        }
    }
}

impl SimConfig {
    /// Whether the replicas' `--max-prompt-tokens` refuses `r`.
    pub fn refuses_prompt(&self, r: &Request) -> bool {
        self.max_prompt_tokens.is_some_and(|m| r.prompt_tokens > m)
    }

    /// The longest prompt a replica of `v` takes: its variant's bound, the one bound, or
    /// none.
    fn prompt_bound(&self, profile: &Profile, v: &Variant, slo: &Slo) -> u32 {
        if self.per_variant_prompt_bounds {
            return profile.longest_prompt_served(v, slo).floor() as u32;
        }
        self.max_prompt_tokens.unwrap_or(u32::MAX)
    }
}

fn shape_window_s() -> f64 {
    sluice_policy::signals::SHAPE_WINDOW_S
}

fn queue_late_after_share() -> Option<f64> {
    Some(0.75)
}

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub arrival_s: f64,
    /// Seconds to the first token; `None` if none came.
    pub ttft_s: Option<f64>,
    /// Mean seconds per output token after the first; `None` if it did not finish.
    pub tpot_s: Option<f64>,
    /// Refused (longer than any replica holds), or its stream cut by a Spot reclaim.
    pub failed: bool,
    /// Some variant, alone and idle, would serve it within the SLO
    /// ([`feasibility`](crate::feasibility)).
    pub feasible: bool,
}

/// One tick of the fleet, for the plot and the JSON report's timelines.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    pub time_s: f64,
    pub arrival_rate: f64,
    /// Ready replicas per variant (both capacity types), in the profile's variant order.
    pub ready: Vec<u32>,
    /// Starting or pending, per variant.
    pub starting: Vec<u32>,
    pub queue: u64,
}

/// A policy's run.
#[derive(Debug, Clone)]
pub struct Run {
    pub policy: String,
    pub outcomes: Vec<Outcome>,
    pub cost_usd: f64,
    pub gpu_hours: f64,
    pub scale_events: usize,
    pub replicas_started: usize,
    pub spot_preemptions: usize,
    /// Requests that arrived with no replica ready: they wait for a cold start.
    pub cold_arrivals: usize,
    pub end_s: f64,
    pub samples: Vec<Sample>,
    pub variants: Vec<String>,
    /// Every tick's decision, in order, when [`SimConfig::record_decisions`] asks for them.
    pub decisions: Vec<Decision>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Ready(usize),
    Step(usize, u64),
    SpotNotice(usize),
    SpotKill(usize),
    Tick,
}

/// The pools a profile gives: every variant on demand and on Spot, in [`offer_keys`] order.
pub fn pools(profile: &Profile) -> (Vec<VariantLimits>, Vec<Pool>) {
    let limits: Vec<VariantLimits> = profile
        .variants
        .iter()
        .map(|v| VariantLimits::new(&v.name, u32::MAX))
        .collect();
    let pools = offer_keys(&limits)
        .into_iter()
        .map(|(name, capacity)| Pool {
            variant: profile.variant(&name).expect("from the profile").clone(),
            capacity,
        })
        .collect();
    (limits, pools)
}

struct Sim<'a> {
    cfg: &'a SimConfig,
    requests: &'a [Request],
    fleet: Fleet,
    gateway: Gateway,
    observer: Observer,
    heap: BinaryHeap<Reverse<(Ord64, u64, Kind)>>,
    seq: u64,
    outcomes: Vec<Outcome>,
    first_token: Vec<f64>,
    active: Vec<usize>,
    rng: ChaCha8Rng,
    preempted: Vec<u32>,
    spot_preemptions: usize,
    progress: Vec<Progress>,
    /// Requests finished, refused or cut.
    settled: usize,
    /// Requests that arrived with no replica ready.
    cold: usize,
    /// Replicas gone before the cut (see [`Sim::cut`]), not counted as started in the run.
    gone_at_cut: usize,
    /// Routing weight per pool key: the variant's planned batch for the current request shape.
    weights: Vec<f64>,
    slo: Slo,
    planning: Planning,
    model: String,
    /// The profile's variants, in the samples' order.
    variants: Vec<String>,
    /// Per pool key, the longest prompt its replicas take ([`SimConfig::prompt_bound`]).
    bounds: Vec<u32>,
    /// The longest prompt some variant serves alone within the SLO: a refused prompt up to
    /// it is one the controller counts in the request shape.
    longest_feasible: f64,
}

impl Sim<'_> {
    /// The longest prompt some ready replica takes; any pool's while none is ready (the
    /// gateway holds the request for the first to start).
    fn reach(&self) -> u32 {
        let ready = self
            .active
            .iter()
            .filter(|&&id| self.fleet.replicas[id].is_ready())
            .map(|&id| self.bounds[self.fleet.replicas[id].key])
            .max();
        ready.unwrap_or_else(|| self.bounds.iter().copied().max().unwrap_or(u32::MAX))
    }

    fn push(&mut self, t: f64, kind: Kind) {
        self.seq += 1;
        self.heap.push(Reverse((Ord64(t), self.seq, kind)));
    }

    fn reschedule(&mut self, id: usize) {
        let r = &mut self.fleet.replicas[id];
        r.epoch += 1;
        let epoch = r.epoch;
        if let Some(t) = r.next_event() {
            self.push(t, Kind::Step(id, epoch));
        }
    }

    fn record(&mut self, p: Progress, key: usize) {
        match p {
            Progress::FirstToken { req, t } => {
                let a = self.requests[req as usize].arrival_s;
                self.first_token[req as usize] = t;
                self.outcomes[req as usize].ttft_s = Some(t - a);
                self.observer
                    .on_first_token(t, t - a, key, self.outcomes[req as usize].feasible);
            }
            Progress::Finished { req, t } => {
                let r = &self.requests[req as usize];
                let tpot = if r.output_tokens > 1 {
                    (t - self.first_token[req as usize]) / f64::from(r.output_tokens - 1)
                } else {
                    0.0
                };
                self.outcomes[req as usize].tpot_s = Some(tpot);
                self.settled += 1;
                self.observer.on_finish(t, tpot, key);
            }
        }
    }

    /// Whether some replica of the fleet serves now.
    fn any_ready(&self) -> bool {
        self.active
            .iter()
            .any(|&id| self.fleet.replicas[id].is_ready())
    }

    /// Requests that waited past the gateway's bounds at `now` are refused.
    fn expire_waits(&mut self, now: f64) {
        let ready = self.any_ready();
        for i in self.gateway.expire(now, ready, self.requests) {
            self.outcomes[i as usize].failed = true;
            self.settled += 1;
            self.observer.on_unserved(now);
        }
    }

    fn dispatch(&mut self, now: f64) {
        self.expire_waits(now);
        let admitted = self.gateway.dispatch(
            now,
            self.requests,
            &mut self.fleet,
            &self.active,
            &self.weights,
            &self.bounds,
        );
        for id in admitted {
            self.reschedule(id);
        }
    }

    fn on_step(&mut self, id: usize, now: f64) {
        let mut progress = std::mem::take(&mut self.progress);
        progress.clear();
        self.fleet.replicas[id].complete(now, self.requests, &mut progress);
        let key = self.fleet.replicas[id].key;
        for p in progress.drain(..) {
            self.record(p, key);
        }
        self.progress = progress;
        let r = &self.fleet.replicas[id];
        if r.phase == Phase::Draining && r.seqs() == 0 {
            self.fleet.retire(id, now);
        } else {
            self.reschedule(id);
        }
    }

    fn apply(&mut self, d: &Decision, now: f64) -> usize {
        let targets: Vec<u32> = self
            .fleet
            .pools
            .iter()
            .map(|p| d.replicas(&p.variant.name, p.capacity))
            .collect();
        let applied = self.fleet.apply(&targets, now);
        for &(id, ready_s) in &applied.started {
            self.active.push(id);
            self.push(ready_s, Kind::Ready(id));
        }
        for &node in &applied.new_nodes {
            self.maybe_preempt(node, now);
        }
        for &id in &applied.draining {
            if self.fleet.replicas[id].seqs() == 0 {
                self.fleet.retire(id, now);
            }
        }
        applied.changed_keys
    }

    fn update_weights(&mut self, s: &sluice_policy::signals::Signals) {
        let Some(w) = s.workload() else {
            return;
        };
        for (key, pool) in self.fleet.pools.iter().enumerate() {
            let c = capacity::at_slo(&pool.variant, &w, &self.slo, &self.planning);
            // An ineligible variant still routes, as a last resort.
            self.weights[key] = if c.batch > 0.0 { c.batch } else { 1e-3 };
        }
    }

    fn maybe_preempt(&mut self, node: usize, now: f64) {
        let key = self.fleet.nodes[node].key;
        let rate = self.cfg.spot_preemptions_per_node_hour;
        if self.fleet.pools[key].capacity == CapacityType::Spot && rate > 0.0 {
            let u: f64 = self.rng.random::<f64>().max(1e-12);
            let life_s = -u.ln() / rate * 3600.0;
            self.push(now + life_s, Kind::SpotNotice(node));
        }
    }

    fn on_spot_notice(&mut self, node: usize, now: f64) {
        if self.fleet.nodes[node].released_s.is_some() {
            return;
        }
        self.fleet.nodes[node].doomed = true;
        let key = self.fleet.nodes[node].key;
        for &id in &self.active {
            let r = &mut self.fleet.replicas[id];
            if r.node == node && r.phase != Phase::Gone {
                self.preempted[key] += 1;
                self.spot_preemptions += 1;
                r.phase = Phase::Draining;
            }
        }
        self.push(now + self.cfg.spot_notice_s, Kind::SpotKill(node));
    }

    fn on_spot_kill(&mut self, node: usize, now: f64) {
        let ids: Vec<usize> = self
            .active
            .iter()
            .copied()
            .filter(|&id| self.fleet.replicas[id].node == node)
            .collect();
        for id in ids {
            if self.fleet.replicas[id].phase == Phase::Gone {
                continue;
            }
            self.fleet.replicas[id].advance(now);
            let (requeue, lost) = self.fleet.replicas[id].kill();
            self.gateway.requeue_front(&requeue, self.requests);
            for i in lost {
                self.outcomes[i as usize].failed = true;
                self.settled += 1;
            }
            self.fleet.replicas[id].phase = Phase::Draining;
            self.fleet.retire(id, now);
        }
        self.fleet.release_node(node, now);
    }
}

/// What a run counts besides the fleet's own books.
#[derive(Debug, Default)]
struct Tally {
    scale_events: usize,
    samples: Vec<Sample>,
    decisions: Vec<Decision>,
}

/// Requests no replica can hold: longer than the largest KV cache or the model's context.
#[derive(Debug, Clone, Copy)]
struct Fit {
    max_kv: u64,
    max_context: u64,
}

impl Fit {
    fn of(profile: &Profile) -> Fit {
        Fit {
            max_kv: profile
                .variants
                .iter()
                .map(|v| v.perf.kv_cache_tokens)
                .max()
                .unwrap_or(0),
            max_context: profile.model.max_context_tokens,
        }
    }

    fn holds(&self, r: &Request) -> bool {
        let total = u64::from(r.prompt_tokens) + u64::from(r.output_tokens);
        total <= self.max_kv && total <= self.max_context
    }
}

impl<'a> Sim<'a> {
    /// A simulator over `requests` with `initial` ready replicas per pool key.
    fn new(
        cfg: &'a SimConfig,
        profile: &Profile,
        slo: &Slo,
        planning: &Planning,
        requests: &'a [Request],
        initial: &[u32],
    ) -> Sim<'a> {
        let (_, pools) = pools(profile);
        let keys = pools.len();
        let bounds = pools
            .iter()
            .map(|p| cfg.prompt_bound(profile, &p.variant, slo))
            .collect();
        let mut sim = Sim {
            cfg,
            requests,
            fleet: Fleet::new(pools),
            gateway: Gateway::new(
                cfg.queue_late_after_share.map(|s| s * slo.ttft_p99_s),
                cfg.queue_limits,
            ),
            observer: Observer::new(
                cfg.window_s,
                cfg.short_window_s,
                cfg.latency_window_s,
                cfg.shape_window_s,
                slo.ttft_p99_s,
            ),
            heap: BinaryHeap::new(),
            seq: 0,
            outcomes: requests
                .iter()
                .map(|r| Outcome {
                    arrival_s: r.arrival_s,
                    ttft_s: None,
                    tpot_s: None,
                    failed: false,
                    feasible: crate::feasibility::feasible(profile, slo, r),
                })
                .collect(),
            first_token: vec![0.0; requests.len()],
            active: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            preempted: vec![0; keys],
            spot_preemptions: 0,
            progress: Vec::new(),
            settled: 0,
            cold: 0,
            gone_at_cut: 0,
            weights: vec![1.0; keys],
            slo: *slo,
            planning: *planning,
            model: profile.model.name.clone(),
            variants: profile.variant_names(),
            bounds,
            longest_feasible: profile.longest_feasible_prompt(slo),
        };
        let mut applied = fleet::Applied::default();
        for (key, &n) in initial.iter().enumerate() {
            for _ in 0..n {
                let id = sim.fleet.add_replica(key, 0.0, true, &mut applied);
                sim.active.push(id);
            }
        }
        for &node in &applied.new_nodes {
            sim.maybe_preempt(node, 0.0);
        }
        sim
    }

    /// The run is told from `at` on: what was billed, started, scaled and recorded before it
    /// was the warm-up's ([`warm`]), and nodes up at the cut are billed from it.
    fn cut(&mut self, at: f64, tally: &mut Tally) {
        self.fleet.bill_from(at);
        self.cold = 0;
        self.spot_preemptions = 0;
        self.gone_at_cut = self
            .fleet
            .replicas
            .iter()
            .filter(|r| r.phase == Phase::Gone)
            .count();
        *tally = Tally::default();
    }

    /// Request `next` arrives: refused if no replica holds or takes it (`--max-prompt-tokens`),
    /// else queued at the gateway.
    fn on_arrival(&mut self, next: usize, fit: &Fit) -> f64 {
        let r = &self.requests[next];
        let now = r.arrival_s;
        let held = fit.holds(r);
        let taken = held && !self.cfg.refuses_prompt(r) && r.prompt_tokens <= self.reach();
        // Refused for its length, yet some variant serves it: the gateway's refused-prompt
        // histogram shows it to the controller.
        let shaped = taken || (held && f64::from(r.prompt_tokens) <= self.longest_feasible);
        self.observer.on_arrival(now, r, taken, shaped);
        if !self.any_ready() {
            self.cold += 1;
        }
        if !taken {
            // No replica takes it: refused as invalid. A miss only if it was feasible (a
            // `--max-prompt-tokens` below the longest feasible prompt).
            self.outcomes[next].failed = true;
            self.settled += 1;
        } else if !self.gateway.push(next as u32, r) {
            self.outcomes[next].failed = true;
            self.settled += 1;
            self.observer.on_unserved(now);
        }
        self.dispatch(now);
        now
    }

    /// A fleet event (not a tick) at `now`.
    fn on_event(&mut self, kind: Kind, now: f64) {
        match kind {
            Kind::Ready(id) => {
                if matches!(self.fleet.replicas[id].phase, Phase::Starting { .. }) {
                    self.fleet.replicas[id].phase = Phase::Ready;
                    self.fleet.replicas[id].advance(now);
                }
                self.dispatch(now);
            }
            Kind::Step(id, epoch) => {
                if self.fleet.replicas[id].epoch == epoch
                    && self.fleet.replicas[id].phase != Phase::Gone
                {
                    self.on_step(id, now);
                    self.dispatch(now);
                }
            }
            Kind::SpotNotice(node) => self.on_spot_notice(node, now),
            Kind::SpotKill(node) => {
                self.on_spot_kill(node, now);
                self.dispatch(now);
            }
            Kind::Tick => unreachable!("ticks are the policy's, handled by on_tick"),
        }
    }

    /// A policy tick: signals, the decision applied, a sample. False once every request has
    /// arrived and settled (the run is over).
    fn on_tick(
        &mut self,
        now: f64,
        all_arrived: bool,
        policy: &mut dyn Policy,
        tally: &mut Tally,
    ) -> bool {
        let fleet = &self.fleet;
        self.active
            .retain(|&id| fleet.replicas[id].phase != Phase::Gone);
        self.expire_waits(now);
        if all_arrived && self.settled == self.requests.len() {
            return false;
        }
        let signals = self.observer.signals(
            now,
            &self.model,
            &self.fleet,
            &self.gateway,
            &self.preempted,
        );
        self.preempted.iter_mut().for_each(|p| *p = 0);
        self.update_weights(&signals);
        let d = policy.decide(&signals);
        tally.scale_events += self.apply(&d, now);
        tally.samples.push(sample(&self.variants, &signals, now));
        if self.cfg.record_decisions {
            tally.decisions.push(d);
        }
        self.dispatch(now);
        self.push(now + self.cfg.tick_s, Kind::Tick);
        true
    }
}

/// How a run starts: the fleet at the start per pool key (ready: the trace is a window cut
/// from a running service), and the opening a warm-up replays before the cut ([`warm`]; 0:
/// none, the run starts at the trace's first request).
#[derive(Debug, Clone, Copy)]
pub struct Start<'a> {
    pub fleet: &'a [u32],
    pub warm_opening_s: f64,
}

impl<'a> Start<'a> {
    /// `fleet` ready at the trace's first request, no warm-up.
    pub fn cold(fleet: &'a [u32]) -> Start<'a> {
        Start {
            fleet,
            warm_opening_s: 0.0,
        }
    }
}

/// Runs one policy over the requests from `start`: with a warm-up, the policy starts from the
/// fleet that long before the cut on the trace's opening played forward and then mirrored,
/// and the run is told from the cut.
pub fn run(
    cfg: &SimConfig,
    profile: &Profile,
    slo: &Slo,
    planning: &Planning,
    requests: &[Request],
    policy: &mut dyn Policy,
    start: Start<'_>,
) -> Run {
    let scn = (profile, slo, planning);
    let Some((all, cut_s, warm)) =
        warm::with_mirrored_opening(requests, start.warm_opening_s, cfg.tick_s)
    else {
        return run_from(cfg, scn, requests, policy, start.fleet, 0.0);
    };
    let run = run_from(cfg, scn, &all, policy, start.fleet, cut_s);
    warm::from_cut(run, cut_s, warm)
}

/// The event loop, the run told from `cut_s` on ([`Sim::cut`]).
fn run_from(
    cfg: &SimConfig,
    (profile, slo, planning): (&Profile, &Slo, &Planning),
    requests: &[Request],
    policy: &mut dyn Policy,
    initial: &[u32],
    cut_s: f64,
) -> Run {
    let mut sim = Sim::new(cfg, profile, slo, planning, requests, initial);
    let fit = Fit::of(profile);
    let deadline = requests.last().map_or(0.0, |r| r.arrival_s) + cfg.max_drain_s;
    sim.push(0.0, Kind::Tick);
    let mut next = 0usize;
    let mut tally = Tally::default();
    let mut now = 0.0;
    let mut before_cut = true;
    loop {
        let next_arrival = requests.get(next).map(|r| r.arrival_s);
        let next_event = sim.heap.peek().map(|Reverse((t, _, _))| t.0);
        let (take_arrival, t) = match (next_arrival, next_event) {
            (Some(a), Some(e)) => (a <= e, a.min(e)),
            (Some(a), None) => (true, a),
            (None, Some(e)) => (false, e),
            (None, None) => break,
        };
        if before_cut && t >= cut_s {
            sim.cut(cut_s, &mut tally);
            before_cut = false;
        }
        if take_arrival {
            now = sim.on_arrival(next, &fit);
            next += 1;
            continue;
        }
        let Reverse((t, _, kind)) = sim.heap.pop().expect("peeked");
        now = t.0;
        if now > deadline {
            break;
        }
        if kind != Kind::Tick {
            sim.on_event(kind, now);
        } else if !sim.on_tick(now, next == requests.len(), policy, &mut tally) {
            break;
        }
    }
    let end_s = now.min(deadline);
    sim.fleet.close(end_s);
    Run {
        policy: policy.name().to_string(),
        replicas_started: sim.fleet.replicas.len() - sim.gone_at_cut,
        outcomes: sim.outcomes,
        cost_usd: sim.fleet.billing.cost_usd,
        gpu_hours: sim.fleet.billing.gpu_hours,
        scale_events: tally.scale_events,
        spot_preemptions: sim.spot_preemptions,
        cold_arrivals: sim.cold,
        end_s,
        samples: tally.samples,
        variants: sim.variants,
        decisions: tally.decisions,
    }
}

fn sample(variants: &[String], s: &sluice_policy::signals::Signals, now: f64) -> Sample {
    let mut ready = vec![0; variants.len()];
    let mut starting = vec![0; variants.len()];
    for v in &s.variants {
        if let Some(i) = variants.iter().position(|n| *n == v.variant) {
            ready[i] += v.ready;
            starting[i] += v.starting + v.pending;
        }
    }
    Sample {
        time_s: now,
        arrival_rate: s.arrivals.requests_per_s,
        ready,
        starting,
        queue: s.queue.waiting,
    }
}
