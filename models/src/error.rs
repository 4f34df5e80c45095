//! The one error type of the models crate.

use std::path::PathBuf;

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The model file does not exist.
    #[error("model file {path} not found; {hint}")]
    NotFound { path: PathBuf, hint: String },
    /// A registry name that this build does not know.
    #[error("unknown model name '{0}': pass a path to a .gguf file or one of: {1}")]
    UnknownName(String, String),
    /// The file exists but could not be read as GGUF (truncated, corrupt, not GGUF).
    #[error(
        "cannot read {path} as GGUF ({source}); re-fetch it (`make model` for the default model)"
    )]
    Gguf {
        path: PathBuf,
        #[source]
        source: candle_core::Error,
    },
    /// A metadata key the architecture needs is missing or has the wrong type.
    #[error("GGUF metadata: {0}")]
    Metadata(String),
    /// The file is valid GGUF but describes something this runtime does not run.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// Building the tokenizer or encoding/decoding text failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to compile or render.
    #[error("chat template: {0}")]
    Template(String),
    /// A forward-pass batch that violates the contract (bad positions, missing blocks...).
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// A device that this build cannot use.
    #[error("device: {0}")]
    Device(String),
    /// An error from candle's tensor library.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// An I/O error reading a model or tokenizer file.
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Result alias for the models crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
