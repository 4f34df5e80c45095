//! The crate's one error type. Failures of single requests are *not* errors here: they are data
//! (each a [`crate::metrics::Record`] with `ok` false) counted in the report. This enum is for
//! what stops a run.

use std::path::PathBuf;

/// Why a load test could not be configured, prepared or written out.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag's value is malformed or contradicts another flag.
    #[error("invalid argument `{flag}`: {reason}")]
    InvalidArg { flag: &'static str, reason: String },

    /// A dataset or trace file could not be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A dataset or trace file was read but a row does not parse.
    #[error("{path}:{line}: {reason}")]
    Parse {
        path: PathBuf,
        line: usize,
        reason: String,
    },

    /// A report file could not be written.
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The server could not be asked something the run needs before it starts (`/v1/models`).
    #[error("server setup request to {url} failed: {reason}")]
    Setup { url: String, reason: String },

    /// The target URL is not a usable `http(s)://host:port` base, or TLS cannot be set up.
    #[error("invalid base URL `{url}`: {reason}")]
    Url { url: String, reason: String },

    /// `--tokenizer` names a file that is not a usable tokenizer (or GGUF metadata is corrupt).
    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },

    /// Drawing the plot failed.
    #[error("plot: {0}")]
    Plot(String),
}

/// The crate's result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
