//! The `provisioning-request` provider: all-or-nothing capacity for gang replicas through
//! `autoscaling.x-k8s.io/v1` ProvisioningRequests (Dynamic Workload Scheduler on GKE).
//!
//! A gang replica holds every accelerator of its node, so half a gang is worth nothing: when a
//! variant grows, the provider copies the Deployment's pod template into a PodTemplate and
//! asks for exactly the added replicas in one ProvisioningRequest, which the cluster
//! autoscaler grants whole or not at all. Names are derived from the target
//! (`<deployment>-to-<replicas>`), so a repeated reconcile finds its request already there
//! (`409 AlreadyExists`) instead of asking twice. Shrinking asks for nothing: the cluster
//! autoscaler removes empty nodes.

use futures_util::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
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

    async fn apply(&self, req: &NodeRequest) -> Result<Outcome> {
        if req.replicas <= req.current_replicas {
            return Ok(Outcome::Unchanged);
        }
        let added = req.replicas - req.current_replicas;
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
        pr.data = json!({"spec": {
            "provisioningClassName": req.node_pool,
            "podSets": [{"count": added, "podTemplateRef": {"name": name}}],
        }});
        match prs.create(&PostParams::default(), &pr).await {
            Ok(_) => Ok(Outcome::Changed(format!(
                "ProvisioningRequest {name}: {added} replicas × {} GPUs, all or nothing ({} nodes in all)",
                req.gpus_per_replica, req.nodes
            ))),
            Err(e) if super::super::controller::lease::is_conflict(&e) => Ok(Outcome::Unchanged),
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
