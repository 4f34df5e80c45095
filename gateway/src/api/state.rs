//! [`AppState`]: what every handler shares — the local engine once loaded, the router, the
//! tenants and their limits, the admission queue, metrics, and the drain flag — and where a
//! generation request runs ([`AppState::resolve`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus::Registry;

use super::scope::InFlight;
use crate::admission::Admission;
use crate::backend::{LocalBackend, Target};
use crate::error::ApiError;
use crate::metrics::GatewayMetrics;
use crate::rate_limit::RateLimiter;
use crate::router::replica::ServedModel;
use crate::router::Router as ReplicaRouter;
use crate::tenants::Tenants;

/// Limits applied to every request.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    pub max_body_bytes: usize,
    /// Time allowed to receive the body once headers are in.
    pub body_timeout: Duration,
    /// Total time allowed for a generation, if any.
    pub request_timeout: Option<Duration>,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            body_timeout: Duration::from_secs(30),
            request_timeout: None,
        }
    }
}

/// Shared by every handler.
#[derive(Debug)]
pub struct AppState {
    /// Set once the local model has loaded; until then its requests answer 503.
    pub backend: OnceLock<Arc<LocalBackend>>,
    /// The id of the model served in this process, if any (`--model`).
    pub served_model: Option<String>,
    /// Remote replicas, when `--upstream`/`--discover` are given. A request for the local
    /// model runs here; any other model is routed.
    pub router: Option<Arc<ReplicaRouter>>,
    pub tenants: Tenants,
    pub limiter: RateLimiter,
    pub admission: Admission,
    pub metrics: GatewayMetrics,
    pub registry: Registry,
    pub draining: AtomicBool,
    pub in_flight: Arc<InFlight>,
    pub limits: HttpLimits,
    pub log_prompts: bool,
    /// Chat requests may bring their own `chat_template` (`--trust-request-chat-template`).
    pub trust_request_chat_template: bool,
    /// Prompts longer than this are refused before any prefill (`--max-prompt-tokens`).
    pub max_prompt_tokens: Option<usize>,
}

impl AppState {
    /// Ready when not draining and something can generate: the local model has loaded, a
    /// replica is healthy, or a model is known with none (its requests are held while its pool
    /// scales up from zero, so the gateway must keep receiving them).
    pub fn is_ready(&self) -> bool {
        !self.draining.load(Ordering::Acquire)
            && (self.backend.get().is_some()
                || self
                    .router
                    .as_ref()
                    .is_some_and(|r| r.any_eligible() || !r.known_models().is_empty()))
    }

    pub(super) fn is_local(&self, model: &str) -> bool {
        self.served_model.as_deref() == Some(model)
    }

    /// Every model served, here and by replicas, with its context length and prompt bound
    /// when known.
    pub(super) fn all_models(&self) -> Vec<ServedModel> {
        let mut out = Vec::new();
        if let Some(m) = &self.served_model {
            out.push(ServedModel {
                id: m.clone(),
                max_model_len: self.backend.get().map(|b| b.max_model_len()),
                max_prompt_tokens: self.max_prompt_tokens,
            });
        }
        for m in self.router.iter().flat_map(|r| r.models()) {
            if !out.iter().any(|o| o.id == m.id) {
                out.push(m);
            }
        }
        out
    }

    pub(super) fn check_draining(&self) -> Result<(), ApiError> {
        if self.draining.load(Ordering::Acquire) {
            return Err(ApiError::Unavailable(
                "The server is draining; retry on another replica".into(),
            ));
        }
        Ok(())
    }

    /// The local engine, once loaded and while not draining.
    pub(super) fn backend(&self) -> Result<&Arc<LocalBackend>, ApiError> {
        self.check_draining()?;
        self.backend.get().ok_or_else(|| {
            ApiError::Unavailable("The model is still loading; retry shortly".into())
        })
    }

    /// The model is served in this process.
    pub(super) fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if self.is_local(model) {
            Ok(())
        } else {
            Err(ApiError::ModelNotFound(model.to_string()))
        }
    }

    /// Where a request for `model` runs: here when this process serves it, else on a replica
    /// that does.
    pub(super) fn resolve(&self, model: &str) -> Result<Target, ApiError> {
        if self.is_local(model) {
            return Ok(Target::Local(self.backend()?.clone()));
        }
        match &self.router {
            Some(r) if r.serves(model) => Ok(Target::Remote(r.clone())),
            _ => Err(ApiError::ModelNotFound(model.to_string())),
        }
    }
}

/// The request id: the caller's `x-request-id`, or a new one.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);
