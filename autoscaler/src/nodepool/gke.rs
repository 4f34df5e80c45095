//! The `gke` provider: a node pool's size, or its autoscaling bounds, through the GKE REST API
//! (`projects.locations.clusters.nodePools.setSize` / `setAutoscaling`).
//!
//! It authenticates as the pod's Workload Identity: an access token from the metadata server
//! (`Metadata-Flavor: Google`), cached until a minute before it expires. Both base URLs are
//! settings so tests point them at fakes. The API does not report a pool's current node
//! count, so the provider remembers what it last set and calls again only on a change (and
//! once after a restart, which is harmless: setting a size is idempotent).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Mutex;

use super::{NodePoolProvider, NodeRequest, Outcome};
use crate::controller::error::{Error, Result};
use crate::crd::GkeMode;

/// The GKE API's and the metadata server's defaults.
pub const GKE_API: &str = "https://container.googleapis.com";
pub const METADATA: &str = "http://metadata.google.internal";
const TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";

/// Which cluster the pools belong to, and where the APIs are.
#[derive(Debug, Clone, PartialEq)]
pub struct GkeConfig {
    pub project: String,
    /// A region or zone.
    pub location: String,
    pub cluster: String,
    pub api_url: String,
    pub metadata_url: String,
}

/// The provider, with its token cache and what it last set per pool.
#[derive(Debug)]
pub struct Gke {
    config: GkeConfig,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    token: Mutex<Option<(String, Instant)>>,
    last: Mutex<HashMap<String, (GkeMode, u32)>>,
}

#[derive(Deserialize)]
struct Token {
    access_token: String,
    expires_in: u64,
}

impl Gke {
    pub fn new(config: GkeConfig) -> Result<Self> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| Error::NodePool {
                provider: "gke",
                pool: String::new(),
                message: format!("no TLS root certificates: {e}"),
            })?
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
        Ok(Gke {
            config,
            client,
            token: Mutex::new(None),
            last: Mutex::new(HashMap::new()),
        })
    }

    fn err(pool: &str, message: impl Into<String>) -> Error {
        Error::NodePool {
            provider: "gke",
            pool: pool.to_string(),
            message: message.into(),
        }
    }

    /// Sends a request; the body of a 2xx answer, or an error naming the status and body.
    async fn call(&self, pool: &str, req: Request<Full<Bytes>>) -> Result<Bytes> {
        let uri = req.uri().to_string();
        let resp = tokio::time::timeout(Duration::from_secs(30), self.client.request(req))
            .await
            .map_err(|_| Self::err(pool, format!("{uri}: timed out")))?
            .map_err(|e| Self::err(pool, format!("{uri}: {e}")))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| Self::err(pool, format!("{uri}: reading the answer: {e}")))?
            .to_bytes();
        if !status.is_success() {
            return Err(Self::err(
                pool,
                format!("{uri}: {status}: {}", String::from_utf8_lossy(&body)),
            ));
        }
        Ok(body)
    }

    async fn token(&self, pool: &str) -> Result<String> {
        let mut cached = self.token.lock().await;
        if let Some((t, until)) = cached.as_ref() {
            if Instant::now() < *until {
                return Ok(t.clone());
            }
        }
        let req = Request::get(format!("{}{TOKEN_PATH}", self.config.metadata_url))
            .header("Metadata-Flavor", "Google")
            .body(Full::new(Bytes::new()))
            .map_err(|e| Self::err(pool, format!("metadata request: {e}")))?;
        let body = self.call(pool, req).await?;
        let t: Token = serde_json::from_slice(&body)
            .map_err(|e| Self::err(pool, format!("metadata token answer: {e}")))?;
        let until = Instant::now() + Duration::from_secs(t.expires_in.saturating_sub(60));
        *cached = Some((t.access_token.clone(), until));
        Ok(t.access_token)
    }

    fn pool_url(&self, pool: &str, verb: &str) -> String {
        let c = &self.config;
        format!(
            "{}/v1/projects/{}/locations/{}/clusters/{}/nodePools/{pool}:{verb}",
            c.api_url, c.project, c.location, c.cluster
        )
    }

    async fn apply(&self, req: &NodeRequest) -> Result<Outcome> {
        let pool = &req.node_pool;
        let want = (req.gke_mode, req.nodes);
        if self.last.lock().await.get(pool) == Some(&want) {
            return Ok(Outcome::Unchanged);
        }
        let (verb, body, said) = match req.gke_mode {
            GkeMode::Size => (
                "setSize",
                json!({"nodeCount": req.nodes}),
                format!("node pool {pool} size set to {}", req.nodes),
            ),
            GkeMode::Autoscaling => (
                "setAutoscaling",
                json!({"autoscaling": {"enabled": true, "minNodeCount": 0, "maxNodeCount": req.nodes.max(1)}}),
                format!(
                    "node pool {pool} autoscaling bounds set to [0, {}]",
                    req.nodes.max(1)
                ),
            ),
        };
        let token = self.token(pool).await?;
        let http = Request::post(self.pool_url(pool, verb))
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| Self::err(pool, format!("request: {e}")))?;
        self.call(pool, http).await?;
        self.last.lock().await.insert(pool.clone(), want);
        Ok(Outcome::Changed(said))
    }
}

impl NodePoolProvider for Gke {
    fn name(&self) -> &'static str {
        "gke"
    }
    fn ensure<'a>(&'a self, req: &'a NodeRequest) -> BoxFuture<'a, Result<Outcome>> {
        Box::pin(self.apply(req))
    }
}
