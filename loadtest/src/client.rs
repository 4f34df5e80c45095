//! The HTTP side: one pooled hyper client, the OpenAI request bodies, and the timing of each
//! response as its bytes arrive. Only this module knows OpenAI's wire format; it hands
//! [`crate::metrics`] plain timestamps and token counts.
//!
//! `https://` targets go through rustls (ring, the system's root certificates); `http://` ones
//! never touch TLS, so a plain-HTTP run costs no handshakes and needs no certificates.
//!
//! Keep-alive: a pooled connection idle longer than [`POOL_IDLE`] is not reused, which keeps
//! clear of common servers' keep-alive timeouts; a request that still meets a connection the
//! server has just closed (no byte of answer, see [`sluice_conn`]) is sent once more on a new
//! connection and marked [`Observed::retried`], not counted as failed.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Response, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sse;
use sluice_conn::{self as conn, Tracking};

/// How long a pooled connection may sit idle and still be reused: under the keep-alive timeouts
/// of llama.cpp's server, uvicorn (vLLM) and Node (5 s each), so the client lets a connection go
/// before the server is about to close it.
pub const POOL_IDLE: Duration = Duration::from_secs(3);

/// Which OpenAI API to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `/v1/chat/completions`, the prompt as one user message.
    Chat,
    /// `/v1/completions`, the prompt as is.
    Completions,
}

/// Where and how to send.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http://host:port`, without a trailing `/v1`.
    pub base: String,
    pub endpoint: Endpoint,
    pub model: String,
    pub stream: bool,
    pub ignore_eos: bool,
    pub api_key: Option<String>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub timeout: Duration,
}

/// Normalises a base URL: strips a trailing `/` and `/v1`, insists on `http://` or `https://`.
pub fn normalize_base(url: &str) -> Result<String> {
    let mut s = url.trim().trim_end_matches('/').to_string();
    if let Some(stripped) = s.strip_suffix("/v1") {
        s = stripped.to_string();
    }
    let bad = |reason: &str| Error::Url {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    if !s.starts_with("http://") && !s.starts_with("https://") {
        return Err(bad("want http://host[:port] or https://host[:port]"));
    }
    s.parse::<Uri>().map_err(|e| bad(&e.to_string()))?;
    Ok(s)
}

/// How a request ended, when it did not succeed. `label()` is what the report counts by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// A non-2xx status, with the start of the body and the OpenAI error `type` (or `code`) the
    /// body named, if any.
    Status(u16, String, Option<String>),
    /// No connection could be made.
    Connect(String),
    /// The whole request took longer than `--timeout`.
    Timeout,
    /// The connection broke mid-response.
    Body(String),
    /// The server sent an `error` object inside a 200 stream (its JSON, and its `type`).
    StreamError(String, Option<String>),
    /// The response was not the JSON we expected.
    BadResponse(String),
}

impl Failure {
    /// The error class for counting (`http_429`, `timeout`, ...).
    pub fn label(&self) -> String {
        match self {
            Self::Status(s, ..) => format!("http_{s}"),
            Self::Connect(_) => "connect".into(),
            Self::Timeout => "timeout".into(),
            Self::Body(_) => "body".into(),
            Self::StreamError(..) => "stream_error".into(),
            Self::BadResponse(_) => "bad_response".into(),
        }
    }

    /// A human message.
    pub fn message(&self) -> String {
        match self {
            Self::Status(s, body, _) => format!("HTTP {s}: {body}"),
            Self::Connect(m) | Self::Body(m) | Self::StreamError(m, _) | Self::BadResponse(m) => {
                m.clone()
            }
            Self::Timeout => "timed out".into(),
        }
    }

    /// The server's own name for the error (OpenAI's `error.type`, else `error.code`), so the
    /// report can tell a rate limit from an overload behind the same status.
    pub fn kind(&self) -> Option<&str> {
        match self {
            Self::Status(_, _, k) | Self::StreamError(_, k) => k.as_deref(),
            _ => None,
        }
    }
}

/// `error.type` (else `error.code`) of an OpenAI error object, or of a body holding one.
fn error_kind(v: &serde_json::Value) -> Option<String> {
    let e = v.get("error").unwrap_or(v);
    let k = e
        .get("type")
        .filter(|t| !t.is_null())
        .or_else(|| e.get("code"))?;
    match k {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Token counts a server reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
}

/// The raw observations of one request, all relative to its scheduled send time.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// When the request actually left (after any wait for a concurrency slot).
    pub sent: Duration,
    /// The first attempt met a keep-alive connection the server had closed (no byte of answer)
    /// and the request was sent again on a new connection; the timings still run from the
    /// scheduled time, so they include the lost attempt.
    pub retried: bool,
    /// When each chunk with content arrived.
    pub chunks: Vec<Duration>,
    /// Tokens each content chunk carried, where per-chunk usage said (vLLM's
    /// `continuous_usage_stats`); `None` where it did not.
    pub chunk_tokens: Vec<Option<u32>>,
    /// The final usage, if the server sent it.
    pub usage: Option<Usage>,
    /// Characters of generated text (for the no-usage, no-stream approximation).
    pub text_chars: usize,
    /// When the response ended.
    pub end: Duration,
    pub failure: Option<Failure>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
    /// vLLM's per-chunk cumulative usage: tells how many tokens each chunk carried. Servers that
    /// do not know it ignore it.
    continuous_usage_stats: bool,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<[Message<'a>; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt: Option<&'a str>,
    max_tokens: u32,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ignore_eos: bool,
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Vec<ChunkChoice<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Delta<'a>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
}

impl ChunkChoice<'_> {
    fn content_chars(&self) -> usize {
        let d = self.delta.as_ref().or(self.message.as_ref());
        let from_delta = d.map_or(0, |d| {
            d.content.as_deref().map_or(0, str::len)
                + d.reasoning_content.as_deref().map_or(0, str::len)
        });
        from_delta + self.text.as_deref().map_or(0, str::len)
    }
}

/// Turns stream events into [`Observed`] fields. Separate from the socket so the per-chunk cost
/// can be measured on its own (the self-benchmark) and tested without a server.
#[derive(Debug, Default)]
pub struct StreamRecorder {
    parser: sse::Parser,
    last_cumulative: Option<u64>,
    pub done: bool,
}

impl StreamRecorder {
    /// Feeds one body frame that arrived at `at` (relative to the scheduled time).
    pub fn push(&mut self, bytes: &[u8], at: Duration, obs: &mut Observed) {
        let Self {
            parser,
            last_cumulative,
            done,
        } = self;
        parser.push(bytes, |ev| on_event(ev, at, obs, last_cumulative, done));
    }

    /// The body ended.
    pub fn finish(&mut self, at: Duration, obs: &mut Observed) {
        let Self {
            parser,
            last_cumulative,
            done,
        } = self;
        parser.finish(|ev| on_event(ev, at, obs, last_cumulative, done));
    }
}

fn on_event(
    ev: sse::Event<'_>,
    at: Duration,
    obs: &mut Observed,
    last_cumulative: &mut Option<u64>,
    done: &mut bool,
) {
    let data = match ev {
        sse::Event::Done => {
            *done = true;
            return;
        }
        sse::Event::Data(d) => d,
    };
    let chunk: Chunk<'_> = match serde_json::from_slice(data) {
        Ok(c) => c,
        Err(e) => {
            obs.failure
                .get_or_insert(Failure::BadResponse(format!("unparseable chunk: {e}")));
            return;
        }
    };
    if let Some(err) = chunk.error {
        let kind = error_kind(&err);
        obs.failure
            .get_or_insert(Failure::StreamError(err.to_string(), kind));
        return;
    }
    let chars: usize = chunk.choices.iter().map(ChunkChoice::content_chars).sum();
    let cumulative = chunk.usage.and_then(|u| u.completion_tokens);
    if chars > 0 {
        obs.chunks.push(at);
        obs.text_chars += chars;
        obs.chunk_tokens.push(match (cumulative, *last_cumulative) {
            (Some(c), Some(prev)) => Some(c.saturating_sub(prev) as u32),
            (Some(c), None) => Some(c as u32),
            _ => None,
        });
    }
    if let Some(c) = cumulative {
        *last_cumulative = Some(c);
    }
    if chunk.usage.is_some() {
        obs.usage = chunk.usage;
    }
}

type Http = HyperClient<Tracking<HttpsConnector<HttpConnector>>, Full<Bytes>>;
type Exchanged = std::result::Result<Response<Incoming>, hyper_util::client::legacy::Error>;

/// The pooled client for one target.
#[derive(Debug, Clone)]
pub struct Client {
    http: Http,
    /// Without a pool: every request on a new connection, for the retry after a stale one.
    fresh: Http,
    target: std::sync::Arc<Target>,
    uri: Uri,
}

impl Client {
    /// A client with a connection pool that keeps every idle connection for up to
    /// [`POOL_IDLE`] (a closed loop of `N` reuses its `N` connections instead of reconnecting).
    pub fn new(target: Target) -> Result<Self> {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.enforce_http(false);
        let conn = Tracking(tls_connector(&target.base)?.wrap_connector(conn));
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(usize::MAX)
            .pool_idle_timeout(POOL_IDLE)
            .build(conn.clone());
        let fresh = HyperClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(conn);
        let path = match target.endpoint {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        };
        let uri = format!("{}{path}", target.base).parse().map_err(
            |e: hyper::http::uri::InvalidUri| Error::Url {
                url: target.base.clone(),
                reason: e.to_string(),
            },
        )?;
        Ok(Self {
            http,
            fresh,
            target: std::sync::Arc::new(target),
            uri,
        })
    }

    /// The target this client sends to.
    pub fn target(&self) -> &Target {
        &self.target
    }

    fn request(&self, method: Method, uri: Uri, body: Bytes) -> Request<Full<Bytes>> {
        let mut b = Request::builder()
            .method(method)
            .uri(uri)
            .header(CONTENT_TYPE, "application/json");
        if let Some(key) = &self.target.api_key {
            b = b.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        for (k, v) in &self.target.headers {
            b = b.header(k, v);
        }
        b.body(Full::new(body)).expect("valid request parts")
    }

    /// Sends a request, and once more on a new connection if the first attempt was lost to a
    /// stale keep-alive connection ([`conn::lost_to_reuse`]). Returns the outcome (the second
    /// attempt's, if there was one) and whether there was a second attempt.
    async fn exchange(&self, method: Method, uri: &Uri, body: Bytes) -> (Exchanged, bool) {
        let req = self.request(method.clone(), uri.clone(), body.clone());
        match self.http.request(req).await {
            Err(e) if conn::lost_to_reuse(&e) => {
                let again = self.request(method, uri.clone(), body);
                (self.fresh.request(again).await, true)
            }
            first => (first, false),
        }
    }

    /// The JSON body for one request.
    pub fn body(&self, prompt: &str, max_tokens: u32) -> Bytes {
        let t = &*self.target;
        let chat = t.endpoint == Endpoint::Chat;
        let body = Body {
            model: &t.model,
            messages: chat.then_some([Message {
                role: "user",
                content: prompt,
            }]),
            prompt: (!chat).then_some(prompt),
            max_tokens,
            stream: t.stream,
            stream_options: t.stream.then_some(StreamOptions {
                include_usage: true,
                continuous_usage_stats: true,
            }),
            ignore_eos: t.ignore_eos,
        };
        Bytes::from(serde_json::to_vec(&body).expect("serialisable"))
    }

    /// Sends one prepared body and times it against `scheduled`, the time it was *due*.
    pub async fn send(&self, body: Bytes, scheduled: Instant) -> Observed {
        let mut obs = Observed {
            sent: scheduled.elapsed(),
            ..Observed::default()
        };
        let timeout = self.target.timeout;
        let fut = self.send_inner(body, scheduled, &mut obs);
        if tokio::time::timeout(timeout, fut).await.is_err() {
            obs.failure = Some(Failure::Timeout);
        }
        obs.end = scheduled.elapsed();
        obs
    }

    async fn send_inner(&self, body: Bytes, scheduled: Instant, obs: &mut Observed) {
        let (resp, retried) = self.exchange(Method::POST, &self.uri, body).await;
        obs.retried = retried;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                obs.failure = Some(if e.is_connect() {
                    Failure::Connect(format!("{e:?}"))
                } else {
                    Failure::Body(format!("{e:?}"))
                });
                return;
            }
        };
        let (parts, mut body) = resp.into_parts();
        if !parts.status.is_success() {
            let bytes = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
            let kind = serde_json::from_slice(&bytes)
                .ok()
                .and_then(|v: serde_json::Value| error_kind(&v));
            obs.failure = Some(Failure::Status(parts.status.as_u16(), text, kind));
            return;
        }
        if !self.target.stream {
            match body.collect().await {
                Ok(c) => parse_whole(&c.to_bytes(), obs),
                Err(e) => obs.failure = Some(Failure::Body(e.to_string())),
            }
            return;
        }
        let mut rec = StreamRecorder::default();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => {
                    if let Ok(data) = f.into_data() {
                        rec.push(&data, scheduled.elapsed(), obs);
                    }
                }
                Err(e) => {
                    obs.failure.get_or_insert(Failure::Body(e.to_string()));
                    return;
                }
            }
        }
        rec.finish(scheduled.elapsed(), obs);
    }

    /// `GET /v1/models`: the first model id, the default `--model`.
    pub async fn first_model(&self) -> Result<String> {
        let url = format!("{}/v1/models", self.target.base);
        let setup = |reason: String| Error::Setup {
            url: url.clone(),
            reason,
        };
        let uri: Uri = url.parse().map_err(|e| setup(format!("{e}")))?;
        let resp = self
            .exchange(Method::GET, &uri, Bytes::new())
            .await
            .0
            .map_err(|e| setup(format!("{e:?}")))?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| setup(e.to_string()))?
            .to_bytes();
        if !status.is_success() {
            return Err(setup(format!("HTTP {status}")));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| setup(e.to_string()))?;
        v["data"][0]["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| setup("no model listed".into()))
    }

    /// `POST /tokenize` (vLLM's and sluice's): the token count of `text`, or why not.
    pub async fn tokenize(&self, text: &str) -> std::result::Result<i64, String> {
        let uri: Uri = format!("{}/tokenize", self.target.base)
            .parse()
            .map_err(|e| format!("{e}"))?;
        let body = serde_json::to_vec(&serde_json::json!({
            "model": self.target.model,
            "prompt": text,
            "add_special_tokens": true,
        }))
        .expect("serialisable");
        let resp = self
            .exchange(Method::POST, &uri, body.into())
            .await
            .0
            .map_err(|e| format!("{e:?}"))?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("/tokenize answered HTTP {status}"));
        }
        let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        v["count"]
            .as_i64()
            .or_else(|| v["tokens"].as_array().map(|t| t.len() as i64))
            .ok_or_else(|| "/tokenize answer has no count".to_string())
    }
}

/// The connector stage that speaks TLS to `https://` bases. Root certificates are loaded only
/// for those, so a plain-HTTP run works on a machine without any.
fn tls_connector(
    base: &str,
) -> Result<HttpsConnectorBuilder<hyper_rustls::builderstates::WantsProtocols2>> {
    let builder = HttpsConnectorBuilder::new();
    let builder = if base.starts_with("https://") {
        builder.with_native_roots().map_err(|e| Error::Url {
            url: base.to_string(),
            reason: format!("no usable system root certificates for TLS: {e}"),
        })?
    } else {
        builder.with_tls_config(
            rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        )
    };
    Ok(builder.https_or_http().enable_http1())
}

fn parse_whole(bytes: &[u8], obs: &mut Observed) {
    match serde_json::from_slice::<Chunk<'_>>(bytes) {
        Ok(c) => {
            if let Some(err) = c.error {
                let kind = error_kind(&err);
                obs.failure = Some(Failure::StreamError(err.to_string(), kind));
                return;
            }
            obs.text_chars = c.choices.iter().map(ChunkChoice::content_chars).sum();
            obs.usage = c.usage;
        }
        Err(e) => obs.failure = Some(Failure::BadResponse(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(stream: &str) -> Observed {
        let mut obs = Observed::default();
        let mut rec = StreamRecorder::default();
        for (i, line) in stream.split_inclusive("\n\n").enumerate() {
            rec.push(
                line.as_bytes(),
                Duration::from_millis(i as u64 * 10),
                &mut obs,
            );
        }
        rec.finish(Duration::from_secs(1), &mut obs);
        assert!(rec.done);
        obs
    }

    #[test]
    fn chunks_usage_and_per_chunk_tokens_are_recorded() {
        let s = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"completion_tokens\":1}}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"bc\"}}],\"usage\":{\"completion_tokens\":3}}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3}}\n\n",
            "data: [DONE]\n\n",
        );
        let obs = feed(s);
        assert_eq!(
            obs.chunks,
            vec![Duration::from_millis(10), Duration::from_millis(20)]
        );
        assert_eq!(obs.chunk_tokens, vec![Some(1), Some(2)]);
        assert_eq!(obs.usage.unwrap().prompt_tokens, Some(5));
        assert!(obs.failure.is_none());
    }

    #[test]
    fn completions_text_and_stream_errors() {
        let obs = feed("data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: {\"error\":{\"message\":\"boom\",\"type\":\"overloaded\"}}\n\ndata: [DONE]\n\n");
        assert_eq!(obs.chunks.len(), 1);
        assert_eq!(obs.chunk_tokens, vec![None]);
        let f = obs.failure.unwrap();
        assert_eq!(
            (f.label().as_str(), f.kind()),
            ("stream_error", Some("overloaded"))
        );
    }

    #[test]
    fn base_urls_are_normalised() {
        assert_eq!(normalize_base("http://h:1/v1/").unwrap(), "http://h:1");
        assert_eq!(normalize_base("https://h/").unwrap(), "https://h");
        assert!(normalize_base("ftp://h").is_err());
    }
}
