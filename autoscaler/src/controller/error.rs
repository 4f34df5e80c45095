//! The controller's error type. A profile error ([`sluice_policy::Error`]) is wrapped as
//! [`Error::Profile`]; the rest are the controller's own kind: API calls, node pool providers
//! and invalid `ServingPool` specs, each counted by [`Error::metric_label`].

/// Everything a reconcile, the leader lease or a node pool provider can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The `ServingPool` spec is not usable (the message says why).
    #[error("invalid ServingPool {name}: {message}")]
    InvalidSpec { name: String, message: String },
    /// The profile it names cannot be loaded or lacks a variant.
    #[error("ServingPool {name}: profile")]
    Profile {
        name: String,
        #[source]
        source: Box<sluice_policy::Error>,
    },
    /// The command-line flags are inconsistent (the message says how).
    #[error("invalid flags: {0}")]
    Flags(String),
    /// A Deployment the pool names does not exist.
    #[error("deployment {0} not found")]
    MissingDeployment(String),
    /// The signal source could not be read.
    #[error("signals: {0}")]
    Signals(String),
    /// A node pool provider call failed.
    #[error("node pool {pool} ({provider}): {message}")]
    NodePool {
        provider: &'static str,
        pool: String,
        message: String,
    },
    /// The metrics or health server could not bind.
    #[error("cannot serve metrics on {addr}")]
    Serve {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A short stable label for `sluice_autoscaler_reconcile_errors_total{reason}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::InvalidSpec { .. } => "invalid_spec",
            Error::Profile { .. } => "profile",
            Error::Flags(_) => "flags",
            Error::MissingDeployment(_) => "missing_deployment",
            Error::Signals(_) => "signals",
            Error::NodePool { .. } => "node_pool",
            Error::Serve { .. } => "serve",
        }
    }

    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }
}

/// The controller's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
