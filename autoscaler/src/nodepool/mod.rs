//! Node pools under the replicas, behind the [`NodePoolProvider`] trait.
//!
//! Replicas need nodes: when a variant's desired replicas change, the controller asks its
//! provider for the nodes they need. [`gke`] sets a GKE node pool's size (or its autoscaling
//! bounds) through the GKE REST API with the pod's Workload Identity token;
//! [`provisioning`] creates `autoscaling.x-k8s.io/v1` ProvisioningRequests, all-or-nothing
//! capacity for gang replicas through Dynamic Workload Scheduler; [`None`] leaves nodes to the
//! cluster autoscaler or node auto-provisioning. Providers must be idempotent: the controller
//! calls them again after a restart or a failed reconcile.

pub mod gke;
pub mod provisioning;

use futures_util::future::BoxFuture;

use crate::controller::error::Result;
use crate::crd::GkeMode;

/// What one variant needs from its node pool.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRequest {
    pub namespace: String,
    /// The ServingPool and variant asking (for names and labels).
    pub serving_pool: String,
    pub variant: String,
    /// The Deployment whose pod template the replicas use.
    pub deployment: String,
    /// GKE node pool name, or ProvisioningRequest class.
    pub node_pool: String,
    pub gke_mode: GkeMode,
    /// Desired replicas and the nodes they fill (gangs packed whole onto nodes).
    pub replicas: u32,
    pub nodes: u32,
    /// Replicas the Deployment has now: only growth needs new capacity requested.
    pub current_replicas: u32,
    /// Of those, pods on a node (starting or ready): the capacity already there.
    pub scheduled_replicas: u32,
    pub gpus_per_replica: u32,
}

/// What a provider did, for the ServingPool's Events.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Nothing to do (already as asked, or not this provider's job).
    Unchanged,
    /// Acted; the sentence says how.
    Changed(String),
}

/// Gets nodes for replicas.
pub trait NodePoolProvider: Send + Sync + std::fmt::Debug {
    /// The provider's name in errors and Events (`gke`, `provisioning-request`, `none`).
    fn name(&self) -> &'static str;
    /// Makes the pool able to hold `req.replicas` replicas.
    fn ensure<'a>(&'a self, req: &'a NodeRequest) -> BoxFuture<'a, Result<Outcome>>;
}

/// Leaves nodes to the cluster autoscaler: pending pods make it add nodes.
#[derive(Debug, Default, Clone, Copy)]
pub struct None;

impl NodePoolProvider for None {
    fn name(&self) -> &'static str {
        "none"
    }
    fn ensure<'a>(&'a self, _req: &'a NodeRequest) -> BoxFuture<'a, Result<Outcome>> {
        Box::pin(async { Ok(Outcome::Unchanged) })
    }
}
