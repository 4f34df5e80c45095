//! What the routing gateway holds for a pool's model (`spec.signals.gatewayUrl`): requests
//! waiting for a replica with room and requests held because none is ready, read from the
//! gateway's `/metrics` (`sluice_gateway_queue_depth` and `sluice_gateway_queue_held` by
//! `model`) each reconcile. At zero replicas this is the only sign of traffic: the replicas'
//! own series are gone with them.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use sluice_policy::signals::SecondSums;

use crate::scrape::window::History;
use crate::scrape::{self, BurstHistogram, ModelQueue};

/// Reads one gateway's queue for one model, and keeps its recent snapshots for the prompt
/// tokens per second it saw (`sluice_gateway_prompt_tokens_per_second`) over the pool's shape
/// window: a source that reads only the replicas has no other view of bursts.
#[derive(Debug, Clone)]
pub struct GatewayQueue {
    client: Client<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
    /// The gateway's URL and its snapshots (a new URL starts afresh).
    history: Option<(String, History)>,
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
            history: None,
        }
    }

    /// The gateway at `base_url`'s queue for `model`, and its prompt tokens per second over
    /// the `shape_window_s` ending at `now_s`; the error (a timeout, an HTTP error, not the
    /// exposition format) on one line.
    pub async fn read(
        &mut self,
        base_url: &str,
        model: &str,
        (now_s, shape_window_s): (f64, f64),
    ) -> Result<GatewayReading, String> {
        let url = format!("{}/metrics", scrape::normalise_url(base_url));
        let snap = scrape::fetch(&self.client, &url, self.timeout)
            .await
            .map_err(|e| scrape::error_chain(&e))?;
        let queue = snap.model_queue_of(model);
        if self.history.as_ref().is_none_or(|(u, _)| *u != url) {
            self.history = Some((url.clone(), History::default()));
        }
        let (_, history) = self.history.as_mut().expect("set above");
        history.push(now_s, snap);
        history.prune(now_s, shape_window_s);
        let per_second = history
            .burst_increase(now_s, shape_window_s)
            .get(model)
            .map(BurstHistogram::sums);
        Ok(GatewayReading { queue, per_second })
    }
}

impl Default for GatewayQueue {
    fn default() -> Self {
        GatewayQueue::new(Duration::from_secs(2))
    }
}
