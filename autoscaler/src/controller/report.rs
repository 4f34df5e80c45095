//! Report, a reconcile's last step: the pool's whole status (each variant's replicas and
//! availability, the last decision, the conditions) applied server-side and the Events
//! recorded; the decisions counted in the controller's metrics; and the status written when a
//! reconcile fails before its own.

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::Event;
use kube::Resource;
use serde_json::json;

use sluice_policy::decision::Decision;

use super::error::{Error, Result};
use super::reconcile::{Context, Decided, Observed, PoolEvent, PoolState};
use super::status::Conditions;
use crate::crd::{Condition, DecisionStatus, ServingPool, ServingPoolStatus, VariantStatus};

/// Counts the decision's reasons by kind in the controller's metrics.
pub(super) fn count_decisions(ctx: &Context, obs: &Observed, decision: Option<&Decision>) {
    for r in decision.iter().flat_map(|d| &d.reasons) {
        let kind = serde_json::to_value(r.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        ctx.metrics
            .decisions
            .with_label_values(&[obs.ns.as_str(), obs.name.as_str(), kind.as_str()])
            .inc();
    }
}

/// The pool's whole status: each variant's replicas and availability, the last decision, and
/// the conditions.
pub(super) fn status(
    pool: &ServingPool,
    state: &PoolState,
    obs: &Observed,
    decided: &Decided,
    failure: Option<&Error>,
) -> ServingPoolStatus {
    let now_wall = k8s_openapi::jiff::Timestamp::now().to_string();
    let conditions = conditions(pool, state, obs, decided, failure, &now_wall);
    let decision = decided.decision.as_ref();
    ServingPoolStatus {
        observed_generation: pool.metadata.generation,
        variants: pool
            .spec
            .variants
            .iter()
            .zip(&obs.view.variants)
            .zip(&decided.desired)
            .map(|((v, vv), &desired)| {
                let un = state.unavailable.get(&v.name);
                VariantStatus {
                    name: v.name.clone(),
                    desired,
                    current: vv.replicas,
                    ready: vv.ready(),
                    pending: vv.pending(),
                    available: un.is_none(),
                    unavailable_reason: un.map(|(_, why)| why.to_string()),
                }
            })
            .collect(),
        last_decision: Some(DecisionStatus {
            time: now_wall,
            mode: decision.map_or("hold".into(), |d| {
                serde_json::to_value(d.mode)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            }),
            planned_requests_per_second: decision.map_or(0.0, |d| d.demand.planned_requests_per_s),
            reasons: decided.reasons(),
        }),
        conditions,
    }
}

/// The conditions `Ready`, `MetricsStale`, `Stockout` and `Degraded`, updated from the pool's
/// current ones.
fn conditions(
    pool: &ServingPool,
    state: &PoolState,
    obs: &Observed,
    decided: &Decided,
    failure: Option<&Error>,
    now_wall: &str,
) -> Vec<Condition> {
    let mut conds = current_conditions(pool);
    let at_target = obs
        .view
        .variants
        .iter()
        .zip(&decided.desired)
        .all(|(vv, &want)| vv.ready() >= want);
    conds.set(
        "Ready",
        at_target,
        if at_target { "AtTarget" } else { "Scaling" },
        if at_target {
            "every variant has its desired replicas ready".into()
        } else {
            "replicas starting or pending".into()
        },
        now_wall,
    );
    let stale = decided.stale_why.is_some();
    conds.set(
        "MetricsStale",
        stale,
        if stale { "NoFreshMetrics" } else { "Fresh" },
        match &decided.stale_why {
            Some(why) => format!("no fresh metrics from the signal source ({why}): holding"),
            None => String::new(),
        },
        now_wall,
    );
    let mut stocked: Vec<&str> = state
        .unavailable
        .iter()
        .filter(|(_, (_, why))| *why == "Stockout")
        .map(|(n, _)| n.as_str())
        .collect();
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
        now_wall,
    );
    let (degraded, reason, message) = degraded(&decided.notes, failure);
    conds.set("Degraded", degraded, reason, message, now_wall);
    conds.into_vec()
}

/// The pool's conditions as its status holds them now, to be updated.
fn current_conditions(pool: &ServingPool) -> Conditions {
    Conditions::from(
        pool.status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default(),
    )
}

/// The `Degraded` condition: a node pool failed, or demand had nowhere to go.
fn degraded(notes: &[String], failure: Option<&Error>) -> (bool, &'static str, String) {
    let nowhere = notes.iter().any(|n| n.contains("nowhere"));
    if let Some(e) = failure {
        (true, "NodePoolFailed", e.to_string())
    } else if nowhere {
        (true, "OutOfCapacity", notes.join("; "))
    } else {
        (false, "AsPlanned", String::new())
    }
}

/// Report: the status applied and the Events recorded (logged only in a dry run).
pub(super) async fn report(
    ctx: &Context,
    pool: &ServingPool,
    obs: &Observed,
    status: ServingPoolStatus,
    events: Vec<PoolEvent>,
) -> Result<()> {
    let key = &obs.key;
    if ctx.dry_run {
        for (_, reason, _, note) in &events {
            tracing::info!(pool = %key, reason, note, "dry run: would record");
        }
        return Ok(());
    }
    let api: Api<ServingPool> = Api::namespaced(ctx.client.clone(), &obs.ns);
    api.patch_status(
        &obs.name,
        &PatchParams::apply("sluice-autoscaler").force(),
        &Patch::Apply(json!({
            "apiVersion": "sluice.dev/v1alpha1",
            "kind": "ServingPool",
            "status": status,
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
    Ok(())
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

/// A status shape for the pool when a reconcile fails before writing its own.
pub fn failed_status(pool: &ServingPool, e: &Error) -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let mut conds = current_conditions(pool);
    conds.set("Degraded", true, "ReconcileFailed", e.to_string(), &now);
    conds.set("Ready", false, "ReconcileFailed", e.to_string(), &now);
    json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "ServingPool",
        "status": {"conditions": conds.into_vec()},
    })
}
