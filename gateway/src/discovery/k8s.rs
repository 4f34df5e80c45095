//! `k8s://NAMESPACE/SERVICE:PORT`: the replicas behind a Kubernetes Service, from its
//! EndpointSlices (`discovery.k8s.io/v1`, label `kubernetes.io/service-name=SERVICE`) through
//! a kube-rs watcher — one list, then a watch that resumes from the last resource version and
//! relists when the server says the version is gone — so pods appear and disappear as the
//! control plane reports them, with no polling.
//!
//! Only endpoints whose `ready` condition is true (or unset, which the API defines as ready)
//! are replicas: a pod that is starting, failing its readiness probe or terminating is left
//! out. PORT is a port number, or the name of one of the slice's ports.
//!
//! The report is the union over the Service's slices. During a relist, events are buffered
//! until the list is complete, so a restarted watch never reports a half-empty fleet.
//!
//! The Service itself is watched too, for its [`MODELS_ANNOTATION`] (`sluice.dev/models:
//! "a,b"`): the pool's model names, known while it has no ready endpoint (scaled to zero).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;

use crate::router::remote::ReplicaUrl;
use crate::router::Router;

/// The Service annotation naming the pool's models, comma-separated.
pub const MODELS_ANNOTATION: &str = "sluice.dev/models";

/// Which Service and port to follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub namespace: String,
    pub service: String,
    pub port: Port,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Port {
    Number(u16),
    Name(String),
}

impl Target {
    /// `NAMESPACE/SERVICE:PORT`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let usage = || format!("'k8s://{s}' must be k8s://NAMESPACE/SERVICE:PORT");
        let (namespace, rest) = s.split_once('/').ok_or_else(usage)?;
        let (service, port) = rest.rsplit_once(':').ok_or_else(usage)?;
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.len() <= 253
                && n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        };
        if !name_ok(namespace) || !name_ok(service) || port.is_empty() {
            return Err(usage());
        }
        let port = match port.parse::<u16>() {
            Ok(p) => Port::Number(p),
            Err(_) => Port::Name(port.to_string()),
        };
        Ok(Self {
            namespace: namespace.to_string(),
            service: service.to_string(),
            port,
        })
    }

    pub fn label_selector(&self) -> String {
        format!("kubernetes.io/service-name={}", self.service)
    }
}

/// The ready replicas one slice lists.
pub fn endpoints(slice: &EndpointSlice, target: &Target) -> BTreeSet<ReplicaUrl> {
    let port = match &target.port {
        Port::Number(p) => Some(*p),
        Port::Name(name) => slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok()),
    };
    let Some(port) = port else {
        return BTreeSet::new();
    };
    slice
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| match a.parse::<std::net::IpAddr>() {
            Ok(ip) => Some(ReplicaUrl::from_addr((ip, port).into())),
            Err(_) => ReplicaUrl::parse(&format!("http://{a}:{port}")).ok(),
        })
        .collect()
}

fn slice_name(s: &EndpointSlice) -> String {
    s.metadata.name.clone().unwrap_or_default()
}

/// The models a Service's annotation names.
pub fn models(service: &Service) -> BTreeSet<String> {
    service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MODELS_ANNOTATION))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Follows the Service's EndpointSlices and its models annotation until the task is dropped.
pub async fn run(client: kube::Client, target: Target, router: Arc<Router>, slot: usize) {
    tokio::join!(
        follow_slices(client.clone(), &target, &router, slot),
        follow_service(client, &target, &router, slot),
    );
}

/// Follows the Service's models annotation (a relist is buffered like the slices').
async fn follow_service(client: kube::Client, target: &Target, router: &Router, slot: usize) {
    let api: Api<Service> = Api::namespaced(client, &target.namespace);
    let name = format!("metadata.name={}", target.service);
    let mut events = watcher(api, watcher::Config::default().fields(&name))
        .default_backoff()
        .boxed();
    let ours = |s: &Service| s.metadata.name.as_deref() == Some(target.service.as_str());
    let mut relist: Option<BTreeSet<String>> = None;
    while let Some(ev) = events.next().await {
        match ev {
            Ok(Event::Init) => relist = Some(BTreeSet::new()),
            Ok(Event::InitApply(s)) if ours(&s) => relist = Some(models(&s)),
            Ok(Event::InitDone) => {
                if let Some(m) = relist.take() {
                    router.set_source_models(slot, m);
                }
            }
            Ok(Event::Apply(s)) if ours(&s) => router.set_source_models(slot, models(&s)),
            Ok(Event::Delete(s)) if ours(&s) => router.set_source_models(slot, BTreeSet::new()),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                namespace = %target.namespace,
                service = %target.service,
                "Service watch: {e}; retrying with backoff, keeping the last models"
            ),
        }
    }
}

/// Follows the Service's EndpointSlices.
async fn follow_slices(client: kube::Client, target: &Target, router: &Router, slot: usize) {
    let api: Api<EndpointSlice> = Api::namespaced(client, &target.namespace);
    let cfg = watcher::Config::default().labels(&target.label_selector());
    let mut events = watcher(api, cfg).default_backoff().boxed();
    let mut slices: HashMap<String, BTreeSet<ReplicaUrl>> = HashMap::new();
    let mut relist: Option<HashMap<String, BTreeSet<ReplicaUrl>>> = None;
    let report = |slices: &HashMap<String, BTreeSet<ReplicaUrl>>| {
        super::report(router, slot, slices.values().flatten().cloned().collect());
    };
    while let Some(ev) = events.next().await {
        match ev {
            Ok(Event::Init) => relist = Some(HashMap::new()),
            Ok(Event::InitApply(s)) => {
                if let Some(buf) = relist.as_mut() {
                    buf.insert(slice_name(&s), endpoints(&s, target));
                }
            }
            Ok(Event::InitDone) => {
                if let Some(buf) = relist.take() {
                    slices = buf;
                    report(&slices);
                }
            }
            Ok(Event::Apply(s)) => {
                slices.insert(slice_name(&s), endpoints(&s, target));
                report(&slices);
            }
            Ok(Event::Delete(s)) => {
                slices.remove(&slice_name(&s));
                report(&slices);
            }
            Err(e) => tracing::warn!(
                namespace = %target.namespace,
                service = %target.service,
                "EndpointSlice watch: {e}; retrying with backoff, keeping the last set"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(
            Target::parse("prod/llm:8000").unwrap(),
            Target {
                namespace: "prod".into(),
                service: "llm".into(),
                port: Port::Number(8000)
            }
        );
        assert_eq!(
            Target::parse("prod/llm:http").unwrap().port,
            Port::Name("http".into())
        );
        for bad in ["prod", "prod/llm", "/llm:80", "Prod/llm:80", "prod/:80"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_ready_endpoints_on_the_named_port_count() {
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "llm-abc"},
            "addressType": "IPv4",
            "ports": [{"name": "metrics", "port": 9000}, {"name": "http", "port": 8000}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
                {"addresses": ["10.0.0.3"]},
                {"addresses": ["10.0.0.4"], "conditions": {"ready": false, "terminating": true}}
            ]
        }))
        .unwrap();
        let t = Target::parse("prod/llm:http").unwrap();
        let got: Vec<String> = endpoints(&slice, &t)
            .iter()
            .map(|u| u.to_string())
            .collect();
        assert_eq!(got, ["http://10.0.0.1:8000", "http://10.0.0.3:8000"]);
        let missing = Target::parse("prod/llm:grpc").unwrap();
        assert!(endpoints(&slice, &missing).is_empty());
    }
}
