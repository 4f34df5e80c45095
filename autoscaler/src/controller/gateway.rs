//! What the routing gateway holds for a pool's model (`spec.signals.gatewayUrl`): requests
//! waiting for a replica with room and requests held because none is ready, read from the
//! gateway's `/metrics` (`sluice_gateway_queue_depth` and `sluice_gateway_queue_held` by
//! `model`) each reconcile. At zero replicas this is the only sign of traffic: the replicas'
//! own series are gone with them.
//!
//! The URL's host may name several gateway pods (a headless Service resolves to every ready
//! pod's address): each address is read, the queues summed, and each pod's prompt-token
//! counters kept in a history of its own, so that two pods' counters never read as a restart
//! of one. A ClusterIP Service resolves to one address and reaches one pod per read.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use sluice_policy::signals::SecondSums;

use crate::scrape::window::History;
use crate::scrape::{self, BurstHistogram, ModelQueue};

/// Reads the gateway pods' queues for one model, and keeps each pod's recent snapshots for
/// the prompt tokens per second it saw (`sluice_gateway_prompt_tokens_per_second`) over the
/// pool's shape window: a source that reads only the replicas has no other view of bursts.
#[derive(Debug, Clone)]
pub struct GatewayQueue {
    client: Client<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
    /// The gateway's base URL the histories are for (a new one starts afresh).
    base: String,
    /// Per pod `/metrics` URL, its snapshots; pods no longer resolved are dropped.
    histories: BTreeMap<String, History>,
}

/// What one read of the gateway says about a model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatewayReading {
    pub queue: ModelQueue,
    /// Prompt tokens per second over the shape window; `None` when the gateway does not
    /// export them for the model.
    pub per_second: Option<SecondSums>,
}

impl GatewayQueue {
    pub fn new(timeout: Duration) -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(timeout));
        GatewayQueue {
            client: Client::builder(TokioExecutor::new()).build(http),
            timeout,
            base: String::new(),
            histories: BTreeMap::new(),
        }
    }

    /// The gateway at `base_url`'s queue for `model`, summed over every address its host
    /// resolves to, and their prompt tokens per second over the `shape_window_s` ending at
    /// `now_s`. Pods that do not answer are left out (a warning each); the error (a timeout,
    /// an HTTP error, not the exposition format, a host that does not resolve) on one line
    /// when none answers.
    pub async fn read(
        &mut self,
        base_url: &str,
        model: &str,
        window: (f64, f64),
    ) -> Result<GatewayReading, String> {
        let base = scrape::normalise_url(base_url);
        let urls = pod_urls(&base).await?;
        self.read_pods(base, &urls, model, window).await
    }

    /// [`GatewayQueue::read`] over the pods' `/metrics` URLs `urls`, found from `base`.
    async fn read_pods(
        &mut self,
        base: String,
        urls: &BTreeSet<String>,
        model: &str,
        window: (f64, f64),
    ) -> Result<GatewayReading, String> {
        if base != self.base {
            self.base = base;
            self.histories.clear();
        }
        self.histories.retain(|u, _| urls.contains(u));
        let mut queue = ModelQueue::default();
        let mut bursts: Option<BurstHistogram> = None;
        let (mut answered, mut first_error) = (0, None);
        for url in urls {
            match self.read_pod(url, model, window).await {
                Ok((q, b)) => {
                    answered += 1;
                    queue.add(&q);
                    if let Some(b) = b {
                        bursts.get_or_insert_with(BurstHistogram::default).add(&b);
                    }
                }
                Err(e) => {
                    tracing::warn!(gateway = %url, error = %e, "gateway pod metrics");
                    first_error.get_or_insert(e);
                }
            }
        }
        if answered == 0 {
            return Err(first_error.unwrap_or_else(|| format!("{}: no address", self.base)));
        }
        Ok(GatewayReading {
            queue,
            per_second: bursts.as_ref().map(BurstHistogram::sums),
        })
    }

    /// One pod's queue for `model` and its prompt tokens per second over the window.
    async fn read_pod(
        &mut self,
        url: &str,
        model: &str,
        (now_s, shape_window_s): (f64, f64),
    ) -> Result<(ModelQueue, Option<BurstHistogram>), String> {
        let snap = scrape::fetch(&self.client, url, self.timeout)
            .await
            .map_err(|e| scrape::error_chain(&e))?;
        let queue = snap.model_queue_of(model);
        let history = self.histories.entry(url.to_string()).or_default();
        history.push(now_s, snap);
        history.prune(now_s, shape_window_s);
        let bursts = history.burst_increase(now_s, shape_window_s).remove(model);
        Ok((queue, bursts))
    }
}

/// The `/metrics` URL of every address `base`'s host resolves to (the host itself when it is
/// an address), IPv4 ones where there are any, in a stable order.
async fn pod_urls(base: &str) -> Result<BTreeSet<String>, String> {
    let uri: hyper::Uri = base
        .parse()
        .map_err(|e| format!("gateway URL {base}: {e}"))?;
    if uri.scheme_str().is_some_and(|s| s != "http") {
        return Err(format!("gateway URL {base}: only http is read"));
    }
    let host = uri
        .host()
        .ok_or_else(|| format!("gateway URL {base}: no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let path = uri.path().trim_end_matches('/');
    let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("gateway {base}: resolving {host}: {e}"))?
        .collect();
    // One family: a dual-stack pod (or `localhost`) resolves to an address of each, and
    // reading both would count its queue twice.
    let v4 = addrs.iter().any(|a| a.is_ipv4());
    Ok(addrs
        .iter()
        .filter(|a| a.is_ipv4() == v4)
        .map(|a| format!("http://{a}{path}/metrics"))
        .collect())
}

impl Default for GatewayQueue {
    fn default() -> Self {
        GatewayQueue::new(Duration::from_secs(2))
    }
}

#[cfg(test)]
#[path = "../../tests/fake_gateway/mod.rs"]
mod fake_gateway;

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A fake gateway pod on loopback: its `/metrics` URL and the text it answers, to set.
    async fn pod() -> (String, Arc<Mutex<String>>) {
        let (base, text) = super::fake_gateway::fake_gateway().await;
        (format!("{base}/metrics"), text)
    }

    /// `waiting` queued for model `m`, and `seconds` seconds of 1,000 prompt tokens so far.
    fn text(waiting: u32, seconds: u32) -> String {
        let name = sluice_metrics::gateway::PROMPT_TOKENS_PER_SECOND;
        format!(
            "sluice_gateway_queue_depth{{model=\"m\",priority=\"0\"}} {waiting}\n\
             {name}_bucket{{model=\"m\",le=\"1024\"}} {seconds}\n\
             {name}_bucket{{model=\"m\",le=\"+Inf\"}} {seconds}\n\
             {name}_sum{{model=\"m\"}} {}\n\
             {name}_count{{model=\"m\"}} {seconds}\n",
            seconds * 1000
        )
    }

    /// Two gateway pods behind one name: their queues add up, and each pod's counters keep a
    /// history of their own (pod b's far larger count is no restart of pod a's). A pod that
    /// does not answer is left out; none answering is an error.
    #[tokio::test]
    async fn every_gateway_pod_is_read_and_their_bursts_add_up() {
        let ((a, a_text), (b, b_text)) = (pod().await, pod().await);
        *a_text.lock().unwrap() = text(2, 10);
        *b_text.lock().unwrap() = text(3, 500);
        let urls: BTreeSet<String> = [a.clone(), b.clone()].into();
        let base = "http://gateway".to_string();
        let mut g = GatewayQueue::new(Duration::from_secs(2));
        let first = g
            .read_pods(base.clone(), &urls, "m", (0.0, 420.0))
            .await
            .unwrap();
        assert_eq!(first.queue.waiting, 5.0);
        *a_text.lock().unwrap() = text(1, 14);
        *b_text.lock().unwrap() = text(0, 506);
        let r = g
            .read_pods(base.clone(), &urls, "m", (60.0, 420.0))
            .await
            .unwrap();
        assert_eq!(r.queue.waiting, 1.0);
        let sums = r.per_second.expect("both export the histogram");
        assert_eq!(sums.seconds(), 10.0, "{sums:?}");
        // Pod b gone: pod a alone, its history kept.
        let gone: BTreeSet<String> = [a.clone(), "http://127.0.0.1:9/metrics".into()].into();
        *a_text.lock().unwrap() = text(4, 20);
        let r = g
            .read_pods(base.clone(), &gone, "m", (120.0, 420.0))
            .await
            .unwrap();
        assert_eq!(r.queue.waiting, 4.0);
        assert_eq!(r.per_second.unwrap().seconds(), 10.0);
        let none: BTreeSet<String> = ["http://127.0.0.1:9/metrics".to_string()].into();
        assert!(g.read_pods(base, &none, "m", (180.0, 420.0)).await.is_err());
    }

    #[tokio::test]
    async fn an_address_is_its_own_pod_and_a_name_resolves() {
        let urls = pod_urls("http://127.0.0.1:8080/gw").await.unwrap();
        assert_eq!(
            urls,
            ["http://127.0.0.1:8080/gw/metrics".to_string()].into()
        );
        let urls = pod_urls("http://localhost:8080").await.unwrap();
        assert_eq!(urls.len(), 1, "one family: {urls:?}");
        assert!(pod_urls("https://127.0.0.1").await.is_err());
        assert!(pod_urls("not a url").await.is_err());
    }
}
