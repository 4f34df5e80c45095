//! The Kubernetes controller against an in-process fake API server (see `fake_k8s` for what it
//! serves and leaves out), through a real `kube::Client`. Load comes from a [`FakeSource`] the
//! test sets (scraping is tested with the scraper), and reconciles are driven at chosen times
//! on the controller's clock, so windows and back-offs are exercised without waiting; only the
//! leader-failover test runs the real loop (with a one-second Lease).

mod fake_gateway;
mod fake_k8s;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake_gateway::fake_gateway;
use fake_k8s::*;
use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use sluice_autoscaler::controller::metrics::Metrics;
use sluice_autoscaler::controller::source::{
    Load, Query, Reading, ReplicaPod, SignalSource, VariantLoad,
};
use sluice_autoscaler::controller::{Config, Context, Controller, LeaseConfig, Recorder, Reporter};
use sluice_autoscaler::nodepool::gke::{Gke, GkeConfig};
use sluice_autoscaler::nodepool::provisioning::ProvisioningRequests;
use sluice_autoscaler::nodepool::NodePoolProvider;
use sluice_autoscaler::scrape::front_door::{FrontDoor, FrontDoorWindows};

const NS: &str = "llm";

/// Load the test sets; `None` means no fresh metrics.
#[derive(Debug, Default)]
struct FakeSource {
    load: Mutex<Option<Load>>,
    reads: Mutex<Vec<Vec<ReplicaPod>>>,
}

impl FakeSource {
    fn set(&self, l: Option<Load>) {
        *self.load.lock().unwrap() = l;
    }
}

impl SignalSource for FakeSource {
    fn read<'a>(
        &'a self,
        q: Query<'a>,
    ) -> BoxFuture<'a, sluice_autoscaler::controller::error::Result<Reading>> {
        self.reads.lock().unwrap().push(q.targets.to_vec());
        let l = self.load.lock().unwrap().clone();
        Box::pin(async move {
            Ok(match l {
                Some(l) => Reading::Fresh(Box::new(l)),
                None => Reading::Stale("the test set no load".into()),
            })
        })
    }
}

/// `rps` requests/s of 500 prompt + 100 output tokens, `waiting` queued, over a 10 s window.
fn load(rps: f64, waiting: u64) -> Load {
    let mut l = Load::default();
    l.arrivals.window_s = 10.0;
    l.arrivals.requests_per_s = rps;
    l.arrivals.prompt_tokens_per_s = rps * 500.0;
    l.arrivals.output_tokens_per_s = rps * 100.0;
    l.arrivals.short_window_s = 5.0;
    l.arrivals.short_requests_per_s = rps;
    l.arrivals.max_prompt_tokens = 500;
    l.queue.waiting = waiting;
    l.queue.running = (rps * 4.0) as u64;
    l.variants.insert("l4".into(), VariantLoad::default());
    l
}

struct Harness {
    fake: Arc<Fake>,
    source: Arc<FakeSource>,
    controller: Controller,
}

fn context(
    fake: &Fake,
    source: Arc<FakeSource>,
    dry_run: bool,
    gke: Option<Arc<dyn NodePoolProvider>>,
) -> Context {
    let client = fake.client();
    Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "sluice-autoscaler".into(),
                instance: Some("test".into()),
            },
        ),
        provisioning: Arc::new(ProvisioningRequests::new(client.clone())),
        client,
        source,
        gke,
        metrics: Metrics::new(),
        dry_run,
    }
}

fn config() -> Config {
    Config {
        namespace: Some(NS.into()),
        period: Duration::from_millis(100),
        lease: None,
        backoff_base: Duration::from_secs(5),
        backoff_max: Duration::from_secs(60),
    }
}

/// A ServingPool over `variants` (JSON), with test-short windows.
fn pool(variants: Value) -> Value {
    json!({"apiVersion": "sluice.dev/v1alpha1", "kind": "ServingPool",
        "metadata": {"name": "llama", "namespace": NS, "generation": 1},
        "spec": {"model": "llama-3-8b", "profile": "llama-3-8b",
            "slo": {"ttft": {"percentile": 99, "targetSeconds": 2.0},
                    "tpot": {"percentile": 99, "targetSeconds": 0.2}},
            "variants": variants,
            "signals": {"scrape": {"service": "replicas", "port": "http", "path": "/metrics"}},
            "policy": {"windowSeconds": 10, "shortWindowSeconds": 5,
                "scaleDownStabilisationSeconds": 60, "panicThreshold": 1.5,
                "panicWindowSeconds": 20, "headroom": 0.2},
            "stockout": {"pendingLimitSeconds": 30, "backoffSeconds": 100,
                "spotPreemptionBackoffSeconds": 100}}})
}

fn variant(name: &str, pv: &str, capacity: &str, priority: i32, min: u32, max: u32) -> Value {
    json!({"name": name, "deployment": name, "profileVariant": pv, "capacity": capacity,
        "priority": priority, "minReplicas": min, "maxReplicas": max})
}

async fn harness(variants: Value, replicas: &[(&str, u32)], dry_run: bool) -> Harness {
    let fake = Fake::start().await;
    fake.put(NODES, node("node-a", &[]));
    for (d, n) in replicas {
        fake.put(DEPLOYMENTS, deployment(NS, d, *n));
        fake.sync_pods(NS, d, Some("node-a"));
    }
    fake.put(POOLS, pool(variants));
    let source = Arc::new(FakeSource::default());
    let ctx = context(&fake, source.clone(), dry_run, None);
    Harness {
        controller: Controller::new(ctx, config()),
        fake,
        source,
    }
}

impl Harness {
    /// One reconcile of the pool at `t`; its desired replicas per variant.
    async fn tick(&mut self, t: f64) -> Vec<u32> {
        let r = self.controller.reconcile_all(t).await.unwrap();
        assert_eq!(r.len(), 1, "one pool reconciled at t={t}");
        match &r[0].1 {
            Ok(o) => o.desired.clone(),
            Err(e) => panic!("reconcile at t={t}: {e:?}"),
        }
    }
    fn replicas(&self, d: &str) -> u64 {
        self.fake.get(DEPLOYMENTS, NS, d).unwrap()["spec"]["replicas"]
            .as_u64()
            .unwrap()
    }
    fn status(&self) -> Value {
        self.fake.get(POOLS, NS, "llama").unwrap()["status"].clone()
    }
    fn condition(&self, t: &str) -> (String, String) {
        let s = self.status();
        let c = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == t)
            .unwrap_or_else(|| panic!("condition {t} in {s}"))
            .clone();
        (
            c["status"].as_str().unwrap().into(),
            c["reason"].as_str().unwrap().into(),
        )
    }
    fn event_reasons(&self) -> Vec<String> {
        self.fake
            .list(EVENTS)
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or("").to_string())
            .collect()
    }
}

/// Scale-up on queue depth: a deep queue at a modest rate grows the L4 Deployment through its
/// `scale` subresource at once, with an Event and the status saying so; a second reconcile on
/// the same figures changes nothing (idempotent).
#[tokio::test]
async fn scale_up_on_queue_depth() {
    let mut h = harness(
        json!([variant("l4", "nvidia-l4", "on-demand", 0, 1, 20)]),
        &[("l4", 1)],
        false,
    )
    .await;
    h.source.set(Some(load(1.5, 0)));
    let calm = h.tick(0.0).await;
    h.source.set(Some(load(1.5, 1000)));
    let desired = h.tick(1.0).await;
    assert!(
        desired[0] > calm[0].max(1),
        "queue of 1000 grows the fleet: {calm:?} → {desired:?} {}",
        h.status()
    );
    assert_eq!(h.replicas("l4"), u64::from(desired[0]));
    let scale_writes = |h: &Harness| {
        h.fake
            .writes()
            .iter()
            .filter(|(_, p)| p.ends_with("/deployments/l4/scale"))
            .count()
    };
    let before = scale_writes(&h);
    assert!(before >= 1);
    assert!(
        h.event_reasons().contains(&"ScaledUp".to_string()),
        "{:?}",
        h.event_reasons()
    );
    let st = h.status();
    assert_eq!(st["variants"][0]["desired"], desired[0]);
    assert!(
        st["lastDecision"]["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap().contains("[backlog]")),
        "{st}"
    );
    // The same figures again: the Deployment already has what is wanted, no write.
    let again = h.tick(1.0).await;
    assert_eq!(again, desired);
    assert_eq!(
        scale_writes(&h),
        before,
        "an unchanged target is not written again"
    );
    // The endpoints the source was given are the pool Service's ready pods only (none here).
    assert!(h.source.reads.lock().unwrap().iter().all(|r| r.is_empty()));
}

/// Scale-down only after the (test-shortened, 60 s) stabilisation window: after load falls,
/// the fleet holds for the window, then shrinks.
#[tokio::test]
async fn scale_down_only_after_stabilisation() {
    let mut h = harness(
        json!([variant("l4", "nvidia-l4", "on-demand", 0, 1, 40)]),
        &[("l4", 1)],
        false,
    )
    .await;
    let mut t = 0.0;
    let mut peak = 0;
    for _ in 0..4 {
        h.source.set(Some(load(20.0, 0)));
        peak = h.tick(t).await[0];
        h.fake.sync_pods(NS, "l4", Some("node-a"));
        t += 10.0;
    }
    assert!(peak > 2, "20 req/s needs several L4s: {peak}");
    let dropped_at = t;
    let mut first_lower = None;
    while t < dropped_at + 200.0 {
        h.source.set(Some(load(0.5, 0)));
        let d = h.tick(t).await[0];
        h.fake.sync_pods(NS, "l4", Some("node-a"));
        if d < peak && first_lower.is_none() {
            first_lower = Some(t);
        }
        t += 10.0;
    }
    let at = first_lower.expect("the fleet shrinks once the window has passed");
    assert!(
        at - dropped_at >= 60.0,
        "no scale-down within the 60 s window (shrank {} s after the drop)",
        at - dropped_at
    );
    assert!(h.replicas("l4") < u64::from(peak));
    assert!(h.event_reasons().contains(&"ScaledDown".to_string()));
}

/// Stale metrics hold: with no fresh figures the controller writes no scale, whatever the
/// policy would say, and reports `MetricsStale`; fresh figures clear it.
#[tokio::test]
async fn stale_metrics_hold() {
    let mut h = harness(
        json!([variant("l4", "nvidia-l4", "on-demand", 0, 0, 20)]),
        &[("l4", 6)],
        false,
    )
    .await;
    h.source.set(None);
    for t in [0.0, 100.0, 1000.0, 5000.0] {
        assert_eq!(h.tick(t).await, vec![6]);
    }
    assert_eq!(h.replicas("l4"), 6);
    assert!(!h.fake.writes().iter().any(|(_, p)| p.ends_with("/scale")));
    assert_eq!(h.condition("MetricsStale").0, "True");
    // The condition says why, in the source's words.
    let stale = h.status()["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "MetricsStale")
        .unwrap()["message"]
        .to_string();
    assert!(stale.contains("the test set no load"), "{stale}");
    h.source.set(Some(load(1.0, 0)));
    h.tick(5010.0).await;
    assert_eq!(h.condition("MetricsStale").0, "False");
}

/// A pool whose signals come from Prometheus is read by its ready pods' names (no endpoints
/// to scrape): a pod that is not ready is left out, and each carries its variant.
#[tokio::test]
async fn prometheus_pools_are_read_by_ready_pod_names() {
    let mut h = harness(
        json!([
            variant("l4", "nvidia-l4", "on-demand", 0, 0, 20),
            variant("h100", "nvidia-h100-80gb", "on-demand", 1, 0, 4)
        ]),
        &[("l4", 2), ("h100", 1)],
        false,
    )
    .await;
    let mut p = h.fake.get(POOLS, NS, "llama").unwrap();
    p["spec"]["signals"] = json!({"prometheusUrl": "http://prometheus.monitoring:9090"});
    h.fake.put(POOLS, p);
    let mut unready = h.fake.get(PODS, NS, "l4-1").unwrap();
    unready["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
    h.fake.put(PODS, unready);
    h.source.set(Some(load(1.0, 0)));
    h.tick(0.0).await;
    let reads = h.source.reads.lock().unwrap().clone();
    let got: Vec<(String, String, String)> = reads
        .last()
        .unwrap()
        .iter()
        .map(|t| (t.pod.clone(), t.variant.clone(), t.url.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("h100-0".to_string(), "h100".to_string(), String::new()),
            ("l4-0".to_string(), "l4".to_string(), String::new()),
        ]
    );
}

/// Stockout fallback and recovery: L4 Spot pods pending past the limit mark it out of stock;
/// its demand moves to L4 on demand (next by priority) with a `Stockout` condition and Event;
/// after the back-off it is available again and the condition clears.
#[tokio::test]
async fn stockout_fallback_to_next_variant_and_recovery() {
    let vs = json!([
        variant("l4-spot", "nvidia-l4", "spot", 0, 0, 20),
        variant("l4", "nvidia-l4", "on-demand", 1, 0, 20),
    ]);
    let mut h = harness(vs, &[("l4-spot", 0), ("l4", 0)], false).await;
    h.source.set(Some(load(8.0, 0)));
    let d = h.tick(0.0).await;
    assert!(d[0] > 0 && d[1] == 0, "Spot first: {d:?}");
    // No Spot capacity: the pods stay pending.
    h.fake.sync_pods(NS, "l4-spot", None);
    let d = h.tick(10.0).await;
    assert!(d[0] > 0, "pending 10 s is not yet a stockout: {d:?}");
    assert_eq!(h.condition("Stockout").0, "False");
    let d = h.tick(45.0).await;
    assert_eq!(
        d[0], 0,
        "out of stock: pending Spot replicas are given up: {d:?}"
    );
    assert!(d[1] > 0, "demand moved to on-demand L4: {d:?}");
    assert_eq!(
        (h.replicas("l4-spot"), h.replicas("l4")),
        (0, u64::from(d[1]))
    );
    assert_eq!(
        h.condition("Stockout"),
        ("True".into(), "PendingTooLong".into())
    );
    assert!(h.event_reasons().contains(&"Stockout".to_string()));
    assert_eq!(h.status()["variants"][0]["available"], false);
    h.fake.sync_pods(NS, "l4-spot", None);
    h.fake.sync_pods(NS, "l4", Some("node-a"));
    // Within the back-off it stays avoided.
    let d = h.tick(100.0).await;
    assert_eq!(d[0], 0);
    // After it (45 + 100 s), the variant is tried again.
    h.tick(150.0).await;
    assert_eq!(h.condition("Stockout").0, "False");
    assert_eq!(h.status()["variants"][0]["available"], true);
    assert!(h.event_reasons().contains(&"VariantAvailable".to_string()));
}

/// Spot preemption: the node under two ready Spot replicas gets GKE's termination taint; the
/// controller deletes those pods at once (their ReplicaSet replaces them), avoids Spot for the
/// back-off, and puts the demand on on-demand L4; a deleted node counts the same.
#[tokio::test]
async fn spot_preemption_replacement() {
    let vs = json!([
        variant("l4-spot", "nvidia-l4", "spot", 0, 0, 20),
        variant("l4", "nvidia-l4", "on-demand", 1, 0, 20),
    ]);
    let mut h = harness(vs, &[("l4-spot", 0), ("l4", 0)], false).await;
    h.fake.put(NODES, node("spot-1", &[]));
    h.source.set(Some(load(4.0, 0)));
    let d = h.tick(0.0).await;
    assert!(d[0] >= 2 && d[1] == 0, "{d:?}");
    h.fake.sync_pods(NS, "l4-spot", Some("spot-1"));
    let spot_pods = d[0] as usize;
    let d = h.tick(10.0).await;
    assert_eq!(d[1], 0, "steady on Spot: {d:?}");
    // Reclaim notice.
    h.fake.put(
        NODES,
        node("spot-1", &["cloud.google.com/impending-node-termination"]),
    );
    let d = h.tick(11.0).await;
    let spot_pods_left = h
        .fake
        .list(PODS)
        .iter()
        .filter(|p| p["metadata"]["labels"]["app"] == "l4-spot")
        .count();
    assert_eq!(
        spot_pods_left, 0,
        "all {spot_pods} pods on the reclaimed node deleted"
    );
    assert_eq!(d[0], 0, "Spot avoided after the preemption: {d:?}");
    assert!(d[1] >= 2, "replaced on demand at once: {d:?}");
    assert_eq!(h.replicas("l4"), u64::from(d[1]));
    assert!(h.event_reasons().contains(&"NodePreempted".to_string()));
    assert_eq!(
        h.status()["variants"][0]["unavailableReason"],
        "SpotPreempted"
    );
    // A deleted node: pods bound to it are replaced too.
    h.fake.sync_pods(NS, "l4", Some("od-1"));
    let before = h.fake.list(PODS).len();
    assert!(before >= 2);
    h.tick(20.0).await;
    assert_eq!(
        h.fake.list(PODS).len(),
        0,
        "pods on a node that does not exist are replaced"
    );
}

/// Gang replicas request whole nodes: the 8×H100 variant (8 GPUs per replica and per node)
/// grows through one all-or-nothing ProvisioningRequest for exactly the added replicas, with
/// the Deployment's pod template copied into a PodTemplate; reconciling again asks nothing
/// new. The same variant on the `gke` provider sets its node pool to one node per replica,
/// authenticated with the metadata server's token.
#[tokio::test]
async fn gang_replicas_request_whole_nodes() {
    let mut v = variant("h100x8", "nvidia-h100-80gb-x8", "on-demand", 0, 0, 10);
    v["nodePool"] =
        json!({"provider": "provisioning-request", "name": "queued-provisioning.gke.io"});
    let mut h = harness(json!([v]), &[("h100x8", 0)], false).await;
    let mut l = load(60.0, 0);
    l.variants.clear();
    h.source.set(Some(l.clone()));
    let d = h.tick(0.0).await;
    assert!(d[0] >= 1, "{d:?}");
    let prs = h.fake.list(PROVISIONING);
    assert_eq!(prs.len(), 1, "{prs:?}");
    let pr = &prs[0];
    assert_eq!(
        pr["spec"]["provisioningClassName"],
        "queued-provisioning.gke.io"
    );
    assert_eq!(pr["spec"]["podSets"][0]["count"], d[0]);
    let tmpl = pr["spec"]["podSets"][0]["podTemplateRef"]["name"]
        .as_str()
        .unwrap();
    let pt = h
        .fake
        .get(PODTEMPLATES, NS, tmpl)
        .expect("the pod template exists");
    assert_eq!(
        pt["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "8"
    );
    assert!(h.event_reasons().contains(&"NodePoolResized".to_string()));
    h.source.set(Some(l.clone()));
    h.tick(1.0).await;
    assert_eq!(
        h.fake.list(PROVISIONING).len(),
        1,
        "no second request for the same target"
    );

    // Requests that are over are removed with their PodTemplates: a failed one (and, still
    // wanted, asked for afresh under the same name), one for more replicas than are wanted
    // now, and one whose replicas are all ready.
    let name = pr["metadata"]["name"].as_str().unwrap().to_string();
    let mut failed = h.fake.get(PROVISIONING, NS, &name).unwrap();
    failed["status"] = json!({"conditions": [{"type": "Failed", "status": "True"}]});
    h.fake.put(PROVISIONING, failed);
    let mut stale = pr.clone();
    stale["metadata"] = json!({"name": "h100x8-to-99", "namespace": NS, "labels": {
        "sluice.dev/serving-pool": "llama", "sluice.dev/variant": "h100x8",
        "sluice.dev/target-replicas": "99"}});
    h.fake.put(PROVISIONING, stale);
    let mut other = pr.clone();
    other["metadata"] = json!({"name": "someone-elses", "namespace": NS, "labels": {
        "sluice.dev/target-replicas": "1"}});
    h.fake.put(PROVISIONING, other);
    h.source.set(Some(l.clone()));
    h.tick(2.0).await;
    let names = |h: &Harness| -> Vec<String> {
        let mut v: Vec<String> = h
            .fake
            .list(PROVISIONING)
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&h), vec![name.clone(), "someone-elses".to_string()]);
    let again = h.fake.get(PROVISIONING, NS, &name).unwrap();
    assert!(again["status"].is_null(), "asked afresh: {again}");
    // The replicas come up: the request's capacity is in use, so it goes, template and all.
    h.fake.sync_pods(NS, "h100x8", Some("node-a"));
    h.source.set(Some(l.clone()));
    h.tick(3.0).await;
    assert_eq!(names(&h), vec!["someone-elses".to_string()]);
    assert!(h.fake.get(PODTEMPLATES, NS, &name).is_none());

    // The GKE provider for the same gang.
    let gke = FakeGke::start().await;
    let fake = Fake::start().await;
    fake.put(NODES, node("node-a", &[]));
    fake.put(DEPLOYMENTS, deployment(NS, "h100x8", 0));
    let mut v = variant("h100x8", "nvidia-h100-80gb-x8", "on-demand", 0, 0, 10);
    v["nodePool"] = json!({"provider": "gke", "name": "h100-pool"});
    fake.put(POOLS, pool(json!([v])));
    let source = Arc::new(FakeSource::default());
    source.set(Some(l));
    let provider = Gke::new(GkeConfig {
        project: "p".into(),
        location: "us-central1".into(),
        cluster: "c".into(),
        api_url: gke.url(),
        metadata_url: gke.url(),
    })
    .unwrap();
    let ctx = context(&fake, source, false, Some(Arc::new(provider)));
    let mut c = Controller::new(ctx, config());
    let r = c.reconcile_all(0.0).await.unwrap();
    let desired = r[0].1.as_ref().unwrap().desired[0];
    let calls = gke.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0].0,
        "/v1/projects/p/locations/us-central1/clusters/c/nodePools/h100-pool:setSize"
    );
    assert_eq!(
        calls[0].1,
        json!({"nodeCount": desired}),
        "one whole node per 8-GPU replica"
    );
    c.reconcile_all(1.0).await.unwrap();
    assert_eq!(
        gke.calls.lock().unwrap().len(),
        1,
        "an unchanged size is not set again"
    );
    assert_eq!(
        *gke.token_requests.lock().unwrap(),
        1,
        "the token is cached"
    );
}

/// Dry run changes nothing: a scale-up and a Spot reclaim are decided and logged, but no
/// object is written (no scale, pod deletion, status, Event or ProvisioningRequest).
#[tokio::test]
async fn dry_run_changes_nothing() {
    let vs = json!([
        variant("l4-spot", "nvidia-l4", "spot", 0, 0, 20),
        variant("l4", "nvidia-l4", "on-demand", 1, 1, 20),
    ]);
    let mut h = harness(vs, &[("l4-spot", 1), ("l4", 1)], true).await;
    h.fake.put(
        NODES,
        node("node-a", &["cloud.google.com/impending-node-termination"]),
    );
    h.source.set(Some(load(10.0, 100)));
    let d = h.tick(0.0).await;
    assert!(d[1] > 1, "it would scale up: {d:?}");
    assert_eq!(h.fake.writes(), vec![], "dry run wrote nothing");
    assert_eq!((h.replicas("l4-spot"), h.replicas("l4")), (1, 1));
    assert_eq!(h.fake.list(PODS).len(), 2);
}

/// Backoff on errors: a pool naming a missing Deployment fails with a `ReconcileFailed` Event
/// and a `Degraded` condition, and is not retried before its back-off (5 s) has passed.
#[tokio::test]
async fn failed_reconcile_backs_off() {
    let mut h = harness(
        json!([variant("l4", "nvidia-l4", "on-demand", 0, 1, 4)]),
        &[],
        false,
    )
    .await;
    h.source.set(Some(load(1.0, 0)));
    let r = h.controller.reconcile_all(0.0).await.unwrap();
    let e = r[0].1.as_ref().unwrap_err();
    assert_eq!(e.metric_label(), "missing_deployment");
    assert!(h.event_reasons().contains(&"ReconcileFailed".to_string()));
    assert_eq!(
        h.condition("Degraded"),
        ("True".into(), "ReconcileFailed".into())
    );
    assert!(
        h.controller.reconcile_all(1.0).await.unwrap().is_empty(),
        "backing off"
    );
    h.fake.put(DEPLOYMENTS, deployment(NS, "l4", 1));
    let r = h.controller.reconcile_all(6.0).await.unwrap();
    assert!(r[0].1.is_ok(), "retried after the back-off: {r:?}");
}

/// Leader failover: two controllers on one Lease; only the holder scales. When it dies
/// without releasing, the standby takes the Lease once it lapses (1 s) and acts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_between_two_controllers() {
    let fake = Fake::start().await;
    fake.put(NODES, node("node-a", &[]));
    fake.put(DEPLOYMENTS, deployment(NS, "l4", 1));
    fake.sync_pods(NS, "l4", Some("node-a"));
    fake.put(
        POOLS,
        pool(json!([variant("l4", "nvidia-l4", "on-demand", 0, 1, 20)])),
    );
    let source = Arc::new(FakeSource::default());
    source.set(Some(load(1.5, 1000)));
    let start = |id: &str| {
        let mut cfg = config();
        cfg.lease = Some(LeaseConfig {
            namespace: NS.into(),
            name: "sluice-autoscaler".into(),
            identity: id.into(),
            duration: Duration::from_secs(1),
            retry: Duration::from_millis(100),
        });
        let c = Controller::new(context(&fake, source.clone(), false, None), cfg);
        tokio::spawn(c.run(std::future::pending()))
    };
    let holder = |f: &Fake| {
        f.get(LEASES, NS, "sluice-autoscaler")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
    };
    let a = start("a");
    eventually("a leads", || holder(&fake).as_deref() == Some("a")).await;
    eventually("a scales", || replicas(&fake) > 1).await;
    let b = start("b");
    // b is a standby: a keeps renewing, b never takes over while a lives.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(holder(&fake).as_deref(), Some("a"));
    let b_writes_before = fake.writes_except_leases().len();
    a.abort();
    let _ = a.await;
    // Nothing scales while nobody leads; then b takes over and acts on new figures.
    source.set(Some(load(6.0, 3000)));
    let before = replicas(&fake);
    eventually("b takes over", || holder(&fake).as_deref() == Some("b")).await;
    eventually("b scales", || replicas(&fake) > before).await;
    assert!(fake.writes_except_leases().len() > b_writes_before);
    let lease = fake.get(LEASES, NS, "sluice-autoscaler").unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    b.abort();
}

fn replicas(f: &Fake) -> u64 {
    f.get(DEPLOYMENTS, NS, "l4").unwrap()["spec"]["replicas"]
        .as_u64()
        .unwrap()
}

/// Waits for a condition (up to 20 s: a limit for a hung test, not a timing assertion).
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never: {what}");
}

/// `/metrics` and `/healthz` over a real socket: the desired-replica gauge appears after a
/// reconcile, and health follows the loop's heartbeat.
#[tokio::test]
async fn metrics_and_healthz() {
    let mut h = harness(
        json!([variant("l4", "nvidia-l4", "on-demand", 0, 1, 20)]),
        &[("l4", 1)],
        false,
    )
    .await;
    h.source.set(Some(load(1.0, 200)));
    let d = h.tick(0.0).await;
    let app = sluice_autoscaler::controller::metrics::app(
        h.controller.metrics().clone(),
        Duration::from_secs(60),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let body = http_get(addr, "/metrics").await;
    assert!(
        body.1.contains(&format!(
            "sluice_autoscaler_desired_replicas{{namespace=\"llm\",pool=\"llama\",variant=\"l4\"}} {}",
            d[0]
        )),
        "{}",
        body.1
    );
    assert!(body
        .1
        .contains("sluice_autoscaler_reconcile_duration_seconds_count"));
    assert!(body.1.contains("sluice_autoscaler_decisions_total"));
    assert_eq!(http_get(addr, "/healthz").await.0, 200);
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    (code, body)
}

/// Signals from the pool Service's EndpointSlices through the shared scraper: a replica pod's
/// `/metrics` (a small server on 127.0.0.1) is found through its slice endpoint's `targetRef`,
/// read, and its queue reaches the policy; when it answers an error the metrics are stale and
/// the controller holds.
#[tokio::test]
async fn scraped_signals_from_endpointslice_pods() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let healthy = Arc::new(AtomicBool::new(true));
    let h2 = healthy.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let ok = h2.load(Ordering::Relaxed);
            async move {
                if ok {
                    (
                        axum::http::StatusCode::OK,
                        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 7\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n",
                    )
                } else {
                    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "boom")
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let h = harness(
        json!([variant("l4", "nvidia-l4", "on-demand", 0, 1, 20)]),
        &[("l4", 1)],
        false,
    )
    .await;
    h.fake.put(
        SLICES,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "replicas-abc", "namespace": NS,
            "labels": {"kubernetes.io/service-name": "replicas"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true},
            "targetRef": {"kind": "Pod", "name": "l4-0", "namespace": NS}}]}),
    );
    let client = h.fake.client();
    let source = Arc::new(sluice_autoscaler::controller::scraped::PodScraper::new(
        sluice_autoscaler::scrape::ScrapeConfig::default(),
    ));
    let source2 = source.clone();
    let ctx = Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "t".into(),
                instance: None,
            },
        ),
        provisioning: Arc::new(ProvisioningRequests::new(client.clone())),
        client,
        source,
        gke: None,
        metrics: Metrics::new(),
        dry_run: false,
    };
    let mut c = Controller::new(ctx, config());
    let r = c.reconcile_all(0.0).await.unwrap();
    let o = r[0].1.as_ref().unwrap();
    // No ready endpoint would mean no metrics (stale): the slice's pod was found and read.
    assert!(!o.stale, "fresh metrics from the pod");
    // The figures themselves (no request has finished yet, so the policy still plans floors).
    let target = sluice_autoscaler::controller::source::ReplicaPod {
        pod: "l4-0".into(),
        variant: "l4".into(),
        profile_variant: "nvidia-l4".into(),
        capacity: sluice_policy::profile::CapacityType::OnDemand,
        url: format!("http://127.0.0.1:{port}"),
        path: "/metrics".into(),
    };
    let spec: sluice_autoscaler::crd::ServingPoolSpec = serde_json::from_value(
        pool(json!([variant("l4", "nvidia-l4", "on-demand", 0, 1, 4)]))["spec"].clone(),
    )
    .unwrap();
    let Reading::Fresh(load) = source2
        .read(Query {
            pool: "other",
            namespace: NS,
            spec: &spec,
            targets: &[target],
            now_s: 0.0,
            ttft_target: sluice_autoscaler::scrape::TtftTarget {
                target_s: 2.0,
                longest_prompt_tokens: 1e6,
            },
        })
        .await
        .unwrap()
    else {
        panic!("fresh figures from a healthy pod");
    };
    assert_eq!((load.queue.waiting, load.queue.running), (7, 3));
    healthy.store(false, Ordering::Relaxed);
    let r = c.reconcile_all(10.0).await.unwrap();
    let o = r[0].1.as_ref().unwrap();
    assert!(o.stale, "an erroring pod makes the metrics stale");
    assert_eq!(o.desired, vec![1]);
    let st = h.fake.get(POOLS, NS, "llama").unwrap();
    let stale = st["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "MetricsStale")
        .unwrap()
        .clone();
    assert_eq!(stale["status"], "True");
    // The message names the failing scrape.
    assert!(
        stale["message"].as_str().unwrap().contains("HTTP 500"),
        "{stale}"
    );
}

/// A pool of one variant `v` (Deployment `l4` at one ready replica on `node-a`) whose
/// `gatewayUrl` is a fake gateway; the gateway's `/metrics` text, to set.
async fn gateway_harness(
    v: Value,
    gke: Option<Arc<dyn NodePoolProvider>>,
) -> (Harness, Arc<Mutex<String>>) {
    let fake = Fake::start().await;
    fake.put(NODES, node("node-a", &[]));
    fake.put(DEPLOYMENTS, deployment(NS, "l4", 1));
    fake.sync_pods(NS, "l4", Some("node-a"));
    let (gw, metrics) = fake_gateway().await;
    let mut p = pool(json!([v]));
    p["spec"]["signals"]["gatewayUrl"] = json!(gw);
    fake.put(POOLS, p);
    let source = Arc::new(FakeSource::default());
    let ctx = context(&fake, source.clone(), false, gke);
    let h = Harness {
        controller: Controller::new(ctx, config()),
        fake,
        source,
    };
    (h, metrics)
}

/// Scale to zero and back, against the fake API server (a faithful in-process fake speaking
/// the real Kubernetes wire protocol through a real `kube::Client`, see `fake_k8s`) and a fake
/// gateway: a pool with every minReplicas 0 and a `gatewayUrl` keeps one replica while traffic
/// is recent, goes to 0 replicas once idle for the stabilisation window (its Deployment scaled
/// to 0), stays there with fresh (not stale) metrics though no replica is left to read, and
/// comes back to 1 at the first reconcile that finds requests held in the gateway for its
/// model. Its GKE node pool is sized while it serves, and left to GKE's own scale-down at zero
/// (never set to 0 nodes by the controller).
#[tokio::test]
async fn scales_to_zero_when_idle_and_back_when_the_gateway_holds_requests() {
    let mut v = variant("l4", "nvidia-l4", "on-demand", 0, 0, 4);
    v["nodePool"] = json!({"provider": "gke", "name": "l4-pool"});
    let gke = FakeGke::start().await;
    let provider = Gke::new(GkeConfig {
        project: "p".into(),
        location: "us-central1".into(),
        cluster: "c".into(),
        api_url: gke.url(),
        metadata_url: gke.url(),
    })
    .unwrap();
    let (mut h, metrics) = gateway_harness(v, Some(Arc::new(provider))).await;
    let idle_gateway = "sluice_gateway_queue_depth{model=\"llama-3-8b\",priority=\"0\"} 0\n\
                        sluice_gateway_queue_held{model=\"llama-3-8b\"} 0\n";
    *metrics.lock().unwrap() = idle_gateway.into();
    let mut t = 0.0;
    for _ in 0..3 {
        h.source.set(Some(load(1.0, 0)));
        assert_eq!(h.tick(t).await, vec![1], "traffic keeps a replica at t={t}");
        t += 10.0;
    }
    let last_traffic = t - 10.0;
    let mut zero_at = None;
    while t < last_traffic + 300.0 && zero_at.is_none() {
        h.source.set(Some(load(0.0, 0)));
        if h.tick(t).await == vec![0] {
            zero_at = Some(t);
        }
        h.fake.sync_pods(NS, "l4", Some("node-a"));
        t += 10.0;
    }
    let zero_at = zero_at.expect("an idle pool goes to zero");
    assert!(
        zero_at - last_traffic >= 60.0,
        "idle {} s before zero, under the 60 s window",
        zero_at - last_traffic
    );
    assert_eq!(h.replicas("l4"), 0);
    assert!(h.fake.list(PODS).is_empty());
    // At zero the replicas' source has nothing to read; the pool stays at zero, not stale.
    h.source.set(None);
    for _ in 0..3 {
        assert_eq!(h.tick(t).await, vec![0]);
        t += 10.0;
    }
    assert_eq!(h.condition("MetricsStale").0, "False");
    let sizes: Vec<Value> = gke
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.1.clone())
        .collect();
    assert!(!sizes.is_empty(), "the node pool was sized while serving");
    assert!(
        !sizes.contains(&json!({"nodeCount": 0})),
        "the node pool is left to GKE's scale-down at zero: {sizes:?}"
    );
    // A request held in the gateway for the model: one replica at once.
    *metrics.lock().unwrap() = "sluice_gateway_queue_held{model=\"llama-3-8b\"} 2\n\
                                sluice_gateway_queue_held{model=\"other\"} 5\n"
        .into();
    assert_eq!(h.tick(t).await, vec![1], "held requests wake the pool");
    assert_eq!(h.replicas("l4"), 1);
    let s = h.status();
    let reasons = s["lastDecision"]["reasons"].to_string();
    assert!(
        reasons.contains("held") || reasons.contains("queued"),
        "{reasons}"
    );
    assert!(h.event_reasons().contains(&"ScaledUp".to_string()));
    // A gateway that cannot be read holds the pool as it is (never scaled down blind).
    h.fake.sync_pods(NS, "l4", Some("node-a"));
    *metrics.lock().unwrap() = "not the exposition format {".into();
    assert_eq!(h.tick(t + 10.0).await, vec![1]);
    assert_eq!(h.condition("MetricsStale").0, "True");
}

/// A gateway's `sluice_gateway_prompt_tokens_per_second` for the pool's model: `steady`
/// seconds of 500 tokens and `bursts` of 20,000 so far.
fn bursts_exposition(steady: f64, bursts: f64) -> String {
    let name = "sluice_gateway_prompt_tokens_per_second";
    let n = steady + bursts;
    format!(
        "{name}_bucket{{model=\"llama-3-8b\",le=\"1024\"}} {steady}\n\
         {name}_bucket{{model=\"llama-3-8b\",le=\"16384\"}} {steady}\n\
         {name}_bucket{{model=\"llama-3-8b\",le=\"23170\"}} {n}\n\
         {name}_bucket{{model=\"llama-3-8b\",le=\"+Inf\"}} {n}\n\
         {name}_sum{{model=\"llama-3-8b\"}} {}\n\
         {name}_count{{model=\"llama-3-8b\"}} {n}\n",
        steady * 500.0 + bursts * 20_000.0
    )
}

/// Bursts the replicas' series cannot show, read from the gateway (`gatewayUrl`, a fake
/// serving its exposition): one request a second of 500-token prompts keeps one L4, but once
/// the gateway has seen two seconds of 20,000 prompt tokens the pool holds the L4s that
/// prefill such a second within the 2 s TTFT target (6,000 tokens each: four), and says why.
/// The first read has no increase yet (one snapshot), so it changes nothing.
#[tokio::test]
async fn a_gateways_prompt_bursts_hold_the_replicas_that_prefill_them_in_time() {
    let v = variant("l4", "nvidia-l4", "on-demand", 0, 1, 8);
    let (mut h, metrics) = gateway_harness(v, None).await;
    h.source.set(Some(load(1.0, 0)));
    *metrics.lock().unwrap() = bursts_exposition(100.0, 0.0);
    assert_eq!(
        h.tick(0.0).await,
        vec![1],
        "one snapshot: no bursts measured yet"
    );
    h.fake.sync_pods(NS, "l4", Some("node-a"));
    *metrics.lock().unwrap() = bursts_exposition(108.0, 2.0);
    assert_eq!(h.tick(10.0).await, vec![4]);
    let reasons = h.status()["lastDecision"]["reasons"].to_string();
    assert!(reasons.contains("within a second"), "{reasons}");
}

/// The gateway's front door for the pool's model: `arrived` requests so far, all answered.
fn door_exposition(arrived: f64) -> String {
    format!("sluice_gateway_model_arrivals_total{{model=\"llama-3-8b\"}} {arrived}\n")
}

/// Demand only the gateway sees (`gatewayUrl`, a fake): the replicas count one request a
/// second, but 20 a second arrive at the front door (the rest refused or still queued there),
/// so the pool grows past its one L4. A source that reads gateways itself (as the Prometheus
/// source does) brings its own front door, here at one a second: that one is folded and the
/// direct read is not, so the pool keeps its L4 (one owner; never folded twice).
#[tokio::test]
async fn the_gateways_front_door_is_the_demand_once_from_one_reader() {
    let grown = |source_door: Option<FrontDoorWindows>| async move {
        let v = variant("l4", "nvidia-l4", "on-demand", 0, 1, 8);
        let (mut h, metrics) = gateway_harness(v, None).await;
        let mut l = load(1.0, 0);
        l.front_door = source_door;
        h.source.set(Some(l));
        *metrics.lock().unwrap() = door_exposition(1000.0);
        assert_eq!(h.tick(0.0).await, vec![1], "one snapshot: no increase yet");
        h.fake.sync_pods(NS, "l4", Some("node-a"));
        *metrics.lock().unwrap() = door_exposition(1200.0);
        h.tick(10.0).await[0]
    };
    let direct = grown(None).await;
    assert!(direct > 1, "20 req/s at the front door: {direct} L4s");
    let at_one_a_second = FrontDoorWindows {
        long: (door(10.0), 10.0),
        short: (door(5.0), 5.0),
        latency: door(10.0),
        ..FrontDoorWindows::default()
    };
    assert_eq!(grown(Some(at_one_a_second)).await, 1);
}

/// A front door over a window: `arrived` requests, none refused, no first token counted.
fn door(arrived: f64) -> FrontDoor {
    FrontDoor {
        arrivals: arrived,
        ..FrontDoor::default()
    }
}
