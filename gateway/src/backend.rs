//! Where a generation runs: a [`Target`].
//!
//! - [`Target::Local`]: the engine in this process ([`LocalBackend`]), driven token by token;
//!   the API layer renders its events as OpenAI JSON or SSE.
//! - [`Target::Remote`]: the replicas behind `crate::router` — other `sluice serve --model`
//!   processes or any OpenAI-compatible server. The request body goes as it came and the answer
//!   comes back byte for byte, so the gateway needs neither a remote model's tokenizer nor its
//!   template.
//!
//! The two differ in kind on purpose: proxying bytes keeps the routing gateway cheap and
//! model-agnostic, while the local engine has no HTTP to proxy. `crate::api` resolves a request
//! for the model served here to the local target and any other to the router.

use std::sync::Arc;

use sluice_engine::{EngineHandle, EventStream, Load, Request, SubmitError};
use sluice_models::Model;

use crate::router::Router;

/// Where one request runs.
#[derive(Debug, Clone)]
pub enum Target {
    Local(Arc<LocalBackend>),
    Remote(Arc<Router>),
}

/// An engine running in this process, serving the model clients name `id`.
#[derive(Debug, Clone)]
pub struct LocalBackend {
    id: String,
    engine: EngineHandle,
}

impl LocalBackend {
    pub fn new(id: String, engine: EngineHandle) -> Self {
        Self { id, engine }
    }

    pub fn engine(&self) -> &EngineHandle {
        &self.engine
    }

    /// The model id clients name in `model`.
    pub fn model_id(&self) -> &str {
        &self.id
    }

    /// The model, for rendering chat templates and tokenising.
    pub fn model(&self) -> &Arc<Model> {
        self.engine.model()
    }

    /// Longest prompt + completion.
    pub fn max_model_len(&self) -> usize {
        self.engine.max_model_len()
    }

    /// Queues a generation; the stream ends after a `Finish` per choice.
    pub fn submit(&self, request: Request) -> Result<EventStream, SubmitError> {
        self.engine.submit(request)
    }

    pub fn load(&self) -> Load {
        self.engine.load()
    }

    /// Stops taking work; in-flight requests finish.
    pub fn shutdown(&self) {
        self.engine.shutdown();
    }
}
