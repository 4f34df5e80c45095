//! A scenario: the model, variants, SLO, trace scaling and fleet behaviour every policy runs
//! under, the policies built for it, and running them side by side.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use sluice_policy::baselines::hpa::{Hpa, HpaConfig, HpaMetric};
use sluice_policy::baselines::kpa::{Kpa, KpaConfig};
use sluice_policy::baselines::oracle::{peak_window, Sizing};
use sluice_policy::baselines::static_peak::StaticPeak;
use sluice_policy::capacity::{self, Moments, Planning, Slo, Workload};
use sluice_policy::mix;
use sluice_policy::policy::plan::{self, VariantLimits};
use sluice_policy::policy::{Policy, Sluice, SluiceConfig};
use sluice_policy::profile::{CapacityType, Profile};
use sluice_policy::timeline::{Request, Timeline};
use sluice_policy::zero::ZeroRule;

use crate::error::{Error, Result};
use crate::sim::{self, Run, SimConfig};

/// Every policy the simulator knows, in report order.
pub const POLICIES: &[&str] = &[
    "sluice",
    "static-peak",
    "hpa-cpu",
    "hpa-concurrency",
    "kpa",
    "oracle",
];

/// Bucket of the arrival timeline the oracle and static peak read.
const TIMELINE_BUCKET_S: f64 = 10.0;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scenario {
    pub profile: Profile,
    pub slo: Slo,
    pub planning: Planning,
    pub rate_scale: f64,
    /// Buy Spot (every policy: sluice Spot first with on-demand fallback, baselines on Spot).
    pub spot: bool,
    pub max_replicas_per_variant: u32,
    /// Fewest replicas the scaling policies (sluice, KPA) keep, on the baseline variant: 0
    /// lets them go to zero over idle periods (HPA keeps one; static peak and the oracle
    /// follow their own schedules).
    #[serde(default)]
    pub min_replicas: u32,
    /// When sluice may take a pool at `min_replicas` 0 to zero: by default only when the cold
    /// start fits the SLO's error budget ([`ZeroRule::P99_DAY`]); [`ZeroRule::Idle`] goes
    /// whenever it is idle, as KPA does.
    #[serde(default = "default_zero_rule")]
    pub zero_rule: ZeroRule,
    pub sim: SimConfig,
    /// The variant single-variant baselines scale; `None` picks the cheapest per request at
    /// SLO for the trace's mean shape.
    pub baseline_variant: Option<String>,
    /// Attainment the burst-recovery figure measures against.
    pub goal: f64,
}

fn default_zero_rule() -> ZeroRule {
    ZeroRule::P99_DAY
}

impl Scenario {
    /// The default scenario: Llama-3-8B on L4 and H100, TTFT p99 ≤ 2 s, TPOT p99 ≤ 100 ms,
    /// the trace's rate × 4, on demand.
    pub fn default_for(profile: Profile) -> Scenario {
        Scenario {
            profile,
            slo: Slo {
                ttft_p99_s: 2.0,
                tpot_p99_s: 0.1,
            },
            planning: Planning::default(),
            rate_scale: 4.0,
            spot: false,
            max_replicas_per_variant: 200,
            min_replicas: 0,
            zero_rule: default_zero_rule(),
            sim: SimConfig::default(),
            baseline_variant: None,
            goal: 0.99,
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Scenario(m.to_string()));
        if self.rate_scale.is_nan() || self.rate_scale <= 0.0 {
            return bad("rate scale must be positive");
        }
        if !self.slo.is_valid() {
            return bad("SLOs must be positive");
        }
        if self.sim.tick_s.is_nan()
            || self.sim.window_s.is_nan()
            || self.sim.tick_s <= 0.0
            || self.sim.window_s <= 0.0
        {
            return bad("tick and window must be positive");
        }
        if self.planning.tpot_share.is_nan()
            || self.planning.ttft_share.is_nan()
            || self.planning.tpot_share <= 0.0
            || self.planning.ttft_share <= 0.0
        {
            return bad("planning shares must be positive");
        }
        let q = &self.sim.queue_limits;
        let timeouts = [q.queue_timeout_s, q.hold_timeout_s];
        if timeouts.iter().flatten().any(|t| t.is_nan() || *t <= 0.0) || q.max_queue == Some(0) {
            return bad("the gateway's queue timeouts and size must be positive (or unbounded)");
        }
        if self.sim.max_prompt_tokens == Some(0) {
            return bad("the replicas' prompt bound must be positive (or none)");
        }
        if self.sim.max_prompt_tokens.is_some() && self.sim.per_variant_prompt_bounds {
            return bad("one prompt bound for every replica, or one per variant, not both");
        }
        Ok(())
    }

    fn capacity_type(&self) -> CapacityType {
        if self.spot {
            CapacityType::Spot
        } else {
            CapacityType::OnDemand
        }
    }

    /// Every variant of the profile, up to `max_replicas_per_variant` each.
    pub fn limits(&self) -> Vec<VariantLimits> {
        self.profile
            .variants
            .iter()
            .map(|v| VariantLimits::new(&v.name, self.max_replicas_per_variant))
            .collect()
    }

    /// The single-variant baselines' variant and its capacity at SLO for the mean shape.
    pub fn baseline_choice(&self, mean: &Workload) -> Result<(String, capacity::Capacity)> {
        if let Some(name) = &self.baseline_variant {
            let v = self.profile.variant(name)?;
            return Ok((
                name.clone(),
                capacity::at_slo(v, mean, &self.slo, &self.planning),
            ));
        }
        let limits = self.limits();
        let (caps, _) = plan::capacities(&self.profile, &limits, mean, &self.slo, &self.planning);
        let cap_type = self.capacity_type();
        let best = self
            .profile
            .variants
            .iter()
            .zip(caps)
            .filter(|(_, c)| c.requests_per_s > 0.0)
            .min_by(|(a, ca), (b, cb)| {
                let ua = a.replica_price_per_hour(cap_type) / ca.requests_per_s;
                let ub = b.replica_price_per_hour(cap_type) / cb.requests_per_s;
                ua.total_cmp(&ub)
            })
            .ok_or_else(|| {
                let why: Vec<String> = self
                    .profile
                    .variants
                    .iter()
                    .filter_map(|v| {
                        capacity::ineligibility(v, mean, &self.slo, &self.planning)
                            .map(|i| format!("{}: {i}", v.name))
                    })
                    .collect();
                Error::Scenario(format!(
                    "no variant can serve this trace's mean request ({} prompt + {} output \
                     tokens): {}",
                    mean.mean_prompt_tokens.round(),
                    mean.mean_output_tokens.round(),
                    why.join("; ")
                ))
            })?;
        Ok((best.0.name.clone(), best.1))
    }
}

/// Mean prompt and output tokens of the requests, and their spreads.
pub fn mean_shape(requests: &[Request]) -> Workload {
    let (mut prompt, mut output) = (Moments::default(), Moments::default());
    for r in requests {
        prompt.add(r.prompt_tokens);
        output.add(r.output_tokens);
    }
    // With none, a zero shape (the spread of fewer than two lengths is 0).
    let n = (requests.len() as f64).max(1.0);
    Workload::from_moments(n, &prompt, &output)
}

/// A policy ready to run, and the fleet it starts with per pool key.
pub struct Prepared {
    pub policy: Box<dyn Policy + Send>,
    pub initial: Vec<u32>,
    /// Something the report should say about how the policy was built (the oracle's search).
    pub note: Option<String>,
    /// The opening its warm-up replays ([`sim::warm`]): for policies that act on what they
    /// observe; none for those that plan from the trace.
    pub warm_opening_s: f64,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("policy", &self.policy.name())
            .field("initial", &self.initial)
            .field("warm_opening_s", &self.warm_opening_s)
            .finish()
    }
}

/// What building any policy for a scenario and trace needs.
struct Setup<'a> {
    scn: &'a Scenario,
    timeline: Arc<Timeline>,
    limits: Vec<VariantLimits>,
    cap_type: CapacityType,
    mean: Workload,
    /// The variant single-variant baselines scale, and its capacity at SLO.
    base_variant: String,
    base_cap: capacity::Capacity,
    /// The starting fleet per offer key: over every variant, and over the baseline's only.
    all: Vec<u32>,
    single: Vec<u32>,
}

impl<'a> Setup<'a> {
    fn new(scn: &'a Scenario, requests: &[Request]) -> Result<Setup<'a>> {
        let timeline = Arc::new(Timeline::new(requests, TIMELINE_BUCKET_S));
        let mut limits = scn.limits();
        let cap_type = scn.capacity_type();
        let mean = mean_shape(requests);
        let (base_variant, base_cap) = scn.baseline_choice(&mean)?;
        if let Some(l) = limits.iter_mut().find(|l| l.variant == base_variant) {
            l.min = scn.min_replicas;
            l.keep_warm = scn.min_replicas;
        }
        let all = initial_fleet(scn, &limits, &timeline, &|_| true);
        let single = initial_fleet(scn, &limits, &timeline, &|n| n == base_variant);
        Ok(Setup {
            scn,
            timeline,
            limits,
            cap_type,
            mean,
            base_variant,
            base_cap,
            all,
            single,
        })
    }
}

/// The trace is cut from a running service: every policy starts with the fleet the capacity
/// model sizes for the busiest window before a replica asked for at time zero could serve —
/// the cheapest for that window over the `allowed` variants, as counts per offer key (those
/// that act on what they observe start there before their warm-up, [`sim::warm`]).
fn initial_fleet(
    scn: &Scenario,
    limits: &[VariantLimits],
    timeline: &Timeline,
    allowed: &dyn Fn(&str) -> bool,
) -> Vec<u32> {
    let keys = plan::offer_keys(limits);
    let lead = scn
        .profile
        .variants
        .iter()
        .map(|v| v.startup_s(true))
        .fold(0.0, f64::max);
    let sizing = Sizing {
        profile: &scn.profile,
        limits,
        slo: &scn.slo,
        planning: &scn.planning,
    };
    let Some((rate, w)) = peak_window(sizing, timeline, scn.sim.window_s, 0.0, lead) else {
        return vec![0; keys.len()];
    };
    let (caps, _) = plan::capacities(&scn.profile, limits, &w, &scn.slo, &scn.planning);
    let zero = vec![0; keys.len()];
    let cap_type = scn.capacity_type();
    let offers = plan::offers(
        &scn.profile,
        limits,
        &caps,
        &zero,
        |n, c| c == cap_type && allowed(n),
        |l| l.min,
    );
    mix::cheapest(&offers, rate).counts
}

/// Builds the named policies for a scenario and trace. Every policy starts with the fleet the
/// capacity model sizes for the arrivals before the first replica it could add is up, on the
/// variants it manages; those that act on what they observe (all but static peak and the
/// oracle) then warm up on the trace's opening before the cut ([`sim::warm`]).
pub fn prepare(scn: &Scenario, requests: &[Request], names: &[String]) -> Result<Vec<Prepared>> {
    scn.validate()?;
    let setup = Setup::new(scn, requests)?;
    let opening_s = sim::warm::opening_s(&scn.profile, &scn.sim);
    let mut out = Vec::new();
    for name in names {
        let mut note = None;
        let observes = !matches!(name.as_str(), "static-peak" | "oracle");
        let (policy, initial) = match name.as_str() {
            "sluice" => sluice(&setup),
            "static-peak" => static_peak(&setup),
            "oracle" => {
                let (built, n) = oracle(scn, requests);
                note = Some(n);
                built
            }
            "hpa-cpu" | "hpa-concurrency" => hpa(&setup, name)?,
            "kpa" => kpa(&setup),
            other => {
                return Err(Error::Scenario(format!(
                    "unknown policy {other:?} (known: {})",
                    POLICIES.join(", ")
                )));
            }
        };
        out.push(Prepared {
            policy,
            initial,
            note,
            warm_opening_s: if observes { opening_s } else { 0.0 },
        });
    }
    Ok(out)
}

/// A policy and the fleet it starts with, per offer key.
type Built = (Box<dyn Policy + Send>, Vec<u32>);

fn sluice(s: &Setup<'_>) -> Built {
    let mut cfg = SluiceConfig::new(s.scn.slo, s.limits.clone());
    cfg.planning = s.scn.planning;
    // The idle period before zero follows the scale-down window, as in local mode and the
    // controller.
    cfg.scale_to_zero_after_s = cfg.scale_down_window_s;
    cfg.spot = s.scn.spot;
    cfg.zero_rule = s.scn.zero_rule;
    (
        Box::new(Sluice::new(s.scn.profile.clone(), cfg)),
        s.all.clone(),
    )
}

/// Static peak starts where it stays.
fn static_peak(s: &Setup<'_>) -> Built {
    let scn = s.scn;
    let mut p = StaticPeak::new(
        scn.profile.clone(),
        s.limits.clone(),
        &scn.slo,
        &scn.planning,
        s.cap_type,
        &s.timeline,
        scn.sim.window_s,
    );
    let counts = p
        .decide(&Default::default())
        .targets
        .iter()
        .map(|t| t.replicas)
        .collect();
    (Box::new(p), counts)
}

/// The oracle's schedule, searched over replays, and what the search found.
fn oracle(scn: &Scenario, requests: &[Request]) -> (Built, String) {
    let f = crate::oracle::search(scn, requests, &crate::oracle::SearchConfig::default());
    let note = if f.met {
        format!(
            "oracle: cheapest schedule found{} meets {:.2} % of feasible requests ({} replays)",
            if f.flat { " (a fleet held flat)" } else { "" },
            f.attainment * 100.0,
            f.replays
        )
    } else if f.at_limits {
        format!(
            "oracle: no schedule within --max-replicas {} meets {:.0} % (at those limits where it \
             misses: {:.2} %, {} replays)",
            scn.max_replicas_per_variant,
            scn.goal * 100.0,
            f.attainment * 100.0,
            f.replays
        )
    } else {
        format!(
            "oracle: the search found no schedule meeting {:.0} % within its {} replays (best \
             {:.2} %); more replicas than it tried may",
            scn.goal * 100.0,
            f.replays,
            f.attainment * 100.0
        )
    };
    ((Box::new(f.schedule), f.initial), note)
}

fn hpa(s: &Setup<'_>, name: &str) -> Result<Built> {
    let scn = s.scn;
    let (metric, target) = if name == "hpa-cpu" {
        (HpaMetric::Cpu, 0.6)
    } else {
        // What a replica holds at 70 % of its capacity at SLO: the usual headroom, taken on
        // the rate since in-flight grows steeply near saturation.
        let v = scn.profile.variant(&s.base_variant)?;
        let b = capacity::batch_at_rate(v, &s.mean, 0.7 * s.base_cap.requests_per_s);
        (
            HpaMetric::Concurrency,
            b.unwrap_or(s.base_cap.batch).max(1.0),
        )
    };
    let cfg = HpaConfig {
        metric,
        target,
        tolerance: 0.1,
        scale_down_window_s: 300.0,
        min: 1,
        max: scn.max_replicas_per_variant,
        variant: s.base_variant.clone(),
        capacity: s.cap_type,
    };
    Ok((
        Box::new(Hpa::new(scn.profile.clone(), cfg)),
        s.single.clone(),
    ))
}

fn kpa(s: &Setup<'_>) -> Built {
    let cfg = KpaConfig {
        target: s.base_cap.batch.max(1.0),
        utilisation: 0.7,
        stable_window_s: 60.0,
        panic_window_s: 6.0,
        panic_threshold: 2.0,
        scale_to_zero_grace_s: 30.0,
        max_scale_down_rate: 2.0,
        min: s.scn.min_replicas,
        max: s.scn.max_replicas_per_variant,
        variant: s.base_variant.clone(),
        capacity: s.cap_type,
    };
    (
        Box::new(Kpa::new(s.scn.profile.clone(), cfg)),
        s.single.clone(),
    )
}

/// Runs every prepared policy over the same requests, in parallel threads.
pub fn run_all(scn: &Scenario, requests: &[Request], prepared: Vec<Prepared>) -> Vec<Run> {
    std::thread::scope(|s| {
        let handles: Vec<_> = prepared
            .into_iter()
            .map(|mut p| {
                s.spawn(move || {
                    let start = sim::Start {
                        fleet: &p.initial,
                        warm_opening_s: p.warm_opening_s,
                    };
                    sim::run(
                        &scn.sim,
                        &scn.profile,
                        &scn.slo,
                        &scn.planning,
                        requests,
                        p.policy.as_mut(),
                        start,
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a simulation thread panicked"))
            .collect()
    })
}
