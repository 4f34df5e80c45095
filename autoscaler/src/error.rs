//! The library's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the library: reading profiles and traces, and scenarios
/// that cannot be simulated. Each variant names what it was reading, so a message says where.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A profile is not valid TOML for [`crate::profile::Profile`].
    #[error("profile {name} is not valid")]
    ProfileToml {
        name: String,
        #[source]
        source: toml::de::Error,
    },
    /// A profile parsed but one of its figures makes no sense.
    #[error("profile {profile}, variant {variant}: {message}")]
    ProfileInvalid {
        profile: String,
        variant: String,
        message: String,
    },
    /// No built-in profile has that name, and it is not a file either.
    #[error(
        "unknown profile {0:?} (built in: llama-3-8b, cpu, cpu-local; or a path to a TOML file)"
    )]
    UnknownProfile(String),
    /// A variant named on the command line or in a scenario is not in the profile.
    #[error("variant {variant:?} is not in profile {profile} (it has: {known})")]
    UnknownVariant {
        variant: String,
        profile: String,
        known: String,
    },
    /// A trace line could not be parsed.
    #[error("{path}, line {line}: {message}")]
    TraceLine {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// A Mooncake JSONL line is not valid JSON of the expected shape.
    #[error("{path}, line {line}: not a Mooncake trace record")]
    TraceJson {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
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

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
