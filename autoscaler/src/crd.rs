//! The `ServingPool` custom resource (`sluice.dev/v1alpha1`): one model, the accelerator
//! variants it may run on, where its signals come from, and what the controller last did.
//!
//! The Rust types are the source of truth: `sluice-autoscaler crd` prints the
//! CustomResourceDefinition derived from them (schema included), and a test checks that
//! `deploy/k8s/crd/servingpool.yaml` equals that output, so the manifest can never drift from
//! the code that reads it. Optional fields have defaults the controller fills in, so a minimal
//! resource names only the model, its profile, the variants and the signal source.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use sluice_policy::profile::CapacityType;

/// What a `ServingPool` asks for.
#[derive(CustomResource, Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "ServingPool",
    namespaced,
    status = "ServingPoolStatus",
    shortname = "sp",
    printcolumn = r#"{"name":"Model","type":"string","jsonPath":".spec.model"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ServingPoolSpec {
    /// The model served (the `model_name` label on the replicas' metrics).
    pub model: String,
    /// The performance profile: a built-in name (`llama-3-8b`, `cpu`) or a TOML file path
    /// inside the controller's image. Every variant below names one of its variants.
    pub profile: String,
    pub slo: SloSpec,
    /// The Deployments the controller scales, one per accelerator variant and capacity type.
    pub variants: Vec<VariantSpec>,
    pub signals: SignalSourceSpec,
    #[serde(default)]
    pub policy: PolicySpec,
    #[serde(default)]
    pub stockout: StockoutSpec,
}

/// Latency objectives, each a percentile and a target in seconds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SloSpec {
    /// Time to first token.
    pub ttft: LatencyObjective,
    /// Time per output token (inter-token latency).
    pub tpot: LatencyObjective,
}

/// One latency objective.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LatencyObjective {
    /// The percentile the target applies to, in (0, 100]; the policy plans for p99.
    #[serde(default = "default_percentile")]
    pub percentile: f64,
    pub target_seconds: f64,
}

fn default_percentile() -> f64 {
    99.0
}

/// One accelerator variant bought one way, and the Deployment that runs it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VariantSpec {
    /// This entry's name, unique in the pool (`l4-spot`).
    pub name: String,
    /// The Deployment (same namespace) scaled through its `scale` subresource.
    pub deployment: String,
    /// The variant in the profile (`nvidia-l4`); its performance model and price size this
    /// entry's replicas.
    pub profile_variant: String,
    #[serde(default)]
    pub node_pool: NodePoolSpec,
    #[serde(default)]
    pub min_replicas: u32,
    pub max_replicas: u32,
    #[serde(default)]
    pub capacity: CapacityType,
    /// Lower numbers are preferred: demand a variant cannot take (out of stock, preempted, at
    /// its maximum) moves to the next by priority.
    #[serde(default)]
    pub priority: i32,
}

/// Where a variant's nodes come from.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolSpec {
    #[serde(default)]
    pub provider: NodePoolProviderKind,
    /// The GKE node pool name (`gke`) or the ProvisioningRequest class
    /// (`provisioning-request`, e.g. `queued-provisioning.gke.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `gke` only: set the pool's node count (`size`), or its autoscaling bounds to
    /// [0, needed] and leave the count to the cluster autoscaler (`autoscaling`).
    #[serde(default)]
    pub gke_mode: GkeMode,
}

/// Which node pool provider acts for a variant.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NodePoolProviderKind {
    /// Leave nodes to the cluster autoscaler or node auto-provisioning.
    #[default]
    None,
    /// The GKE REST API.
    Gke,
    /// `autoscaling.x-k8s.io/v1` ProvisioningRequests (all-or-nothing, for gangs).
    ProvisioningRequest,
}

/// How the `gke` provider sizes a pool.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum GkeMode {
    #[default]
    Size,
    Autoscaling,
}

/// Where the replicas' load comes from: exactly one of the two.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SignalSourceSpec {
    /// Scrape each replica pod's `/metrics`, the pods found through the EndpointSlices of
    /// this Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape: Option<ScrapeSpec>,
    /// Query a Prometheus HTTP API at this URL instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus_url: Option<String>,
    /// The routing gateway's base URL (`http://sluice-gateway-pods.sluice.svc:8000`), whose
    /// `/metrics` say how many requests wait for this pool's model (`sluice_gateway_queue_depth`
    /// and `sluice_gateway_queue_held` by `model`). Every address its host resolves to is read
    /// and summed: name a headless Service of the gateway pods, so that each pod is read (a
    /// ClusterIP Service reaches one pod per read). With it the pool scales to zero: idle for the
    /// scale-down stabilisation window, its Deployments go to 0 (when every minReplicas is 0),
    /// and a request the gateway holds for the model brings one replica back at once.
    /// Without it nothing wakes a pool that is at zero replicas. Its
    /// `sluice_gateway_prompt_tokens_per_second` also sizes the pool for requests that arrive
    /// together, where the signal source does not read it from Prometheus itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_url: Option<String>,
}

/// The Service whose EndpointSlices list the replica pods.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScrapeSpec {
    pub service: String,
    /// The EndpointSlice port name to scrape (`http`); the first port if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    #[serde(default = "default_metrics_path")]
    pub path: String,
}

fn default_metrics_path() -> String {
    "/metrics".into()
}

/// The policy's knobs (see `SluiceConfig`); every field has the policy's default.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    /// Arrival rate window the policy plans from.
    #[serde(default = "d60")]
    pub window_seconds: f64,
    /// Short window that notices a spike.
    #[serde(default = "d10")]
    pub short_window_seconds: f64,
    /// The request shape (mean prompt and output, prompt spread) is averaged over this wider
    /// window while the arrival window holds fewer than 500 requests.
    #[serde(default = "shape_window")]
    pub shape_window_seconds: f64,
    /// Scale down only to the highest demand planned within this window. It grows to a
    /// variant's start-up time while cuts of it are bought back within that time, and shrinks
    /// back as cuts pay back.
    #[serde(default = "d300")]
    pub scale_down_stabilisation_seconds: f64,
    /// Panic when the short-window rate exceeds ready capacity by this factor.
    #[serde(default = "d1_5")]
    pub panic_threshold: f64,
    #[serde(default = "d60")]
    pub panic_window_seconds: f64,
    /// Forecast horizon; the longest start-up of the variants if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast_horizon_seconds: Option<f64>,
    /// Capacity planned above demand (0.2 = 20 %).
    #[serde(default = "d0_2")]
    pub headroom: f64,
    /// With it, a pool that may scale to zero does so only when the cold start that would
    /// wake it fits the SLO's error budget over this many seconds (the share of requests the
    /// TTFT percentile lets miss, 1 % for p99); otherwise one replica stays. Absent: idle for
    /// the scale-down window is enough, whatever the cold start costs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_budget_horizon_seconds: Option<f64>,
}

impl Default for PolicySpec {
    fn default() -> Self {
        PolicySpec {
            window_seconds: 60.0,
            short_window_seconds: 10.0,
            shape_window_seconds: shape_window(),
            scale_down_stabilisation_seconds: 300.0,
            panic_threshold: 1.5,
            panic_window_seconds: 60.0,
            forecast_horizon_seconds: None,
            headroom: 0.2,
            zero_budget_horizon_seconds: None,
        }
    }
}

/// When a variant counts as out of stock, and for how long it is avoided.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StockoutSpec {
    /// A pod pending (unscheduled) longer than this marks its variant out of stock.
    #[serde(default = "d300")]
    pub pending_limit_seconds: f64,
    /// An out-of-stock variant is avoided this long before it is tried again.
    #[serde(default = "d1800")]
    pub backoff_seconds: f64,
    /// After a Spot preemption, prefer other (on-demand) variants this long.
    #[serde(default = "d1800")]
    pub spot_preemption_backoff_seconds: f64,
}

impl Default for StockoutSpec {
    fn default() -> Self {
        StockoutSpec {
            pending_limit_seconds: 300.0,
            backoff_seconds: 1800.0,
            spot_preemption_backoff_seconds: 1800.0,
        }
    }
}

fn d10() -> f64 {
    10.0
}
fn d60() -> f64 {
    60.0
}
fn d300() -> f64 {
    300.0
}
fn d1800() -> f64 {
    1800.0
}
fn shape_window() -> f64 {
    sluice_policy::signals::SHAPE_WINDOW_S
}
fn d1_5() -> f64 {
    1.5
}
fn d0_2() -> f64 {
    0.2
}

/// What the controller observed and did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingPoolStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub variants: Vec<VariantStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<DecisionStatus>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// One variant's replicas.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VariantStatus {
    pub name: String,
    pub desired: u32,
    /// The Deployment's `spec.replicas`.
    pub current: u32,
    pub ready: u32,
    /// Pods waiting for a node.
    pub pending: u32,
    /// False while the variant is avoided (out of stock, or Spot just preempted).
    pub available: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable_reason: Option<String>,
}

/// The policy's last decision, summarised.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecisionStatus {
    pub time: String,
    /// `stable` or `panic`.
    pub mode: String,
    pub planned_requests_per_second: f64,
    /// Which signal or constraint bound each number, one sentence each.
    pub reasons: Vec<String>,
}

/// A condition in the Kubernetes convention.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`, `MetricsStale`, `Stockout` or `Degraded`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// RFC 3339; changes only when `status` changes.
    pub last_transition_time: String,
}

/// The CustomResourceDefinition as YAML, as `sluice-autoscaler crd` prints it.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    let crd = sorted(serde_yaml::to_value(ServingPool::crd())?);
    Ok(format!(
        "# Generated by `sluice-autoscaler crd` from autoscaler/src/crd.rs: do not edit.\n{}",
        serde_yaml::to_string(&crd)?
    ))
}

/// The same document with every mapping's keys in order. The schema's `default` values are
/// `serde_json` maps, whose order depends on whether serde_json's `preserve_order` feature is on
/// in the build (llguidance turns it on for the whole workspace); sorted, the manifest is the
/// same either way.
fn sorted(v: serde_yaml::Value) -> serde_yaml::Value {
    use serde_yaml::Value;
    match v {
        Value::Mapping(m) => {
            let mut entries: Vec<(Value, Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.as_str().cmp(&b.0.as_str()));
            Value::Mapping(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Sequence(s) => Value::Sequence(s.into_iter().map(sorted).collect()),
        other => other,
    }
}

impl ServingPoolSpec {
    /// Whether the pool may go to zero replicas and come back: a gateway to wake it is named
    /// and no variant keeps a minimum.
    pub fn scales_to_zero(&self) -> bool {
        self.signals.gateway_url.is_some() && self.variants.iter().all(|v| v.min_replicas == 0)
    }

    /// Checks what the schema cannot: names unique, bounds ordered, exactly one signal source.
    pub fn validate(&self) -> Result<(), String> {
        if self.variants.is_empty() {
            return Err("spec.variants is empty".into());
        }
        let mut names = std::collections::BTreeSet::new();
        for v in &self.variants {
            if !names.insert(v.name.as_str()) {
                return Err(format!("variant name {:?} appears twice", v.name));
            }
            if v.min_replicas > v.max_replicas {
                return Err(format!(
                    "variant {}: minReplicas {} > maxReplicas {}",
                    v.name, v.min_replicas, v.max_replicas
                ));
            }
            if v.node_pool.provider != NodePoolProviderKind::None && v.node_pool.name.is_none() {
                return Err(format!(
                    "variant {}: nodePool.name is required for provider {:?}",
                    v.name, v.node_pool.provider
                ));
            }
        }
        for (what, o) in [("ttft", &self.slo.ttft), ("tpot", &self.slo.tpot)] {
            if !(o.target_seconds > 0.0 && o.percentile > 0.0 && o.percentile <= 100.0) {
                return Err(format!(
                    "slo.{what}: targetSeconds must be > 0 and percentile in (0, 100]"
                ));
            }
        }
        if self
            .policy
            .zero_budget_horizon_seconds
            .is_some_and(|h| h.is_nan() || h <= 0.0)
        {
            return Err("policy.zeroBudgetHorizonSeconds must be > 0".into());
        }
        match (&self.signals.scrape, &self.signals.prometheus_url) {
            (Some(_), None) | (None, Some(_)) => Ok(()),
            _ => Err("spec.signals: set exactly one of scrape and prometheusUrl".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../deploy/k8s/crd/example-servingpool.yaml");

    #[test]
    fn generated_crd_equals_the_checked_in_manifest() {
        let file = include_str!("../../deploy/k8s/crd/servingpool.yaml");
        assert_eq!(
            crd_yaml().unwrap(),
            file,
            "deploy/k8s/crd/servingpool.yaml is stale: run `sluice-autoscaler crd > deploy/k8s/crd/servingpool.yaml`"
        );
    }

    #[test]
    fn example_deserialises_and_validates() {
        let sp: ServingPool = serde_yaml::from_str(EXAMPLE).unwrap();
        assert_eq!(sp.spec.model, "llama-3-8b");
        sp.spec.validate().unwrap();
        assert!(sp
            .spec
            .variants
            .iter()
            .any(|v| v.capacity == CapacityType::Spot));
        // Every variant names one in the profile.
        let p = sluice_policy::profile::Profile::load(&sp.spec.profile).unwrap();
        for v in &sp.spec.variants {
            p.variant(&v.profile_variant).unwrap();
        }
    }

    #[test]
    fn the_scale_to_zero_example_names_its_gateway() {
        let zero: ServingPool = serde_yaml::from_str(include_str!(
            "../../deploy/k8s/crd/example-servingpool-zero.yaml"
        ))
        .unwrap();
        zero.spec.validate().unwrap();
        assert!(zero.spec.scales_to_zero());
        // The other example keeps a minimum and names no gateway: it never goes to zero.
        let sp: ServingPool = serde_yaml::from_str(EXAMPLE).unwrap();
        assert!(!sp.spec.scales_to_zero());
    }

    #[test]
    fn validation_names_the_problem() {
        let mut sp: ServingPool = serde_yaml::from_str(EXAMPLE).unwrap();
        sp.spec.signals.prometheus_url = Some("http://prom:9090".into());
        assert!(sp.spec.validate().unwrap_err().contains("exactly one"));
        let mut sp: ServingPool = serde_yaml::from_str(EXAMPLE).unwrap();
        sp.spec.variants[0].min_replicas = 99;
        assert!(sp.spec.validate().unwrap_err().contains("minReplicas"));
        let mut sp: ServingPool = serde_yaml::from_str(EXAMPLE).unwrap();
        sp.spec.policy.zero_budget_horizon_seconds = Some(0.0);
        assert!(sp
            .spec
            .validate()
            .unwrap_err()
            .contains("zeroBudgetHorizonSeconds"));
    }
}
