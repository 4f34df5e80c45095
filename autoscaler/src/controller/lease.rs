//! Leader election on a `coordination.k8s.io/v1` Lease, so one controller acts at a time.
//!
//! A small module rather than a crate. `kube-leader-election` pins an older kube major.
//! `kube-lease-manager` 0.13 does build on kube 5 / k8s-openapi 0.29 (checked 2026-12-03), but
//! it takes a lapsed Lease with a server-side apply patch and settles races through field-manager
//! conflicts, and renews with strategic-merge patches that carry no precondition; this module
//! keeps client-go's compare-and-swap (below), which the controller's failover test runs
//! against the fake API server, and fits the loop's one-call-per-period shape (the crate
//! wants its own task or a blocking `changed()`). The protocol is client-go's: the holder renews `renewTime` every period;
//! a candidate takes the Lease over only when `renewTime + leaseDurationSeconds` has passed.
//! Every write is a `replace` carrying the `resourceVersion` read, so two candidates racing
//! for a lapsed Lease cannot both win: the API server answers the loser `409 Conflict`.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};

use super::error::{Error, Result};

/// One candidate for one Lease.
#[derive(Debug, Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl LeaseLock {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        LeaseLock {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            duration,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Takes or renews the Lease; true while this candidate holds it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = Timestamp::now();
        let secs = self.duration.as_secs().max(1) as i32;
        let existing = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(Error::kube(format!("get lease {}", self.name)))?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(Error::kube(format!("create lease {}", self.name))(e)),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let mine = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        if !mine {
            let held_for = spec.lease_duration_seconds.unwrap_or(secs);
            let lapsed = match (&spec.holder_identity, &spec.renew_time) {
                (Some(h), Some(r)) if !h.is_empty() => {
                    r.0 + SignedDuration::from_secs(i64::from(held_for)) < now
                }
                _ => true,
            };
            if !lapsed {
                return Ok(false);
            }
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.lease_duration_seconds = Some(secs);
        spec.renew_time = Some(MicroTime(now));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(Error::kube(format!("update lease {}", self.name))(e)),
        }
    }

    /// Gives the Lease up (on shutdown) so a standby takes over without waiting it out.
    pub async fn release(&self) -> Result<()> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(Error::kube(format!("get lease {}", self.name)))?
        else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(Error::kube(format!("release lease {}", self.name))(e)),
        }
    }
}

pub(crate) fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}
