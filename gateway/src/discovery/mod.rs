//! Where replicas come from. Each source reports the full set of replica URLs it currently
//! sees; the router keeps one slot per source and routes to their union, so replicas come and
//! go without a restart.
//!
//! - [`static_list`]: `--upstream URL` (repeatable): reported once.
//! - [`dns`]: `--discover dns://NAME:PORT`, a headless Service's name re-resolved every
//!   `--discover-interval` (tokio's `lookup_host`: A/AAAA records are all a headless Service
//!   needs, so no resolver crate).
//! - [`file`]: `--discover file://PATH`, a JSON list of URLs or one URL a line, re-read when it
//!   changes (checked every `--discover-interval`); how a local autoscaler tells the gateway
//!   which processes it started.
//! - [`k8s`]: `--discover k8s://NAMESPACE/SERVICE:PORT`, the Service's EndpointSlices through a
//!   kube-rs watcher (list, then watch), ready endpoints only.
//!
//! - `--served-models a,b`: model names alone, known while no replica serves them.
//!
//! Besides replicas, a source may report model names (the file's `model NAME` lines or
//! `models` key, the Service's `sluice.dev/models` annotation, `--served-models`): a pool's
//! models stay known at zero replicas, so `/v1/models` lists them and their requests are held
//! until a replica is ready (`crate::router::queue`).
//!
//! A source that fails (DNS down, file unreadable, API server unreachable) keeps its last good
//! report and logs; it never empties the fleet because it could not look.

pub mod dns;
pub mod file;
pub mod k8s;
pub mod static_list;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::router::remote::ReplicaUrl;
use crate::router::Router;

/// A discovery source, parsed from `--discover`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Static(Vec<ReplicaUrl>),
    Dns {
        host: String,
        port: u16,
    },
    File(PathBuf),
    K8s(k8s::Target),
    /// `--served-models`: model names known with no replica, reported once.
    Models(Vec<String>),
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("--discover: {0}")]
    Spec(String),
    #[error("Kubernetes client: {0}")]
    Kube(#[source] kube::Error),
    #[error("reading {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    FileFormat { path: PathBuf, message: String },
}

impl Source {
    /// `dns://NAME:PORT`, `file://PATH` or `k8s://NAMESPACE/SERVICE:PORT`.
    pub fn parse(spec: &str) -> Result<Self, DiscoveryError> {
        let bad = |m: String| DiscoveryError::Spec(m);
        if let Some(rest) = spec.strip_prefix("dns://") {
            let (host, port) = rest
                .rsplit_once(':')
                .ok_or_else(|| bad(format!("'{spec}' needs a port: dns://NAME:PORT")))?;
            let port: u16 = port
                .parse()
                .map_err(|_| bad(format!("'{spec}': '{port}' is not a port")))?;
            if host.is_empty() || host.contains('/') {
                return Err(bad(format!("'{spec}': '{host}' is not a host name")));
            }
            return Ok(Self::Dns {
                host: host.to_string(),
                port,
            });
        }
        if let Some(path) = spec.strip_prefix("file://") {
            if path.is_empty() {
                return Err(bad(format!("'{spec}' names no file")));
            }
            return Ok(Self::File(PathBuf::from(path)));
        }
        if let Some(rest) = spec.strip_prefix("k8s://") {
            return k8s::Target::parse(rest).map(Self::K8s).map_err(bad);
        }
        Err(bad(format!(
            "'{spec}' is not a discovery source (dns://NAME:PORT, file://PATH, k8s://NAMESPACE/SERVICE:PORT)"
        )))
    }
}

/// Starts `source` feeding `router`; returns its task (none for a static list, reported at
/// once).
pub fn spawn(
    source: Source,
    router: Arc<Router>,
    interval: Duration,
) -> Option<tokio::task::JoinHandle<()>> {
    let slot = router.add_source();
    Some(match source {
        Source::Static(urls) => {
            static_list::report(&router, slot, urls);
            return None;
        }
        Source::Models(models) => {
            router.set_source_models(slot, models.into_iter().collect());
            return None;
        }
        Source::Dns { host, port } => tokio::spawn(dns::run(host, port, router, slot, interval)),
        Source::File(path) => tokio::spawn(file::run(path, router, slot, interval)),
        Source::K8s(target) => tokio::spawn(async move {
            match kube::Client::try_default().await {
                Ok(client) => k8s::run(client, target, router, slot).await,
                Err(e) => tracing::error!(
                    "Kubernetes discovery cannot start: {}",
                    DiscoveryError::Kube(e)
                ),
            }
        }),
    })
}

/// Replaces the source's set in the router (which logs the replicas added and removed).
fn report(router: &Router, slot: usize, urls: BTreeSet<ReplicaUrl>) {
    router.set_source(slot, urls);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        assert_eq!(
            Source::parse("dns://replicas.ns.svc.cluster.local:8000").unwrap(),
            Source::Dns {
                host: "replicas.ns.svc.cluster.local".into(),
                port: 8000
            }
        );
        assert_eq!(
            Source::parse("file:///tmp/replicas.json").unwrap(),
            Source::File("/tmp/replicas.json".into())
        );
        assert!(matches!(
            Source::parse("k8s://prod/llm:8000").unwrap(),
            Source::K8s(_)
        ));
        for bad in [
            "dns://x",
            "dns://:80",
            "file://",
            "consul://x",
            "k8s://prod",
            "k8s://prod/llm",
        ] {
            let e = Source::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with("--discover"), "{bad}: {e}");
        }
    }
}
