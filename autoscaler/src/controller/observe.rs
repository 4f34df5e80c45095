//! What the cluster holds for one `ServingPool`: each variant's Deployment and pods, the nodes
//! under them, and the replicas to read signals from (endpoints to scrape, or ready pods a
//! Prometheus source reads by name).
//!
//! Reading is separate from deciding so the reconcile's logic works on plain data. A pod is
//! *pending* while no node is assigned (waiting for capacity: provisioning or a stockout),
//! *starting* once scheduled but not yet ready, *ready* when its `Ready` condition is true, and
//! *preempted* when its node is gone or carries a preemption taint (a Spot reclaim).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};

use super::error::{Error, Result};
use super::source::ReplicaPod;
use crate::crd::{ScrapeSpec, ServingPool, VariantSpec};

/// Taints that mean a node is being taken away: GKE's impending termination (Spot reclaims and
/// maintenance) and Kubernetes' out-of-service.
pub const PREEMPTION_TAINTS: &[&str] = &[
    "cloud.google.com/impending-node-termination",
    "node.kubernetes.io/out-of-service",
];

/// One pod of a variant.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView {
    pub name: String,
    pub uid: String,
    pub pending: bool,
    pub ready: bool,
    pub preempted: bool,
    pub terminating: bool,
}

/// One variant's Deployment and pods.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VariantView {
    /// The Deployment's `spec.replicas`.
    pub replicas: u32,
    pub pods: Vec<PodView>,
}

impl VariantView {
    fn live(&self) -> impl Iterator<Item = &PodView> {
        self.pods.iter().filter(|p| !p.terminating)
    }
    pub fn ready(&self) -> u32 {
        self.live().filter(|p| p.ready && !p.preempted).count() as u32
    }
    pub fn pending(&self) -> u32 {
        self.live().filter(|p| p.pending).count() as u32
    }
    pub fn starting(&self) -> u32 {
        self.live()
            .filter(|p| !p.pending && !p.ready && !p.preempted)
            .count() as u32
    }
    pub fn preempted(&self) -> Vec<&PodView> {
        self.live().filter(|p| p.preempted).collect()
    }
}

/// The pool's view of the cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolView {
    /// In the order of `spec.variants`.
    pub variants: Vec<VariantView>,
    pub targets: Vec<ReplicaPod>,
}

/// Reads the pool's Deployments, pods, nodes and endpoints.
pub async fn observe(client: &kube::Client, pool: &ServingPool, ns: &str) -> Result<PoolView> {
    let doomed = doomed_nodes(client).await?;
    let mut view = PoolView::default();
    // Pod name → variant entry, for the endpoints.
    let mut owner: HashMap<String, &VariantSpec> = HashMap::new();
    // Ready, live pods: what a Prometheus source reads (by pod name).
    let mut ready_pods: Vec<(String, &VariantSpec)> = Vec::new();
    for v in &pool.spec.variants {
        let vv = variant_view(client, pool, ns, v, &doomed).await?;
        for p in &vv.pods {
            owner.insert(p.name.clone(), v);
            if p.ready && !p.preempted && !p.terminating {
                ready_pods.push((p.name.clone(), v));
            }
        }
        view.variants.push(vv);
    }
    view.targets = match &pool.spec.signals.scrape {
        Some(scrape) => scrape_targets(client, ns, scrape, &owner).await?,
        None => ready_pods
            .into_iter()
            .map(|(pod, v)| ReplicaPod {
                pod,
                variant: v.name.clone(),
                profile_variant: v.profile_variant.clone(),
                capacity: v.capacity,
                url: String::new(),
                path: String::new(),
            })
            .collect(),
    };
    view.targets.sort();
    Ok(view)
}

/// Every node by name: whether it carries a preemption taint.
async fn doomed_nodes(client: &kube::Client) -> Result<HashMap<String, bool>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node_list = nodes
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list nodes"))?;
    let mut doomed: HashMap<String, bool> = HashMap::new();
    for n in node_list.items {
        let tainted = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| {
                ts.iter()
                    .any(|t| PREEMPTION_TAINTS.contains(&t.key.as_str()))
            });
        if let Some(name) = n.metadata.name {
            doomed.insert(name, tainted);
        }
    }
    Ok(doomed)
}

/// One variant's Deployment and its pods (found through the Deployment's selector), sorted by
/// name.
async fn variant_view(
    client: &kube::Client,
    pool: &ServingPool,
    ns: &str,
    v: &VariantSpec,
    doomed: &HashMap<String, bool>,
) -> Result<VariantView> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let d = deployments
        .get_opt(&v.deployment)
        .await
        .map_err(Error::kube(format!("get deployment {}", v.deployment)))?
        .ok_or_else(|| Error::MissingDeployment(format!("{ns}/{}", v.deployment)))?;
    let spec = d.spec.unwrap_or_default();
    let selector: BTreeMap<String, String> = spec.selector.match_labels.unwrap_or_default();
    if selector.is_empty() {
        return Err(Error::InvalidSpec {
            name: pool.metadata.name.clone().unwrap_or_default(),
            message: format!(
                "deployment {} has no selector.matchLabels: its pods cannot be found",
                v.deployment
            ),
        });
    }
    let sel = selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let list = pods
        .list(&ListParams::default().labels(&sel))
        .await
        .map_err(Error::kube(format!("list pods of {}", v.deployment)))?;
    let mut pods: Vec<PodView> = list
        .items
        .into_iter()
        .map(|p| pod_view(p, doomed))
        .collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(VariantView {
        replicas: spec.replicas.unwrap_or(1).max(0) as u32,
        pods,
    })
}

/// A pod as the reconcile sees it. A pod on a node that is gone or tainted is preempted.
fn pod_view(p: Pod, doomed: &HashMap<String, bool>) -> PodView {
    let name = p.metadata.name.clone().unwrap_or_default();
    let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
    let status = p.status.unwrap_or_default();
    let ready = status
        .conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let phase = status.phase.unwrap_or_default();
    let preempted = match &node {
        Some(n) => doomed.get(n).copied().unwrap_or(true),
        None => false,
    };
    PodView {
        uid: p.metadata.uid.clone().unwrap_or_else(|| name.clone()),
        name,
        pending: node.is_none() && (phase == "Pending" || phase.is_empty()),
        ready,
        preempted,
        terminating: p.metadata.deletion_timestamp.is_some(),
    }
}

/// The ready endpoints of the scrape Service whose pods belong to the pool, as URLs.
async fn scrape_targets(
    client: &kube::Client,
    ns: &str,
    scrape: &ScrapeSpec,
    owner: &HashMap<String, &VariantSpec>,
) -> Result<Vec<ReplicaPod>> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let list = slices
        .list(
            &ListParams::default()
                .labels(&format!("kubernetes.io/service-name={}", scrape.service)),
        )
        .await
        .map_err(Error::kube(format!(
            "list endpointslices of {}",
            scrape.service
        )))?;
    let mut targets = Vec::new();
    for s in list.items {
        let ports = s.ports.unwrap_or_default();
        let port = match &scrape.port {
            Some(name) => ports.iter().find(|p| p.name.as_deref() == Some(name)),
            None => ports.first(),
        };
        let Some(port) = port.and_then(|p| p.port) else {
            continue;
        };
        for e in s.endpoints {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            let Some(pod) = e.target_ref.as_ref().and_then(|r| r.name.clone()) else {
                continue;
            };
            let (Some(variant), Some(ip), true) = (owner.get(&pod), e.addresses.first(), ready)
            else {
                continue;
            };
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip.clone()
            };
            targets.push(ReplicaPod {
                pod,
                variant: variant.name.clone(),
                profile_variant: variant.profile_variant.clone(),
                capacity: variant.capacity,
                url: format!("http://{host}:{port}"),
                path: scrape.path.clone(),
            });
        }
    }
    Ok(targets)
}
