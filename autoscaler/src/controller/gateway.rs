//! What the routing gateway holds for a pool's model (`spec.signals.gatewayUrl`): requests
//! waiting for a replica with room and requests held because none is ready, read from the
//! gateway's `/metrics` (`sluice_gateway_queue_depth` and `sluice_gateway_queue_held` by
//! `model`) each reconcile. At zero replicas this is the only sign of traffic: the replicas'
//! own series are gone with them.
//!
//! A sluice gateway also exports each model's front door (`sluice_gateway_model_*`): the
//! requests that arrived, their first tokens as clients waited, those refused or left
//! unserved. The reading carries them over the pool's windows, for the reconcile to fold into
//! the replicas' figures ([`crate::scrape::front_door`]).
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

use crate::scrape::front_door::FrontDoorWindows;
use crate::scrape::window::History;
use crate::scrape::{self, ModelQueue, SummedHistogram};

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
    /// When this gateway was first read: windows span no more than has been seen.
    since_s: Option<f64>,
}

/// The pool's windows a read covers, ending at `now_s` (seconds on the controller's clock).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Windows {
    pub now_s: f64,
    /// The long and short arrival windows and the latency window.
    pub long_s: f64,
    pub short_s: f64,
    pub latency_s: f64,
    /// The request shape's wider window, over which prompt bursts are read.
    pub shape_s: f64,
}

impl Windows {
    fn longest(&self) -> f64 {
        self.long_s
            .max(self.short_s)
            .max(self.latency_s)
            .max(self.shape_s)
    }
}

/// What one read of the gateway says about a model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatewayReading {
    pub queue: ModelQueue,
    /// Prompt tokens per second over the shape window; `None` when the gateway does not
    /// export them for the model.
    pub per_second: Option<SecondSums>,
    /// The model's front door over the pool's windows; `None` when the gateway does not
    /// export it.
    pub front_door: Option<FrontDoorWindows>,
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
            since_s: None,
        }
    }

    /// The gateway at `base_url`'s queue for `model`, summed over every address its host
    /// resolves to, their prompt tokens per second over the shape window and their front
    /// door over the pool's `windows`. Pods that do not answer are left out (a warning each);
    /// the error (a timeout, an HTTP error, not the exposition format, a host that does not
    /// resolve) on one line when none answers.
    pub async fn read(
        &mut self,
        base_url: &str,
        model: &str,
        windows: Windows,
    ) -> Result<GatewayReading, String> {
        let base = scrape::normalise_url(base_url);
        let urls = pod_urls(&base).await?;
        self.read_pods(base, &urls, model, windows).await
    }

    /// [`GatewayQueue::read`] over the pods' `/metrics` URLs `urls`, found from `base`.
    async fn read_pods(
        &mut self,
        base: String,
        urls: &BTreeSet<String>,
        model: &str,
        windows: Windows,
    ) -> Result<GatewayReading, String> {
        if base != self.base {
            self.base = base;
            self.histories.clear();
            self.since_s = None;
        }
        let since = *self.since_s.get_or_insert(windows.now_s);
        self.histories.retain(|u, _| urls.contains(u));
        let mut queue = ModelQueue::default();
        let mut bursts: Option<SummedHistogram> = None;
        let mut doors: Option<FrontDoorWindows> = None;
        let (mut answered, mut first_error) = (0, None);
        for url in urls {
            match self.read_pod(url, model, windows).await {
                Ok(pod) => {
                    answered += 1;
                    queue.add(&pod.queue);
                    if let Some(b) = pod.per_second {
                        bursts.get_or_insert_with(SummedHistogram::default).add(&b);
                    }
                    if let Some(d) = pod.front_door {
                        let (long, short, seen) =
                            (windows.long_s, windows.short_s, windows.now_s - since);
                        doors
                            .get_or_insert_with(|| FrontDoorWindows::spanning(long, short, seen))
                            .add(&d);
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
            per_second: bursts.as_ref().map(SummedHistogram::sums),
            front_door: doors,
        })
    }

    /// One pod's queue for `model`, its prompt tokens per second over the shape window and
    /// its front door over the others.
    async fn read_pod(&mut self, url: &str, model: &str, w: Windows) -> Result<PodReading, String> {
        let snap = scrape::fetch(&self.client, url, self.timeout)
            .await
            .map_err(|e| scrape::error_chain(&e))?;
        let queue = snap.model_queue_of(model);
        let exports_door = snap
            .front_door
            .as_ref()
            .is_some_and(|d| d.contains_key(model));
        let history = self.histories.entry(url.to_string()).or_default();
        history.push(w.now_s, snap);
        history.prune(w.now_s, w.longest());
        let front_door = exports_door.then(|| {
            history
                .front_door_windows(w.now_s, (w.long_s, w.short_s, w.latency_s, w.shape_s))
                .remove(model)
                .unwrap_or_default()
        });
        Ok(PodReading {
            queue,
            per_second: history.burst_increase(w.now_s, w.shape_s).remove(model),
            front_door,
        })
    }
}

/// What one gateway pod said about a model.
struct PodReading {
    queue: ModelQueue,
    per_second: Option<SummedHistogram>,
    front_door: Option<FrontDoorWindows>,
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

    /// The pool's default windows, ending at `now_s`.
    fn at(now_s: f64) -> Windows {
        Windows {
            now_s,
            long_s: 60.0,
            short_s: 10.0,
            latency_s: 60.0,
            shape_s: 420.0,
        }
    }

    /// Model `m`'s front door: `arrived` so far, `refused` of them queue-full, `within` first
    /// tokens within a second and `late` after ten.
    fn door(arrived: u32, refused: u32, within: u32, late: u32) -> String {
        use sluice_metrics::gateway::{
            ARRIVALS_TOTAL, TIME_TO_FIRST_TOKEN_SECONDS, UNSERVED_TOTAL,
        };
        let t = TIME_TO_FIRST_TOKEN_SECONDS;
        let all = within + late;
        format!(
            "{ARRIVALS_TOTAL}{{model=\"m\"}} {arrived}\n\
             {UNSERVED_TOTAL}{{model=\"m\",reason=\"queue_full\"}} {refused}\n\
             {t}_bucket{{model=\"m\",le=\"1\"}} {within}\n\
             {t}_bucket{{model=\"m\",le=\"10\"}} {within}\n\
             {t}_bucket{{model=\"m\",le=\"+Inf\"}} {all}\n\
             {t}_count{{model=\"m\"}} {all}\n"
        )
    }

    /// Two gateway pods' front doors add up over each window, spans no longer than the
    /// gateway has been read; a gateway without the series has none.
    #[tokio::test]
    async fn the_front_door_is_summed_over_pods_and_windows() {
        let ((a, a_text), (b, b_text)) = (pod().await, pod().await);
        *a_text.lock().unwrap() = text(0, 0);
        *b_text.lock().unwrap() = text(0, 0);
        let urls: BTreeSet<String> = [a.clone(), b.clone()].into();
        let base = "http://gateway".to_string();
        let mut g = GatewayQueue::new(Duration::from_secs(2));
        let r = g
            .read_pods(base.clone(), &urls, "m", at(0.0))
            .await
            .unwrap();
        assert_eq!(r.front_door, None, "an older gateway exports none");
        let mut g = GatewayQueue::new(Duration::from_secs(2));
        let reads = [
            (0.0, door(100, 0, 90, 10), door(1000, 5, 900, 0)),
            (15.0, door(115, 4, 95, 10), door(1015, 5, 905, 0)),
            (30.0, door(130, 10, 100, 10), door(1030, 25, 910, 0)),
        ];
        let mut last = None;
        for (t, x, y) in reads {
            *a_text.lock().unwrap() = x;
            *b_text.lock().unwrap() = y;
            last = Some(g.read_pods(base.clone(), &urls, "m", at(t)).await.unwrap());
        }
        let d = last.unwrap().front_door.expect("both export it");
        // Long window: the 30 s seen, 15 + 15 arrived a pod, 10 + 20 refused.
        assert_eq!((d.long.0.arrivals, d.long.1), (60.0, 30.0));
        assert_eq!((d.long.0.unserved, d.latency.unserved), (30.0, 30.0));
        assert_eq!(d.latency.ttft.count(), 20.0);
        // Short window (20, 30]: the last step only.
        assert_eq!((d.short.0.arrivals, d.short.1), (30.0, 10.0));
        assert_eq!(d.short.0.unserved, 26.0);
        assert_eq!(d.short.0.ttft.count(), 10.0);
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
            .read_pods(base.clone(), &urls, "m", at(0.0))
            .await
            .unwrap();
        assert_eq!(first.queue.waiting, 5.0);
        *a_text.lock().unwrap() = text(1, 14);
        *b_text.lock().unwrap() = text(0, 506);
        let r = g
            .read_pods(base.clone(), &urls, "m", at(60.0))
            .await
            .unwrap();
        assert_eq!(r.queue.waiting, 1.0);
        let sums = r.per_second.expect("both export the histogram");
        assert_eq!(sums.seconds(), 10.0, "{sums:?}");
        // Pod b gone: pod a alone, its history kept.
        let gone: BTreeSet<String> = [a.clone(), "http://127.0.0.1:9/metrics".into()].into();
        *a_text.lock().unwrap() = text(4, 20);
        let r = g
            .read_pods(base.clone(), &gone, "m", at(120.0))
            .await
            .unwrap();
        assert_eq!(r.queue.waiting, 4.0);
        assert_eq!(r.per_second.unwrap().seconds(), 10.0);
        let none: BTreeSet<String> = ["http://127.0.0.1:9/metrics".to_string()].into();
        assert!(g.read_pods(base, &none, "m", at(180.0)).await.is_err());
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
