//! [`RemoteBackend`]: one replica reached over HTTP — another `sluice serve --model`, vLLM, or
//! any OpenAI-compatible server. Each replica has its own pooled hyper client (keep-alive
//! connections are reused across requests, `TCP_NODELAY` on, a connect timeout), so one slow
//! or dead replica never holds connections another needs.
//!
//! Keep-alive reuse races the replica's own idle timeout: a request written on a connection
//! the server closes at that moment fails before any byte of answer. Two things keep that from
//! reading as a replica failure. Idle connections are dropped after [`POOL_IDLE`], shorter than
//! servers' idle timeouts (uvicorn's 5 s, hyper's and llama.cpp's longer), so the pool rarely
//! offers one the server is closing. And a request lost to reuse anyway (see [`sluice_conn`])
//! is sent once more at once on a new connection; only that second outcome is reported. The
//! body is buffered, and the replica sent no byte, so the resend is safe.
//!
//! The client moves bytes: it sends a request body it was given and hands back the response
//! head and its body frame by frame. What to send where, and what a failure means, is the
//! rest of the router's business.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use sluice_conn::{self as conn, Tracking};

/// How long an idle keep-alive connection stays in a replica's pool: below the idle timeout of
/// the servers replicas run (uvicorn's default is 5 s), so the pool drops a connection before
/// the server does.
pub const POOL_IDLE: Duration = Duration::from_secs(3);

type Http = Client<Tracking<HttpConnector>, Full<Bytes>>;

/// A replica's base URL, `http://host:port`, validated.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaUrl(String);

impl ReplicaUrl {
    /// Accepts `http://host:port` (a trailing `/` is dropped). TLS to replicas is not
    /// supported: replicas sit inside the cluster network, next to the gateway.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim().trim_end_matches('/');
        let rest = s.strip_prefix("http://").ok_or_else(|| {
            format!("'{s}' is not an http:// URL (https to replicas is not supported)")
        })?;
        if rest.is_empty() || rest.contains('/') || rest.contains('?') || rest.contains('@') {
            return Err(format!(
                "'{s}' must be a base URL, http://host:port, without a path"
            ));
        }
        let uri: hyper::Uri = s
            .parse()
            .map_err(|e| format!("'{s}' is not a valid URL: {e}"))?;
        if uri.host().is_none_or(str::is_empty) {
            return Err(format!("'{s}' has no host"));
        }
        Ok(Self(s.to_string()))
    }

    /// From a socket address, as DNS and Kubernetes discovery find them.
    pub fn from_addr(addr: std::net::SocketAddr) -> Self {
        Self(format!("http://{addr}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ReplicaUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a replica could not be reached or did not answer.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("connecting to {url} failed: {source}")]
    Connect {
        url: ReplicaUrl,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("{url} failed the exchange: {source}")]
    Exchange {
        url: ReplicaUrl,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("reading {url}'s answer failed: {source}")]
    Body {
        url: ReplicaUrl,
        #[source]
        source: hyper::Error,
    },
    #[error("{url} answered {status}")]
    Status { url: ReplicaUrl, status: StatusCode },
    #[error("{url}'s answer is larger than {limit} bytes")]
    TooLarge { url: ReplicaUrl, limit: usize },
    #[error("{url} did not answer within {after:?}")]
    Timeout { url: ReplicaUrl, after: Duration },
}

impl RemoteError {
    /// For `sluice_gateway_upstream_requests_total{status}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Connect { .. } => "connect_error",
            Self::Exchange { .. } | Self::Body { .. } => "io_error",
            Self::Status { .. } => "bad_status",
            Self::TooLarge { .. } => "too_large",
            Self::Timeout { .. } => "timeout",
        }
    }
}

/// Client settings shared by every replica's pool.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    pub connect_timeout: Duration,
    /// Idle keep-alive connections kept per replica.
    pub max_idle: usize,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(1),
            max_idle: 256,
        }
    }
}

/// One replica's HTTP client.
#[derive(Debug, Clone)]
pub struct RemoteBackend {
    url: ReplicaUrl,
    client: Http,
    /// Without a pool: a new connection per request, for the resend after one lost to reuse.
    fresh: Http,
}

impl RemoteBackend {
    pub fn new(url: ReplicaUrl, opts: &RemoteOptions) -> Self {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.set_connect_timeout(Some(opts.connect_timeout));
        let conn = Tracking(conn);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(opts.max_idle)
            .pool_idle_timeout(POOL_IDLE)
            .build(conn.clone());
        let fresh = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(conn);
        Self { url, client, fresh }
    }

    pub fn url(&self) -> &ReplicaUrl {
        &self.url
    }

    /// Sends `method path` with `body` and the given headers; resolves with the response head
    /// (the body still streaming). A request lost to keep-alive reuse is sent once more on a
    /// new connection (see the module doc).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(hyper::header::HeaderName, hyper::header::HeaderValue)],
        body: Bytes,
    ) -> Result<Response<Incoming>, RemoteError> {
        let request = || {
            let mut req = Request::builder()
                .method(method.clone())
                .uri(format!("{}{path}", self.url));
            for (k, v) in headers {
                req = req.header(k, v);
            }
            req.body(Full::new(body.clone()))
                .expect("a validated base URL and a path form a request")
        };
        let answer = match self.client.request(request()).await {
            Err(e) if conn::lost_to_reuse(&e) => {
                tracing::debug!(replica = %self.url, "resending a request lost to keep-alive reuse: {e}");
                self.fresh.request(request()).await
            }
            first => first,
        };
        answer.map_err(|source| {
            if source.is_connect() {
                RemoteError::Connect {
                    url: self.url.clone(),
                    source,
                }
            } else {
                RemoteError::Exchange {
                    url: self.url.clone(),
                    source,
                }
            }
        })
    }

    /// A small GET (metrics, models, health) read whole, within `timeout` and `limit` bytes.
    /// Non-2xx answers are errors carrying the status.
    pub async fn get(
        &self,
        path: &str,
        timeout: Duration,
        limit: usize,
    ) -> Result<Bytes, RemoteError> {
        let fetch = async {
            let resp = self.send(Method::GET, path, &[], Bytes::new()).await?;
            let status = resp.status();
            if !status.is_success() {
                return Err(RemoteError::Status {
                    url: self.url.clone(),
                    status,
                });
            }
            let body = http_body_util::Limited::new(resp.into_body(), limit)
                .collect()
                .await
                .map_err(|e| match e.downcast::<hyper::Error>() {
                    Ok(source) => RemoteError::Body {
                        url: self.url.clone(),
                        source: *source,
                    },
                    Err(_) => RemoteError::TooLarge {
                        url: self.url.clone(),
                        limit,
                    },
                })?;
            Ok(body.to_bytes())
        };
        tokio::time::timeout(timeout, fetch)
            .await
            .map_err(|_| RemoteError::Timeout {
                url: self.url.clone(),
                after: timeout,
            })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_urls_are_base_http_urls() {
        assert_eq!(
            ReplicaUrl::parse("http://10.0.0.1:8000/").unwrap().as_str(),
            "http://10.0.0.1:8000"
        );
        assert!(ReplicaUrl::parse("http://replica.ns.svc:8000").is_ok());
        assert!(ReplicaUrl::parse("http://[::1]:8000").is_ok());
        for bad in [
            "https://x:1",
            "10.0.0.1:8000",
            "http://",
            "http://x:1/v1",
            "http://u@x:1",
        ] {
            assert!(ReplicaUrl::parse(bad).is_err(), "{bad}");
        }
        let a: std::net::SocketAddr = "[::1]:9".parse().unwrap();
        assert_eq!(ReplicaUrl::from_addr(a).as_str(), "http://[::1]:9");
    }
}
