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
use kube::runtime::events::{EventType, Recorder};
use kube::ResourceExt;
use serde_json::json;

use sluice_policy::capacity::{self, Planning, Slo, Workload};
use sluice_policy::decision::Decision;
use sluice_policy::policy::{Policy, Sluice, SluiceConfig, VariantLimits};
use sluice_policy::profile::{CapacityType, Profile};
use sluice_policy::signals::{Signals, VariantSignals};
use sluice_policy::zero::ZeroRule;

use super::allocate::{self, Entry};
use super::error::{Error, Result};
use super::gateway::{GatewayQueue, Windows};
use super::metrics::Metrics;
use super::observe::{self, PoolView};
use super::report;
use super::source::{Load, Query, Reading, SignalSource};
use crate::crd::{NodePoolProviderKind, ServingPool, VariantSpec};
use crate::nodepool::{NodePoolProvider, NodeRequest, Outcome};
use crate::scrape::TtftTarget;

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
    /// What the attainment signal is read against; follows the spec with the policy.
    ttft_target: TtftTarget,
    /// Pod uid → when it was first seen pending.
    pending_since: HashMap<String, f64>,
    /// Variant → (avoided until, condition reason).
    pub(super) unavailable: HashMap<String, (f64, &'static str)>,
    /// Reads `spec.signals.gatewayUrl`.
    gateway: GatewayQueue,
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
    let mut limits: Vec<VariantLimits> = limits;
    if spec.scales_to_zero() {
        // While traffic is recent one replica of the preferred variant stays warm; idle for
        // the scale-down window, the floor falls to zero.
        let first = (0..spec.variants.len()).min_by_key(|&i| (spec.variants[i].priority, i));
        if let Some(l) = first.and_then(|i| {
            limits
                .iter_mut()
                .find(|l| l.variant == spec.variants[i].profile_variant)
        }) {
            l.keep_warm = l.keep_warm.max(1);
        }
    }
    let mut c = SluiceConfig::new(slo, limits);
    if spec.scales_to_zero() {
        c.scale_to_zero_after_s = p.scale_down_stabilisation_seconds;
        if let Some(horizon_s) = p.zero_budget_horizon_seconds {
            c.zero_rule = ZeroRule::ErrorBudget {
                horizon_s,
                miss_share: 1.0 - spec.slo.ttft.percentile / 100.0,
            };
        }
    }
    c.spot = spec
        .variants
        .iter()
        .any(|v| v.capacity == CapacityType::Spot);
    c.ttft_attainment_goal = spec.slo.ttft.percentile / 100.0;
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
            ttft_target: TtftTarget::new(&profile, &policy.config().slo),
            policy,
            profile,
            pending_since: HashMap::new(),
            unavailable: HashMap::new(),
            gateway: GatewayQueue::default(),
        })
    }

    /// Rebuilds the policy when the spec changed (its memory belongs to the old spec).
    fn refresh(&mut self, pool: &ServingPool) -> Result<()> {
        if pool.metadata.generation != self.generation {
            let (policy, profile) = build_policy(pool)?;
            self.ttft_target = TtftTarget::new(&profile, &policy.config().slo);
            self.policy = policy;
            self.profile = profile;
            self.generation = pool.metadata.generation;
        }
        Ok(())
    }
}

/// An Event to record on the pool: type, reason, action, note.
pub(super) type PoolEvent = (EventType, &'static str, &'static str, String);

/// Observe's result: where the pool lives and what the cluster holds for it.
pub(super) struct Observed {
    pub(super) ns: String,
    pub(super) name: String,
    /// `namespace/name`.
    pub(super) key: String,
    pub(super) view: PoolView,
}

/// Bookkeep's result, per spec variant: the oldest pending pod's age and the preempted pods
/// to replace; and the Events the bookkeeping produced.
struct Book {
    oldest_pending: Vec<f64>,
    preempted: Vec<Vec<String>>,
    events: Vec<PoolEvent>,
}

/// Decide's result.
pub(super) struct Decided {
    /// Desired replicas per spec variant.
    pub(super) desired: Vec<u32>,
    /// The policy's decision; `None` when the metrics were stale and the fleet is held.
    pub(super) decision: Option<Decision>,
    /// The allocation's notes (or why the fleet is held).
    pub(super) notes: Vec<String>,
    /// Why the metrics are stale, if they are.
    pub(super) stale_why: Option<String>,
}

impl Decided {
    /// The decision's reasons, then the notes: what status and Events say.
    pub(super) fn reasons(&self) -> Vec<String> {
        self.decision
            .iter()
            .flat_map(|d| d.reasons.iter().map(ToString::to_string))
            .chain(self.notes.iter().cloned())
            .collect()
    }
}

/// Act's result: the Events of scaling and node pools, and a node pool failure, if any (the
/// reconcile still writes status, then fails with it).
struct Acted {
    events: Vec<PoolEvent>,
    failure: Option<Error>,
}

/// Reconciles one pool at `now_s` (the controller's monotonic clock): observe → bookkeep →
/// decide → act → report.
pub async fn reconcile(
    ctx: &Context,
    state: &mut PoolState,
    pool: &ServingPool,
    now_s: f64,
) -> Result<Outcomes> {
    state.refresh(pool)?;
    let obs = observe_pool(ctx, pool).await?;
    let book = bookkeep(state, pool, &obs.view, now_s);
    replace_preempted(ctx, &obs, &book).await?;
    let decided = decide(ctx, state, pool, &obs, &book, now_s).await?;
    let acted = act(ctx, state, pool, &obs, &decided).await?;
    report::count_decisions(ctx, &obs, decided.decision.as_ref());
    let status = report::status(pool, state, &obs, &decided, acted.failure.as_ref());
    let events = book.events.into_iter().chain(acted.events).collect();
    report::report(ctx, pool, &obs, status, events).await?;
    if let Some(e) = acted.failure {
        return Err(e);
    }
    Ok(Outcomes {
        desired: decided.desired,
        stale: decided.stale_why.is_some(),
        decision: decided.decision,
    })
}

/// Observe: the pool's namespace and name, and its Deployments, pods, nodes and endpoints.
async fn observe_pool(ctx: &Context, pool: &ServingPool) -> Result<Observed> {
    let ns = pool
        .namespace()
        .ok_or_else(|| invalid(pool, "a ServingPool is namespaced"))?;
    let name = pool.name_any();
    let view = observe::observe(&ctx.client, pool, &ns).await?;
    Ok(Observed {
        key: format!("{ns}/{name}"),
        ns,
        name,
        view,
    })
}

/// Bookkeep: the pool's memory brought up to date with what was observed — pending pods,
/// back-offs that ran out, stockouts, preemptions.
fn bookkeep(state: &mut PoolState, pool: &ServingPool, view: &PoolView, now_s: f64) -> Book {
    let oldest_pending = track_pending(state, view, now_s);
    let mut events = recover(state, pool, now_s);
    events.extend(mark_stockouts(state, pool, &oldest_pending, now_s));
    let (preempted, preempt_events) = mark_preempted(state, pool, view, now_s);
    events.extend(preempt_events);
    Book {
        oldest_pending,
        preempted,
        events,
    }
}

/// Remembers when each pending pod was first seen and forgets the ones gone; per variant, how
/// long its oldest pending pod has waited.
fn track_pending(state: &mut PoolState, view: &PoolView, now_s: f64) -> Vec<f64> {
    let mut seen = BTreeSet::new();
    let mut oldest_pending = vec![0.0f64; view.variants.len()];
    for (i, vv) in view.variants.iter().enumerate() {
        for p in vv.pods.iter().filter(|p| p.pending && !p.terminating) {
            seen.insert(p.uid.clone());
            let since = *state.pending_since.entry(p.uid.clone()).or_insert(now_s);
            oldest_pending[i] = oldest_pending[i].max(now_s - since);
        }
    }
    state.pending_since.retain(|uid, _| seen.contains(uid));
    oldest_pending
}

/// Back-offs that ran out: the variant may be tried again.
fn recover(state: &mut PoolState, pool: &ServingPool, now_s: f64) -> Vec<PoolEvent> {
    let mut events = Vec::new();
    for v in &pool.spec.variants {
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
    events
}

/// Stockouts: a pod pending past the limit makes its variant unavailable for a while.
fn mark_stockouts(
    state: &mut PoolState,
    pool: &ServingPool,
    oldest_pending: &[f64],
    now_s: f64,
) -> Vec<PoolEvent> {
    let st = &pool.spec.stockout;
    let mut events = Vec::new();
    for (i, v) in pool.spec.variants.iter().enumerate() {
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
    events
}

/// Spot preemptions: the pods to replace at once per variant, and other variants preferred
/// for a while.
fn mark_preempted(
    state: &mut PoolState,
    pool: &ServingPool,
    view: &PoolView,
    now_s: f64,
) -> (Vec<Vec<String>>, Vec<PoolEvent>) {
    let st = &pool.spec.stockout;
    let mut preempted = vec![Vec::new(); pool.spec.variants.len()];
    let mut events = Vec::new();
    for (i, (v, vv)) in pool.spec.variants.iter().zip(&view.variants).enumerate() {
        let gone = vv.preempted();
        if gone.is_empty() {
            continue;
        }
        preempted[i] = gone.iter().map(|p| p.name.clone()).collect();
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
    (preempted, events)
}

/// Deletes the preempted pods so their ReplicaSets recreate them now, before the load is read.
async fn replace_preempted(ctx: &Context, obs: &Observed, book: &Book) -> Result<()> {
    if ctx.dry_run {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &obs.ns);
    for name in book.preempted.iter().flatten() {
        match pods.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(Error::kube(format!("delete pod {name}"))(e)),
        }
    }
    Ok(())
}

/// Decide: the load from the signal source, the policy's decision on it, and its allocation
/// over the spec's variants; with stale metrics, every variant held as it is.
async fn decide(
    ctx: &Context,
    state: &mut PoolState,
    pool: &ServingPool,
    obs: &Observed,
    book: &Book,
    now_s: f64,
) -> Result<Decided> {
    let reading = ctx
        .source
        .read(Query {
            pool: &obs.key,
            namespace: &obs.ns,
            spec: &pool.spec,
            targets: &obs.view.targets,
            now_s,
            ttft_target: state.ttft_target,
        })
        .await?;
    let (reading, held) = with_gateway(state, pool, &obs.view, (reading, now_s)).await;
    Ok(match reading {
        Reading::Stale(why) => Decided {
            desired: obs.view.variants.iter().map(|v| v.replicas).collect(),
            decision: None,
            notes: vec![format!(
                "metrics stale or missing ({why}): holding every variant as it is"
            )],
            stale_why: Some(why),
        },
        Reading::Fresh(mut load) => {
            let ttft_quantile = pool.spec.slo.ttft.percentile / 100.0;
            load.fold_front_door(ttft_quantile, state.ttft_target);
            let preempted: Vec<u32> = book.preempted.iter().map(|p| p.len() as u32).collect();
            let signals = signals(
                pool,
                &obs.view,
                &load,
                &book.oldest_pending,
                &preempted,
                now_s,
            );
            let d = state.policy.decide(&signals);
            let entries = entries(pool, state, &obs.view, &d);
            let mut a = allocate::allocate(&d, &entries);
            a.notes
                .extend(wake(&entries, &mut a.desired, held, &pool.spec.model));
            Decided {
                desired: a.desired,
                decision: Some(d),
                notes: a.notes,
                stale_why: None,
            }
        }
    })
}

/// Every variant's Deployment at zero, none of its pods ready or starting.
fn at_zero(view: &PoolView) -> bool {
    view.variants
        .iter()
        .all(|v| v.replicas == 0 && v.ready() + v.starting() == 0)
}

/// The load a pool at zero replicas has: nothing on replicas, over the spec's windows.
fn idle_load(pool: &ServingPool) -> Load {
    let mut l = Load::default();
    l.arrivals.window_s = pool.spec.policy.window_seconds;
    l.arrivals.short_window_s = pool.spec.policy.short_window_seconds;
    l
}

/// The reading with the gateway's queue for the pool's model (`spec.signals.gatewayUrl`)
/// added to what waits, its prompt tokens per second and its front door (`scrape::front_door`:
/// what it refused and the wait in its queue, which no replica shows) where the source had
/// none, and the requests the gateway has for the model. A pool at zero has no replica to
/// read, so its sources are stale: with a gateway, its load is the gateway's queue alone. A
/// gateway that cannot be read makes the reading stale (the pool holds).
async fn with_gateway(
    state: &mut PoolState,
    pool: &ServingPool,
    view: &PoolView,
    (reading, now_s): (Reading, f64),
) -> (Reading, u64) {
    let Some(url) = pool.spec.signals.gateway_url.as_deref() else {
        return (reading, 0);
    };
    let p = &pool.spec.policy;
    let windows = Windows {
        now_s,
        long_s: p.window_seconds,
        short_s: p.short_window_seconds,
        latency_s: p.window_seconds,
        shape_s: p.shape_window_seconds,
    };
    let g = match state.gateway.read(url, &pool.spec.model, windows).await {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(pool = %pool.name_any(), gateway = url, error = %e, "gateway metrics");
            return (Reading::Stale(format!("gateway {url}: {e}")), 0);
        }
    };
    let held = g.queue.total().round() as u64;
    let reading = match reading {
        Reading::Stale(_) if at_zero(view) => Reading::Fresh(Box::new(idle_load(pool))),
        r => r,
    };
    match reading {
        Reading::Fresh(mut load) => {
            load.queue.waiting += held;
            if load.arrivals.per_second.is_none() {
                load.arrivals.per_second = g.per_second;
            }
            if load.front_door.is_none() {
                load.front_door = g.front_door;
            }
            (Reading::Fresh(load), held)
        }
        r => (r, held),
    }
}

/// A pool whose targets are all zero while the gateway holds requests for its model gets one
/// replica of its preferred available variant at once, whatever the policy's windows say.
fn wake(entries: &[Entry], desired: &mut [u32], held: u64, model: &str) -> Option<String> {
    if held == 0 || desired.iter().any(|&d| d > 0) {
        return None;
    }
    let i = (0..entries.len())
        .filter(|&i| entries[i].available && entries[i].max > 0)
        .min_by_key(|&i| (entries[i].priority, i))?;
    desired[i] = 1;
    Some(format!(
        "{held} requests for {model} held in the gateway at zero replicas: one {} replica now",
        entries[i].name
    ))
}

/// Act: each variant's Deployment scaled to its desired replicas, and its node pool sized.
async fn act(
    ctx: &Context,
    state: &PoolState,
    pool: &ServingPool,
    obs: &Observed,
    decided: &Decided,
) -> Result<Acted> {
    let reasons = decided.reasons();
    let mut events = Vec::new();
    let mut failure = None;
    for (i, v) in pool.spec.variants.iter().enumerate() {
        let current = obs.view.variants[i].replicas;
        let want = decided.desired[i];
        let labels = [obs.ns.as_str(), obs.name.as_str(), v.name.as_str()];
        ctx.metrics
            .desired
            .with_label_values(&labels)
            .set(i64::from(want));
        ctx.metrics
            .current
            .with_label_values(&labels)
            .set(i64::from(current));
        if want != current {
            events.push(scale(ctx, obs, v, current, want, &reasons).await?);
        }
        // A pool gone to zero leaves its GKE node pool to the provider's own scale-down (one
        // that wakes soon finds the nodes still there); unwanted ProvisioningRequests still go.
        let leave = want == 0
            && pool.spec.scales_to_zero()
            && v.node_pool.provider == NodePoolProviderKind::Gke;
        if v.node_pool.provider == NodePoolProviderKind::None || ctx.dry_run || leave {
            continue;
        }
        let req = node_request(state, obs, i, v, want)?;
        match ensure_nodes(ctx, v, &req).await {
            Ok(Outcome::Unchanged) => {}
            Ok(Outcome::Changed(said)) => events.push((
                EventType::Normal,
                "NodePoolResized",
                "RequestNodes",
                format!("{}: {said}", v.name),
            )),
            Err(e) => failure = Some(e),
        }
        // A failure stays reported for every later variant with a node pool this reconcile.
        if let Some(e) = &failure {
            ctx.metrics
                .reconcile_errors
                .with_label_values(&[obs.ns.as_str(), obs.name.as_str(), e.metric_label()])
                .inc();
            events.push((
                EventType::Warning,
                "NodePoolFailed",
                "RequestNodes",
                format!("{}: {e}", v.name),
            ));
        }
    }
    Ok(Acted { events, failure })
}

/// Scales one variant's Deployment from `current` to `want` (logged only in a dry run); the
/// Event that says so.
async fn scale(
    ctx: &Context,
    obs: &Observed,
    v: &VariantSpec,
    current: u32,
    want: u32,
    reasons: &[String],
) -> Result<PoolEvent> {
    let dir = if want > current { "up" } else { "down" };
    tracing::info!(pool = %obs.key, variant = %v.name, from = current, to = want, dry_run = ctx.dry_run, "scale");
    if !ctx.dry_run {
        let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &obs.ns);
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
            .with_label_values(&[obs.ns.as_str(), obs.name.as_str(), v.name.as_str(), dir])
            .inc();
    }
    Ok((
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
            summary(reasons)
        ),
    ))
}

/// What variant `v` (spec variant `i`)'s node pool must hold for `want` replicas.
fn node_request(
    state: &PoolState,
    obs: &Observed,
    i: usize,
    v: &VariantSpec,
    want: u32,
) -> Result<NodeRequest> {
    let pv = state
        .profile
        .variant(&v.profile_variant)
        .map_err(|source| Error::Profile {
            name: obs.name.clone(),
            source: Box::new(source),
        })?;
    let per_node = pv.replicas_per_node().max(1);
    let vv = &obs.view.variants[i];
    Ok(NodeRequest {
        namespace: obs.ns.clone(),
        serving_pool: obs.name.clone(),
        variant: v.name.clone(),
        deployment: v.deployment.clone(),
        node_pool: v.node_pool.name.clone().unwrap_or_default(),
        gke_mode: v.node_pool.gke_mode,
        replicas: want,
        nodes: want.div_ceil(per_node),
        current_replicas: vv.replicas,
        scheduled_replicas: vv.ready() + vv.starting(),
        gpus_per_replica: pv.gpus_per_replica,
    })
}

/// Asks the variant's node pool provider for the nodes `req` needs.
async fn ensure_nodes(ctx: &Context, v: &VariantSpec, req: &NodeRequest) -> Result<Outcome> {
    let provider = match v.node_pool.provider {
        NodePoolProviderKind::Gke => ctx.gke.as_ref().ok_or_else(|| Error::NodePool {
            provider: "gke",
            pool: req.node_pool.clone(),
            message:
                "the gke provider is not configured (--gke-project, --gke-location, --gke-cluster)"
                    .into(),
        })?,
        _ => &ctx.provisioning,
    };
    provider.ensure(req).await
}

fn summary(reasons: &[String]) -> String {
    if reasons.is_empty() {
        "no reason recorded".into()
    } else {
        reasons.join("; ")
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `policy.zeroBudgetHorizonSeconds` on a pool that scales to zero selects the error-budget
    /// rule, its miss share from the TTFT percentile; absent, idle is enough.
    #[test]
    fn the_zero_budget_horizon_selects_the_error_budget_rule() {
        let mut pool: ServingPool = serde_yaml::from_str(include_str!(
            "../../../deploy/k8s/crd/example-servingpool-zero.yaml"
        ))
        .unwrap();
        let (p, _) = build_policy(&pool).unwrap();
        assert_eq!(p.config().zero_rule, ZeroRule::Idle);
        pool.spec.policy.zero_budget_horizon_seconds = Some(86_400.0);
        pool.spec.slo.ttft.percentile = 95.0;
        let (p, _) = build_policy(&pool).unwrap();
        match p.config().zero_rule {
            ZeroRule::ErrorBudget {
                horizon_s,
                miss_share,
            } => {
                assert_eq!(horizon_s, 86_400.0);
                assert!((miss_share - 0.05).abs() < 1e-12, "{miss_share}");
            }
            other => panic!("{other:?}"),
        }
    }
}
