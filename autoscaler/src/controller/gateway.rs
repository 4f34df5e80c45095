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

use crate::scrape::{self, ModelQueue};

/// Reads one gateway's queue for one model.
#[derive(Debug, Clone)]
pub struct GatewayQueue {
    client: Client<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
}

impl GatewayQueue {
    pub fn new(timeout: Duration) -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(timeout));
        GatewayQueue {
            client: Client::builder(TokioExecutor::new()).build(http),
            timeout,
        }
    }

    /// The gateway at `base_url`'s queue for `model`; the error (a timeout, an HTTP error, not
    /// the exposition format) on one line.
    pub async fn read(&self, base_url: &str, model: &str) -> Result<ModelQueue, String> {
        let url = format!("{}/metrics", scrape::normalise_url(base_url));
        match scrape::fetch(&self.client, &url, self.timeout).await {
            Ok(snap) => Ok(snap.model_queue_of(model)),
            Err(e) => Err(scrape::error_chain(&e)),
        }
    }
}

impl Default for GatewayQueue {
    fn default() -> Self {
        GatewayQueue::new(Duration::from_secs(2))
    }
}
