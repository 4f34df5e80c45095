//! The simulator's error type: traces, scenarios, reports and plots.

use std::path::PathBuf;

/// Everything that can go wrong in the simulator: reading traces and profiles, scenarios that
/// cannot be simulated, writing the results. Each variant names what it was reading, so a
/// message says where.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A profile could not be loaded (its message is the policy crate's).
    #[error(transparent)]
    Profile(#[from] sluice_policy::Error),
    /// A trace file could not be read.
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A trace line could not be parsed.
    #[error("{path}, line {line}: {message}")]
    TraceLine {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// The trace holds no request.
    #[error("trace {0} holds no request")]
    EmptyTrace(PathBuf),
    /// A scenario setting is out of range.
    #[error("invalid scenario: {0}")]
    Scenario(String),
    /// The report or plot could not be written.
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The plot backend failed.
    #[error("cannot draw the plot {path}: {message}")]
    Plot { path: PathBuf, message: String },
    /// JSON serialisation of the report failed.
    #[error("cannot serialise the report")]
    Json(#[source] serde_json::Error),
}

/// The simulator's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
