//! The engine's error types: why a request was refused at submission, and why an engine could
//! not start.

use thiserror::Error;

use crate::request::Invalid;

/// Why `EngineHandle::submit` refused a request. Each is decided before the request is queued,
/// so a refused request costs the engine nothing.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SubmitError {
    /// Prompt plus `max_tokens` does not fit the model's context (`max_tokens` `None`: the
    /// request set none, and the prompt leaves no room for even one completion token).
    #[error(
        "this model's maximum context length is {max_model_len} tokens; the request asks for \
         {}",
        asked(*prompt_tokens, *max_tokens)
    )]
    ContextLength {
        max_model_len: usize,
        prompt_tokens: usize,
        max_tokens: Option<usize>,
    },
    /// The waiting queue already holds `max_waiting` requests.
    #[error("the engine's queue is full ({max_waiting} requests waiting); retry later")]
    QueueFull { max_waiting: usize },
    /// The engine is draining or has stopped.
    #[error("the engine is shutting down")]
    ShuttingDown,
    /// A field is out of range or inconsistent; the error names it.
    #[error("{0}")]
    InvalidRequest(Invalid),
}

/// What a request that overflows the context asked for, in words.
fn asked(prompt_tokens: usize, max_tokens: Option<usize>) -> String {
    match max_tokens {
        Some(m) => format!("{prompt_tokens} prompt tokens plus {m} completion tokens"),
        None => format!("{prompt_tokens} prompt tokens, which leave no room for a completion"),
    }
}

impl SubmitError {
    /// A short stable label for counting rejections by reason.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::ContextLength { .. } => "context_length",
            Self::QueueFull { .. } => "queue_full",
            Self::ShuttingDown => "shutting_down",
            Self::InvalidRequest(_) => "invalid_request",
        }
    }
}

impl From<Invalid> for SubmitError {
    fn from(e: Invalid) -> Self {
        Self::InvalidRequest(e)
    }
}

/// Why an engine could not start.
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("invalid engine configuration: {0}")]
    Config(String),
    #[error("allocating the KV cache")]
    Kv(#[source] sluice_models::ModelError),
    #[error("registering metrics")]
    Metrics(#[source] prometheus::Error),
    #[error("starting the engine thread")]
    Thread(#[source] std::io::Error),
}
