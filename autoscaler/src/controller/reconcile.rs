//! One reconcile of one `ServingPool`: observe, decide with the same policy the simulator
//! runs, allocate over the variants, act, and write status.
//!
//! Each pool keeps a [`PoolState`] across reconciles: its stateful `Sluice` policy (rebuilt
//! when the spec's generation changes), when each pod was first seen pending, and which
//! variants are unavailable until when. Time is the controller's monotonic clock in seconds,
//! passed in, so tests drive stabilisation windows and back-offs without waiting. A reconcile
//! is idempotent: it scales a Deployment only when its `spec.replicas` differs from the
//! target, and its status is a server-side apply of the whole status.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};
use serde_json::json;

use sluice_policy::capacity::{self, Planning, Slo, Workload};
use sluice_policy::decision::Decision;
use sluice_policy::policy::{Policy, Sluice, SluiceConfig, VariantLimits};
use sluice_policy::profile::{CapacityType, Profile};
use sluice_policy::signals::{Signals, VariantSignals};

use super::allocate::{self, Entry};
use super::error::{Error, Result};
use super::metrics::Metrics;
use super::observe::{self, PoolView};
use super::source::{Query, Reading, SignalSource};
use super::status::Conditions;
use crate::crd::{DecisionStatus, NodePoolProviderKind, ServingPool, VariantStatus};
use crate::nodepool::{NodePoolProvider, NodeRequest, Outcome};

/// What every reconcile shares.
#[derive(Clone)]
pub struct Context {
    pub client: kube::Client,
    pub source: Arc<dyn SignalSource>,
    /// The `gke` provider, if the controller was given a cluster to act on.
    pub gke: Option<Arc<dyn NodePoolProvider>>,
    pub provisioning: Arc<dyn NodePoolProvider>,
    pub recorder: Recorder,
    pub metrics: Metrics,
    /// Log decisions, change nothing.
    pub dry_run: bool,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("source", &self.source)
            .field("gke", &self.gke)
            .field("provisioning", &self.provisioning)
            .field("dry_run", &self.dry_run)
            .finish_non_exhaustive()
    }
}

/// One pool's memory between reconciles.
#[derive(Debug)]
pub struct PoolState {
    generation: Option<i64>,
    policy: Sluice,
    profile: Profile,
    /// Pod uid → when it was first seen pending.
    pending_since: HashMap<String, f64>,
    /// Variant → (avoided until, condition reason).
    unavailable: HashMap<String, (f64, &'static str)>,
}

/// What a reconcile did, for tests and logs.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcomes {
    /// Desired replicas per variant, in spec order.
    pub desired: Vec<u32>,
    pub stale: bool,
    pub decision: Option<Decision>,
}

fn invalid(pool: &ServingPool, message: impl Into<String>) -> Error {
    Error::InvalidSpec {
        name: pool.name_any(),
        message: message.into(),
    }
}

/// The policy for a spec: one `Sluice` over the profile variants the pool names, each limited
/// by the sum of its entries' bounds, with the spec's SLO and knobs.
fn build_policy(pool: &ServingPool) -> Result<(Sluice, Profile)> {
    let spec = &pool.spec;
    spec.validate().map_err(|m| invalid(pool, m))?;
    let profile = Profile::load(&spec.profile).map_err(|source| Error::Profile {
        name: pool.name_any(),
        source: Box::new(source),
    })?;
    let mut names: Vec<String> = Vec::new();
    for v in &spec.variants {
        if !names.contains(&v.profile_variant) {
            names.push(v.profile_variant.clone());
        }
    }
    let profile = profile.restrict(&names).map_err(|source| Error::Profile {
        name: pool.name_any(),
        source: Box::new(source),
    })?;
    let limits = names
        .iter()
        .map(|n| {
            let mine = spec.variants.iter().filter(|v| &v.profile_variant == n);
            let mut l = VariantLimits::new(n, mine.clone().map(|v| v.max_replicas).sum());
            l.min = mine.map(|v| v.min_replicas).sum();
            l
        })
        .collect();
    let slo = Slo {
        ttft_p99_s: spec.slo.ttft.target_seconds,
        tpot_p99_s: spec.slo.tpot.target_seconds,
    };
    let p = &spec.policy;
    let mut c = SluiceConfig::new(slo, limits);
    c.spot = spec
        .variants
        .iter()
        .any(|v| v.capacity == CapacityType::Spot);
    c.headroom = p.headroom;
    c.forecast_horizon_s = p.forecast_horizon_seconds;
    c.panic_rate_ratio = p.panic_threshold;
    c.panic_window_s = p.panic_window_seconds;
    c.scale_down_window_s = p.scale_down_stabilisation_seconds;
    c.spot_stockout_after_s = spec.stockout.pending_limit_seconds;
    c.spot_retry_after_s = spec.stockout.backoff_seconds;
    Ok((Sluice::new(profile.clone(), c), profile))
}

impl PoolState {
    pub fn new(pool: &ServingPool) -> Result<Self> {
        let (policy, profile) = build_policy(pool)?;
        Ok(PoolState {
            generation: pool.metadata.generation,
            policy,
            profile,
            pending_since: HashMap::new(),
            unavailable: HashMap::new(),
        })
    }

    /// Rebuilds the policy when the spec changed (its memory belongs to the old spec).
    fn refresh(&mut self, pool: &ServingPool) -> Result<()> {
        if pool.metadata.generation != self.generation {
            let (policy, profile) = build_policy(pool)?;
            self.policy = policy;
            self.profile = profile;
            self.generation = pool.metadata.generation;
        }
        Ok(())
    }
}

/// Reconciles one pool at `now_s` (the controller's monotonic clock).
pub async fn reconcile(
    ctx: &Context,
    state: &mut PoolState,
    pool: &ServingPool,
    now_s: f64,
) -> Result<Outcomes> {
    state.refresh(pool)?;
    let ns = pool
        .namespace()
        .ok_or_else(|| invalid(pool, "a ServingPool is namespaced"))?;
    let name = pool.name_any();
    let key = format!("{ns}/{name}");
    let spec = &pool.spec;
    let view = observe::observe(&ctx.client, pool, &ns).await?;
    let mut events: Vec<(EventType, &'static str, &'static str, String)> = Vec::new();

    // Pending pods: remember when each was first seen, drop the ones gone.
    let mut seen = BTreeSet::new();
    let mut oldest_pending = vec![0.0f64; spec.variants.len()];
    for (i, vv) in view.variants.iter().enumerate() {
        for p in vv.pods.iter().filter(|p| p.pending && !p.terminating) {
            seen.insert(p.uid.clone());
            let since = *state.pending_since.entry(p.uid.clone()).or_insert(now_s);
            oldest_pending[i] = oldest_pending[i].max(now_s - since);
        }
    }
    state.pending_since.retain(|uid, _| seen.contains(uid));

    // Back-offs that ran out: the variant may be tried again.
    for v in &spec.variants {
        if let Some(&(until, why)) = state.unavailable.get(&v.name) {
            if now_s >= until {
                state.unavailable.remove(&v.name);
                events.push((
                    EventType::Normal,
                    "VariantAvailable",
                    "Recover",
                    format!("{}: back-off after {why} over, trying it again", v.name),
                ));
            }
        }
    }
    // Stockouts: a pod pending past the limit.
    let st = &spec.stockout;
    for (i, v) in spec.variants.iter().enumerate() {
        if oldest_pending[i] > st.pending_limit_seconds && !state.unavailable.contains_key(&v.name)
        {
            state
                .unavailable
                .insert(v.name.clone(), (now_s + st.backoff_seconds, "Stockout"));
            events.push((
                EventType::Warning,
                "Stockout",
                "Fallback",
                format!(
                    "{}: a pod pending for {:.0} s (limit {:.0} s): avoided for {:.0} s, demand moves to the next variant by priority",
                    v.name, oldest_pending[i], st.pending_limit_seconds, st.backoff_seconds
                ),
            ));
        }
    }
    // Spot preemptions: replace at once (delete the pods so their ReplicaSet recreates them),
    // and prefer other variants for a while.
    let mut preempted = vec![0u32; spec.variants.len()];
    for (i, (v, vv)) in spec.variants.iter().zip(&view.variants).enumerate() {
        let gone = vv.preempted();
        if gone.is_empty() {
            continue;
        }
        preempted[i] = gone.len() as u32;
        if !ctx.dry_run {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
            for p in &gone {
                match pods.delete(&p.name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(Error::kube(format!("delete pod {}", p.name))(e)),
                }
            }
        }
        if v.capacity == CapacityType::Spot {
            state.unavailable.insert(
                v.name.clone(),
                (now_s + st.spot_preemption_backoff_seconds, "SpotPreempted"),
            );
        }
        events.push((
            EventType::Warning,
            "NodePreempted",
            "Replace",
            format!(
                "{}: {} pods on a preempted or deleted node replaced now{}",
                v.name,
                gone.len(),
                if v.capacity == CapacityType::Spot {
                    format!(
                        "; other variants preferred for {:.0} s",
                        st.spot_preemption_backoff_seconds
                    )
                } else {
                    String::new()
                }
            ),
        ));
    }

    let reading = ctx
        .source
        .read(Query {
            pool: &key,
            namespace: &ns,
            spec,
            targets: &view.targets,
            now_s,
        })
        .await?;
    let stale_why = match &reading {
        Reading::Stale(why) => Some(why.clone()),
        Reading::Fresh(_) => None,
    };
    let stale = stale_why.is_some();
    let (desired, decision, notes) = match reading {
        Reading::Stale(why) => (
            view.variants.iter().map(|v| v.replicas).collect::<Vec<_>>(),
            None,
            vec![format!(
                "metrics stale or missing ({why}): holding every variant as it is"
            )],
        ),
        Reading::Fresh(load) => {
            let signals = signals(pool, &view, &load, &oldest_pending, &preempted, now_s);
            let d = state.policy.decide(&signals);
            let entries = entries(pool, state, &view, &d);
            let a = allocate::allocate(&d, &entries);
            (a.desired, Some(d), a.notes)
        }
    };

    // Act: scale, node pools.
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let reasons: Vec<String> = decision
        .iter()
        .flat_map(|d| d.reasons.iter().map(ToString::to_string))
        .chain(notes.iter().cloned())
        .collect();
    let mut node_pool_failure = None;
    for (i, v) in spec.variants.iter().enumerate() {
        let current = view.variants[i].replicas;
        let want = desired[i];
        let labels = [ns.as_str(), name.as_str(), v.name.as_str()];
        ctx.metrics
            .desired
            .with_label_values(&labels)
            .set(i64::from(want));
        ctx.metrics
            .current
            .with_label_values(&labels)
            .set(i64::from(current));
        if want != current {
            let dir = if want > current { "up" } else { "down" };
            tracing::info!(pool = %key, variant = %v.name, from = current, to = want, dry_run = ctx.dry_run, "scale");
            if !ctx.dry_run {
                deployments
                    .patch_scale(
                        &v.deployment,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"replicas": want}})),
                    )
                    .await
                    .map_err(Error::kube(format!("scale deployment {}", v.deployment)))?;
                ctx.metrics
                    .scale_actions
                    .with_label_values(&[ns.as_str(), name.as_str(), v.name.as_str(), dir])
                    .inc();
            }
            events.push((
                EventType::Normal,
                if want > current {
                    "ScaledUp"
                } else {
                    "ScaledDown"
                },
                "Scale",
                format!(
                    "{} ({}): {current} → {want} replicas; {}",
                    v.name,
                    v.deployment,
                    summary(&reasons)
                ),
            ));
        }
        if v.node_pool.provider == NodePoolProviderKind::None || ctx.dry_run {
            continue;
        }
        let pv = state
            .profile
            .variant(&v.profile_variant)
            .map_err(|source| Error::Profile {
                name: name.clone(),
                source: Box::new(source),
            })?;
        let per_node = pv.replicas_per_node().max(1);
        let req = NodeRequest {
            namespace: ns.clone(),
            serving_pool: name.clone(),
            variant: v.name.clone(),
            deployment: v.deployment.clone(),
            node_pool: v.node_pool.name.clone().unwrap_or_default(),
            gke_mode: v.node_pool.gke_mode,
            replicas: want,
            nodes: want.div_ceil(per_node),
            current_replicas: current,
            scheduled_replicas: view.variants[i].ready() + view.variants[i].starting(),
            gpus_per_replica: pv.gpus_per_replica,
        };
        let provider: Result<&Arc<dyn NodePoolProvider>> = match v.node_pool.provider {
            NodePoolProviderKind::Gke => ctx.gke.as_ref().ok_or_else(|| Error::NodePool {
                provider: "gke",
                pool: req.node_pool.clone(),
                message: "the gke provider is not configured (--gke-project, --gke-location, --gke-cluster)".into(),
            }),
            _ => Ok(&ctx.provisioning),
        };
        match provider {
            Ok(p) => match p.ensure(&req).await {
                Ok(Outcome::Unchanged) => {}
                Ok(Outcome::Changed(said)) => events.push((
                    EventType::Normal,
                    "NodePoolResized",
                    "RequestNodes",
                    format!("{}: {said}", v.name),
                )),
                Err(e) => node_pool_failure = Some(e),
            },
            Err(e) => node_pool_failure = Some(e),
        }
        if let Some(e) = &node_pool_failure {
            ctx.metrics
                .reconcile_errors
                .with_label_values(&[ns.as_str(), name.as_str(), e.metric_label()])
                .inc();
            events.push((
                EventType::Warning,
                "NodePoolFailed",
                "RequestNodes",
                format!("{}: {e}", v.name),
            ));
        }
    }
    if let Some(d) = &decision {
        for r in &d.reasons {
            let kind = serde_json::to_value(r.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            ctx.metrics
                .decisions
                .with_label_values(&[ns.as_str(), name.as_str(), kind.as_str()])
                .inc();
        }
    }

    // Status and Events.
    let now_wall = k8s_openapi::jiff::Timestamp::now().to_string();
    let mut conds = Conditions::from(
        pool.status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default(),
    );
    let at_target = spec
        .variants
        .iter()
        .enumerate()
        .all(|(i, _)| view.variants[i].ready() >= desired[i]);
    conds.set(
        "Ready",
        at_target,
        if at_target { "AtTarget" } else { "Scaling" },
        if at_target {
            "every variant has its desired replicas ready".into()
        } else {
            "replicas starting or pending".into()
        },
        &now_wall,
    );
    conds.set(
        "MetricsStale",
        stale,
        if stale { "NoFreshMetrics" } else { "Fresh" },
        match &stale_why {
            Some(why) => format!("no fresh metrics from the signal source ({why}): holding"),
            None => String::new(),
        },
        &now_wall,
    );
    let stocked: Vec<&str> = state
        .unavailable
        .iter()
        .filter(|(_, (_, why))| *why == "Stockout")
        .map(|(n, _)| n.as_str())
        .collect();
    let mut stocked = stocked;
    stocked.sort();
    conds.set(
        "Stockout",
        !stocked.is_empty(),
        if stocked.is_empty() {
            "InStock"
        } else {
            "PendingTooLong"
        },
        stocked.join(", "),
        &now_wall,
    );
    let nowhere = notes.iter().any(|n| n.contains("nowhere"));
    let degraded = nowhere || node_pool_failure.is_some();
    conds.set(
        "Degraded",
        degraded,
        if node_pool_failure.is_some() {
            "NodePoolFailed"
        } else if nowhere {
            "OutOfCapacity"
        } else {
            "AsPlanned"
        },
        node_pool_failure
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_else(|| {
                if nowhere {
                    notes.join("; ")
                } else {
                    String::new()
                }
            }),
        &now_wall,
    );
    let st = crate::crd::ServingPoolStatus {
        observed_generation: pool.metadata.generation,
        variants: spec
            .variants
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let un = state.unavailable.get(&v.name);
                VariantStatus {
                    name: v.name.clone(),
                    desired: desired[i],
                    current: view.variants[i].replicas,
                    ready: view.variants[i].ready(),
                    pending: view.variants[i].pending(),
                    available: un.is_none(),
                    unavailable_reason: un.map(|(_, why)| why.to_string()),
                }
            })
            .collect(),
        last_decision: Some(DecisionStatus {
            time: now_wall.clone(),
            mode: decision.as_ref().map_or("hold".into(), |d| {
                serde_json::to_value(d.mode)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            }),
            planned_requests_per_second: decision
                .as_ref()
                .map_or(0.0, |d| d.demand.planned_requests_per_s),
            reasons: reasons.clone(),
        }),
        conditions: conds.into_vec(),
    };
    if ctx.dry_run {
        for (_, reason, _, note) in &events {
            tracing::info!(pool = %key, reason, note, "dry run: would record");
        }
    } else {
        let api: Api<ServingPool> = Api::namespaced(ctx.client.clone(), &ns);
        api.patch_status(
            &name,
            &PatchParams::apply("sluice-autoscaler").force(),
            &Patch::Apply(json!({
                "apiVersion": "sluice.dev/v1alpha1",
                "kind": "ServingPool",
                "status": st,
            })),
        )
        .await
        .map_err(Error::kube(format!("status of {key}")))?;
        let reference = pool.object_ref(&());
        for (type_, reason, action, note) in events {
            let ev = Event {
                type_,
                reason: reason.into(),
                note: Some(truncate(&note, 1000)),
                action: action.into(),
                secondary: None,
            };
            if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
                tracing::warn!(pool = %key, error = %e, "cannot record an event");
            }
        }
    }
    if let Some(e) = node_pool_failure {
        return Err(e);
    }
    Ok(Outcomes {
        desired,
        stale,
        decision,
    })
}

fn summary(reasons: &[String]) -> String {
    if reasons.is_empty() {
        "no reason recorded".into()
    } else {
        reasons.join("; ")
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The policy's signals from the cluster view and the load: one entry per (profile variant,
/// capacity type), summing the pool variants that share it.
fn signals(
    pool: &ServingPool,
    view: &PoolView,
    load: &super::source::Load,
    oldest_pending: &[f64],
    preempted: &[u32],
    now_s: f64,
) -> Signals {
    let mut out: Vec<VariantSignals> = Vec::new();
    for (i, v) in pool.spec.variants.iter().enumerate() {
        let cap = v.capacity;
        let vv = &view.variants[i];
        let l = load.variants.get(&v.name).cloned().unwrap_or_default();
        let idx = match out
            .iter()
            .position(|s| s.variant == v.profile_variant && s.capacity == cap)
        {
            Some(k) => k,
            None => {
                out.push(VariantSignals {
                    variant: v.profile_variant.clone(),
                    capacity: cap,
                    ..VariantSignals::default()
                });
                out.len() - 1
            }
        };
        let s = &mut out[idx];
        let (r0, r1) = (f64::from(s.ready), f64::from(vv.ready()));
        let mean = |a: f64, b: f64| {
            if r0 + r1 > 0.0 {
                (a * r0 + b * r1) / (r0 + r1)
            } else {
                0.0
            }
        };
        s.running_per_replica = mean(s.running_per_replica, l.running_per_replica);
        s.waiting_per_replica = mean(s.waiting_per_replica, l.waiting_per_replica);
        s.kv_cache_usage = mean(s.kv_cache_usage, l.kv_cache_usage);
        s.ready += vv.ready();
        s.starting += vv.starting();
        s.pending += vv.pending();
        s.oldest_pending_s = s.oldest_pending_s.max(oldest_pending[i]);
        s.preempted += preempted[i];
        let worst = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        };
        s.ttft_p99_s = worst(s.ttft_p99_s, l.ttft_p99_s);
        s.tpot_p99_s = worst(s.tpot_p99_s, l.tpot_p99_s);
    }
    Signals {
        time_s: now_s,
        model: pool.spec.model.clone(),
        arrivals: load.arrivals.clone(),
        queue: load.queue.clone(),
        latency: load.latency.clone(),
        variants: out,
        pools: Vec::new(),
    }
}

/// Allocation entries: each pool variant's bounds, availability and capacity at SLO for the
/// workload the decision planned for.
fn entries(pool: &ServingPool, state: &PoolState, view: &PoolView, d: &Decision) -> Vec<Entry> {
    let spec = &pool.spec;
    let slo = Slo {
        ttft_p99_s: spec.slo.ttft.target_seconds,
        tpot_p99_s: spec.slo.tpot.target_seconds,
    };
    let w = (d.demand.mean_prompt_tokens > 0.0)
        .then(|| Workload::uniform(d.demand.mean_prompt_tokens, d.demand.mean_output_tokens));
    spec.variants
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let rps = match (&w, state.profile.variant(&v.profile_variant)) {
                (Some(w), Ok(pv)) => {
                    let c = capacity::at_slo(pv, w, &slo, &Planning::default()).requests_per_s;
                    if c > 0.0 {
                        c
                    } else {
                        1.0
                    }
                }
                _ => 1.0,
            };
            Entry {
                name: v.name.clone(),
                profile_variant: v.profile_variant.clone(),
                capacity: v.capacity,
                priority: v.priority,
                min: v.min_replicas,
                max: v.max_replicas,
                available: !state.unavailable.contains_key(&v.name),
                keep: view.variants[i].ready(),
                replica_rps: rps,
            }
        })
        .collect()
}

/// A status shape for the pool when a reconcile fails before writing its own.
pub fn failed_status(pool: &ServingPool, e: &Error) -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let mut conds = Conditions::from(
        pool.status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default(),
    );
    conds.set("Degraded", true, "ReconcileFailed", e.to_string(), &now);
    conds.set("Ready", false, "ReconcileFailed", e.to_string(), &now);
    json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "ServingPool",
        "status": {"conditions": conds.into_vec()},
    })
}
