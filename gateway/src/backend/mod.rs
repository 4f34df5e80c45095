//! The seam between the HTTP layer and whatever generates.
//!
//! - [`Backend`] / [`LocalBackend`]: an engine in this process, driven token by token; the API
//!   layer renders its events as OpenAI JSON or SSE.
//! - [`remote::RemoteBackend`]: a replica over HTTP, another `sluice serve --model` or any
//!   OpenAI-compatible server; the request body goes as it came and the answer comes back
//!   byte for byte, so the gateway needs neither the remote model's tokenizer nor its template.
//!
//! The two differ in kind on purpose: proxying bytes keeps the routing gateway cheap and
//! model-agnostic, while the local engine has no HTTP to proxy. `crate::router` picks among
//! remote backends; `crate::api` sends a request for the local model to the local backend and
//! any other to the router.

pub mod remote;

use std::sync::Arc;

use sluice_engine::{EngineHandle, EventStream, Load, Request, SubmitError};
use sluice_models::Model;

pub trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// The model id clients name in `model`.
    fn model_id(&self) -> &str;
    /// The model, for rendering chat templates and tokenising.
    fn model(&self) -> &Arc<Model>;
    /// Longest prompt + completion.
    fn max_model_len(&self) -> usize;
    /// Queues a generation; the stream ends after a `Finish` per choice.
    fn submit(&self, request: Request) -> Result<EventStream, SubmitError>;
    fn load(&self) -> Load;
    /// Stops taking work; in-flight requests finish.
    fn shutdown(&self);
}

/// An engine running in this process.
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
}

impl Backend for LocalBackend {
    fn model_id(&self) -> &str {
        &self.id
    }

    fn model(&self) -> &Arc<Model> {
        self.engine.model()
    }

    fn max_model_len(&self) -> usize {
        self.engine.max_model_len()
    }

    fn submit(&self, request: Request) -> Result<EventStream, SubmitError> {
        self.engine.submit(request)
    }

    fn load(&self) -> Load {
        self.engine.load()
    }

    fn shutdown(&self) {
        self.engine.shutdown();
    }
}
