//! The `provisioning-request` provider: all-or-nothing capacity for gang replicas through
//! `autoscaling.x-k8s.io/v1` ProvisioningRequests (Dynamic Workload Scheduler on GKE).
//!
//! A gang replica holds every accelerator of its node, so half a gang is worth nothing: when a
//! variant grows, the provider copies the Deployment's pod template into a PodTemplate and
//! asks for exactly the replicas without a node in one ProvisioningRequest, which the cluster
//! autoscaler grants whole or not at all. Names are derived from the target
//! (`<deployment>-to-<replicas>`), so a repeated reconcile finds its request already there
//! (`409 AlreadyExists`) instead of asking twice. Shrinking asks for nothing: the cluster
//! autoscaler removes empty nodes.
//!
//! Requests are cleaned up on every reconcile, with their PodTemplates, so they neither pile up
//! nor block a later request of the same name: one that ended without capacity (`Failed`,
//! `BookingExpired`, `CapacityRevoked`), one whose replicas all have nodes (its capacity is in
//! use), and one for more replicas than are now wanted (demand fell before it was granted).
//! While replicas still lack nodes and no live request covers them, one is made (again, after
//! a failure: the stockout rule is what moves demand elsewhere if capacity never comes).

use futures_util::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use serde_json::json;

use super::{NodePoolProvider, NodeRequest, Outcome};
use crate::controller::error::{Error, Result};

/// The ProvisioningRequest resource (a CRD of the cluster autoscaler).
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("autoscaling.x-k8s.io", "v1", "ProvisioningRequest"),
        "provisioningrequests",
    )
}

/// Conditions after which a request holds no capacity and never will.
const ENDED: &[&str] = &["Failed", "BookingExpired", "CapacityRevoked"];

/// The label holding the Deployment replicas a request was made for.
const TARGET_LABEL: &str = "sluice.dev/target-replicas";

fn target_of(pr: &DynamicObject) -> Option<u32> {
    pr.metadata.labels.as_ref()?.get(TARGET_LABEL)?.parse().ok()
}

fn condition_true(pr: &DynamicObject, kind: &str) -> bool {
    pr.data["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == kind && c["status"] == "True")
        })
}

/// The provider: a Kubernetes client.
#[derive(Clone)]
pub struct ProvisioningRequests {
    client: kube::Client,
}

impl std::fmt::Debug for ProvisioningRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProvisioningRequests")
    }
}

impl ProvisioningRequests {
    pub fn new(client: kube::Client) -> Self {
        ProvisioningRequests { client }
    }

    /// Deletes this variant's requests that are over (see the module doc) and their
    /// PodTemplates; the names deleted.
    async fn collect_garbage(&self, req: &NodeRequest) -> Result<Vec<String>> {
        let ar = resource();
        let prs: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &req.namespace, &ar);
        let selector = format!(
            "sluice.dev/serving-pool={},sluice.dev/variant={}",
            req.serving_pool, req.variant
        );
        let list = prs
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Error::kube("list provisioningrequests"))?;
        let templates: Api<PodTemplate> = Api::namespaced(self.client.clone(), &req.namespace);
        let mut deleted = Vec::new();
        for pr in list.items {
            let Some(name) = pr.metadata.name.clone() else {
                continue;
            };
            let target = target_of(&pr);
            let ended = ENDED.iter().find(|c| condition_true(&pr, c));
            let why = match (ended, target) {
                (Some(c), _) => *c,
                (None, Some(t)) if t <= req.scheduled_replicas => "Consumed",
                (None, Some(t)) if t > req.replicas => "NoLongerWanted",
                _ => continue,
            };
            for r in [
                prs.delete(&name, &DeleteParams::default())
                    .await
                    .map(|_| ()),
                templates
                    .delete(&name, &DeleteParams::default())
                    .await
                    .map(|_| ()),
            ] {
                match r {
                    Ok(()) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(Error::kube(format!("delete {name}"))(e)),
                }
            }
            tracing::info!(request = %name, reason = why, "provisioning request removed");
            deleted.push(format!("{name} ({why})"));
        }
        Ok(deleted)
    }

    async fn apply(&self, req: &NodeRequest) -> Result<Outcome> {
        let deleted = self.collect_garbage(req).await?;
        let said = |o: Outcome| -> Outcome {
            if deleted.is_empty() {
                return o;
            }
            let gone = format!("removed ProvisioningRequest {}", deleted.join(", "));
            match o {
                Outcome::Unchanged => Outcome::Changed(gone),
                Outcome::Changed(s) => Outcome::Changed(format!("{s}; {gone}")),
            }
        };
        if req.replicas <= req.scheduled_replicas {
            return Ok(said(Outcome::Unchanged));
        }
        // The replicas without a node yet: what the request must bring.
        let added = req.replicas - req.scheduled_replicas;
        let name = format!("{}-to-{}", req.deployment, req.replicas);
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), &req.namespace);
        let d = deployments
            .get_opt(&req.deployment)
            .await
            .map_err(Error::kube(format!("get deployment {}", req.deployment)))?
            .ok_or_else(|| Error::MissingDeployment(req.deployment.clone()))?;
        let template = d.spec.map(|s| s.template).unwrap_or_default();
        let labels = [
            (
                "sluice.dev/serving-pool".to_string(),
                req.serving_pool.clone(),
            ),
            ("sluice.dev/variant".to_string(), req.variant.clone()),
        ];
        let meta = ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(req.namespace.clone()),
            labels: Some(labels.iter().cloned().collect()),
            ..ObjectMeta::default()
        };
        let templates: Api<PodTemplate> = Api::namespaced(self.client.clone(), &req.namespace);
        let pt = PodTemplate {
            metadata: meta.clone(),
            template: Some(template),
        };
        match templates.create(&PostParams::default(), &pt).await {
            Ok(_) => {}
            Err(e) if super::super::controller::lease::is_conflict(&e) => {}
            Err(e) => return Err(Error::kube(format!("create podtemplate {name}"))(e)),
        }
        let ar = resource();
        let prs: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &req.namespace, &ar);
        let mut pr = DynamicObject::new(&name, &ar).within(&req.namespace);
        pr.metadata.labels = meta.labels;
        pr.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(TARGET_LABEL.into(), req.replicas.to_string());
        pr.data = json!({"spec": {
            "provisioningClassName": req.node_pool,
            "podSets": [{"count": added, "podTemplateRef": {"name": name}}],
        }});
        match prs.create(&PostParams::default(), &pr).await {
            Ok(_) => Ok(said(Outcome::Changed(format!(
                "ProvisioningRequest {name}: {added} replicas × {} GPUs, all or nothing ({} nodes in all)",
                req.gpus_per_replica, req.nodes
            )))),
            Err(e) if super::super::controller::lease::is_conflict(&e) => {
                Ok(said(Outcome::Unchanged))
            }
            Err(e) => Err(Error::kube(format!("create provisioningrequest {name}"))(e)),
        }
    }
}

impl NodePoolProvider for ProvisioningRequests {
    fn name(&self) -> &'static str {
        "provisioning-request"
    }
    fn ensure<'a>(&'a self, req: &'a NodeRequest) -> BoxFuture<'a, Result<Outcome>> {
        Box::pin(self.apply(req))
    }
}
