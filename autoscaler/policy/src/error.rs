//! The policy crate's error type: reading and checking profiles.

use std::path::PathBuf;

/// What can go wrong reading a profile. Each variant names what it was reading, so a message
/// says where.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A profile file could not be read.
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
}

/// The policy crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
