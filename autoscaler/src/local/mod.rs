//! Local mode: the sluice policy — the same [`Sluice`](sluice_policy::policy::Sluice) code the
//! simulator runs — scaling `sluice serve --model` replica processes on this machine, so the
//! whole loop can be watched and tested without a cluster.
//!
//! Each tick: poll the processes ([`supervisor`]), scrape the ready and draining replicas and
//! the gateway ([`crate::scrape`]), build [`Signals`](sluice_policy::signals::Signals), ask the policy,
//! and move the fleet towards its decision ([`control`]). A routing gateway
//! (`sluice serve --discover file://PATH`) learns the replica set from the file [`announce`]
//! writes.
//!
//! Scale-down loses no request: the replica leaves the discovery file first; once the gateway
//! no longer lists it (its `/metrics` drops the replica's series; without a gateway URL, after
//! a grace period of a few discovery intervals) and the replica itself reports nothing running
//! or waiting, it gets SIGTERM — and `sluice serve` drains on SIGTERM anyway (not ready, 503 for
//! new generations, which the gateway retries elsewhere before the first byte; in-flight ones
//! finish). SIGKILL comes only after the stop timeout. Stale metrics hold the fleet: no
//! scale-down on a tick when any target's scrape failed.
//!
//! - [`cli`]: the `run --local` flags, validated into [`LocalConfig`].
//! - [`supervisor`]: the replica processes.
//! - [`announce`]: the discovery file, written atomically.
//! - [`control`]: the loop.
//! - [`status`]: `/healthz` and `sluice_autoscaler_local_*` metrics (`--listen`).

pub mod announce;
pub mod cli;
pub mod control;
pub mod status;
pub mod supervisor;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use supervisor::ReplicaCommand;

use sluice_policy::capacity::Slo;
use sluice_policy::profile::Profile;

/// Everything local mode needs, validated.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    pub profile: Profile,
    /// The profile's variant the replicas are.
    pub variant: String,
    pub slo: Slo,
    pub replica: ReplicaCommand,
    /// 0: the pool goes to no replica after `scale_to_zero_after_s` without traffic, and the
    /// gateway's held requests start one again.
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// The model id the replicas serve (the gateway's `model` label, the announce file's
    /// `model` line).
    pub served_model: String,
    pub discovery_file: PathBuf,
    /// A routing gateway to scrape: its admission queue counts as waiting, and its replica
    /// set says when a draining replica is no longer routed to.
    pub gateway: Option<String>,
    /// Without a gateway URL: how long after leaving the file a replica is assumed unrouted.
    pub unrouted_after: Duration,
    pub tick: Duration,
    pub scrape_timeout: Duration,
    pub window_s: f64,
    pub short_window_s: f64,
    pub latency_window_s: f64,
    pub scale_down_window_s: f64,
    /// With `min_replicas` 0: idle this long, the pool goes to zero.
    pub scale_to_zero_after_s: f64,
    pub panic_window_s: f64,
    /// Longest wait for a draining replica to go idle before SIGTERM (which drains it too).
    pub drain_timeout: Duration,
    /// Where `/healthz` and `/metrics` are served, if anywhere.
    pub listen: Option<SocketAddr>,
}

/// What can stop local mode.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start {binary}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no free port in {0}")]
    NoFreePort(String),
    #[error("cannot write the discovery file {path}")]
    DiscoveryFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Profile(#[from] sluice_policy::Error),
}
