//! `sluice-autoscaler run` (Kubernetes mode) and `sluice-autoscaler crd`: flags, each also an
//! environment variable, validated into the controller's [`Config`], then the loop with its
//! metrics server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::error::{Error, Result};
use super::metrics::{self, Metrics};
use super::prometheus::{PrometheusConfig, PrometheusSource};
use super::scraped::PodScraper;
use super::source::{BySpec, SignalSource};
use super::{Config, Context, Controller, LeaseConfig};
use crate::nodepool::gke::{self, Gke, GkeConfig};
use crate::nodepool::provisioning::ProvisioningRequests;
use crate::nodepool::NodePoolProvider;
use crate::scrape::ScrapeConfig;

/// Flags of `sluice-autoscaler run` for the Kubernetes controller.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Watch ServingPools in this namespace only (default: all namespaces).
    #[arg(long, env = "SLUICE_AUTOSCALER_NAMESPACE")]
    pub namespace: Option<String>,
    /// Seconds between reconciles of every pool (changes to pools and nodes wake it sooner).
    #[arg(long, env = "SLUICE_AUTOSCALER_PERIOD", default_value_t = 10.0)]
    pub period: f64,
    /// Log decisions and change nothing (no scaling, node pools, status or Events).
    #[arg(long, env = "SLUICE_AUTOSCALER_DRY_RUN")]
    pub dry_run: bool,
    /// Address of `/metrics` and `/healthz`.
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_METRICS_ADDR",
        default_value = "0.0.0.0:9090"
    )]
    pub metrics_addr: SocketAddr,
    /// Act without leader election (one replica only).
    #[arg(long, env = "SLUICE_AUTOSCALER_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,
    /// Namespace of the leader Lease (the pod's namespace in a cluster).
    #[arg(long, env = "POD_NAMESPACE", default_value = "sluice")]
    pub lease_namespace: String,
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_LEASE",
        default_value = "sluice-autoscaler"
    )]
    pub lease_name: String,
    /// Seconds a renewal keeps standbys out; the period must be shorter.
    #[arg(long, env = "SLUICE_AUTOSCALER_LEASE_DURATION", default_value_t = 15)]
    pub lease_duration: u64,
    /// This candidate's identity (the pod name in a cluster).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// First retry delay after a failed reconcile, doubling to the maximum.
    #[arg(long, env = "SLUICE_AUTOSCALER_BACKOFF", default_value_t = 5.0)]
    pub backoff: f64,
    #[arg(long, env = "SLUICE_AUTOSCALER_BACKOFF_MAX", default_value_t = 300.0)]
    pub backoff_max: f64,
    /// GKE project, location and cluster of the node pools (the `gke` provider).
    #[arg(long, env = "SLUICE_AUTOSCALER_GKE_PROJECT")]
    pub gke_project: Option<String>,
    #[arg(long, env = "SLUICE_AUTOSCALER_GKE_LOCATION")]
    pub gke_location: Option<String>,
    #[arg(long, env = "SLUICE_AUTOSCALER_GKE_CLUSTER")]
    pub gke_cluster: Option<String>,
    #[arg(long, env = "SLUICE_AUTOSCALER_GKE_API", default_value = gke::GKE_API)]
    pub gke_api_url: String,
    #[arg(long, env = "SLUICE_AUTOSCALER_METADATA_URL", default_value = gke::METADATA)]
    pub metadata_url: String,
    /// Seconds a Prometheus query may take (pools with `signals.prometheusUrl`).
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_PROMETHEUS_TIMEOUT",
        default_value_t = 5.0
    )]
    pub prometheus_timeout: f64,
    /// A ready pod whose newest sample in Prometheus is older than this many seconds makes
    /// the pool's metrics stale (hold). Keep it above the scrape interval.
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_PROMETHEUS_MAX_AGE",
        default_value_t = 90.0
    )]
    pub prometheus_max_age: f64,
    /// The labels Prometheus puts the pod name and namespace in.
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_PROMETHEUS_POD_LABEL",
        default_value = "pod"
    )]
    pub prometheus_pod_label: String,
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_PROMETHEUS_NAMESPACE_LABEL",
        default_value = "namespace"
    )]
    pub prometheus_namespace_label: String,
    /// A file holding a bearer token for the Prometheus API (re-read every reconcile).
    #[arg(long, env = "SLUICE_AUTOSCALER_PROMETHEUS_TOKEN_FILE")]
    pub prometheus_bearer_token_file: Option<std::path::PathBuf>,
}

fn seconds(what: &str, s: f64) -> Result<Duration> {
    if s.is_finite() && s > 0.0 {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(Error::Flags(format!(
            "--{what} must be a positive number of seconds, not {s}"
        )))
    }
}

impl RunArgs {
    /// The loop's configuration, or what is wrong with the flags.
    pub fn config(&self) -> Result<Config> {
        let period = seconds("period", self.period)?;
        let lease = if self.no_leader_election {
            None
        } else {
            let duration = Duration::from_secs(self.lease_duration.max(1));
            if period >= duration {
                return Err(Error::Flags(format!(
                        "--period ({} s) must be shorter than --lease-duration ({} s), or the leader loses its lease between renewals",
                        self.period, self.lease_duration
                    )));
            }
            let identity = self
                .identity
                .clone()
                .or_else(|| std::env::var("HOSTNAME").ok())
                .unwrap_or_else(|| format!("sluice-autoscaler-{}", std::process::id()));
            Some(LeaseConfig {
                namespace: self.lease_namespace.clone(),
                name: self.lease_name.clone(),
                identity,
                duration,
                retry: duration / 3,
            })
        };
        Ok(Config {
            namespace: self.namespace.clone(),
            period,
            lease,
            backoff_base: seconds("backoff", self.backoff)?,
            backoff_max: seconds("backoff-max", self.backoff_max)?,
        })
    }

    /// The signal source every pool reads through: scraping (each `/metrics` within
    /// `scrape_timeout` seconds, the `--scrape-timeout` flag local mode shares) or Prometheus,
    /// as its spec says.
    pub fn source(&self, scrape_timeout: f64) -> Result<BySpec> {
        let label = |what: &str, l: &str| {
            let ok = l
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if ok {
                Ok(l.to_string())
            } else {
                Err(Error::Flags(format!(
                    "--{what} {l:?} is not a Prometheus label name"
                )))
            }
        };
        let scrape = PodScraper::new(ScrapeConfig {
            timeout: seconds("scrape-timeout", scrape_timeout)?,
            ..ScrapeConfig::default()
        });
        let prometheus = PrometheusSource::new(PrometheusConfig {
            timeout: seconds("prometheus-timeout", self.prometheus_timeout)?,
            max_age: seconds("prometheus-max-age", self.prometheus_max_age)?,
            pod_label: label("prometheus-pod-label", &self.prometheus_pod_label)?,
            namespace_label: label(
                "prometheus-namespace-label",
                &self.prometheus_namespace_label,
            )?,
            bearer_token_file: self.prometheus_bearer_token_file.clone(),
        })?;
        Ok(BySpec {
            scrape: Box::new(scrape),
            prometheus: Box::new(prometheus),
        })
    }

    /// The `gke` provider, when project, location and cluster are all given.
    pub fn gke(&self) -> Result<Option<Gke>> {
        match (&self.gke_project, &self.gke_location, &self.gke_cluster) {
            (Some(p), Some(l), Some(c)) => Gke::new(GkeConfig {
                project: p.clone(),
                location: l.clone(),
                cluster: c.clone(),
                api_url: self.gke_api_url.trim_end_matches('/').to_string(),
                metadata_url: self.metadata_url.trim_end_matches('/').to_string(),
            })
            .map(Some),
            (None, None, None) => Ok(None),
            _ => Err(Error::Flags(
                "--gke-project, --gke-location and --gke-cluster go together".into(),
            )),
        }
    }
}

/// Runs the controller with a signal source until Ctrl-C or SIGTERM.
pub async fn run(args: RunArgs, source: Arc<dyn SignalSource>) -> Result<()> {
    let config = args.config()?;
    let client = kube::Client::try_default()
        .await
        .map_err(Error::kube("connect"))?;
    let gke: Option<Arc<dyn NodePoolProvider>> = args.gke()?.map(|g| Arc::new(g) as _);
    let metrics = Metrics::new();
    let identity = config
        .lease
        .as_ref()
        .map(|l| l.identity.clone())
        .unwrap_or_else(|| "sluice-autoscaler".into());
    let ctx = Context {
        recorder: super::Recorder::new(
            client.clone(),
            super::Reporter {
                controller: "sluice-autoscaler".into(),
                instance: Some(identity),
            },
        ),
        provisioning: Arc::new(ProvisioningRequests::new(client.clone())),
        client,
        source,
        gke,
        metrics: metrics.clone(),
        dry_run: args.dry_run,
    };
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|source| Error::Serve {
            addr: args.metrics_addr.to_string(),
            source,
        })?;
    // Healthy while the loop turns: within a few periods (or standby retries).
    let stale_after = config.period.max(Duration::from_secs(args.lease_duration)) * 4;
    let app = metrics::app(metrics, stale_after);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server");
        }
    });
    tracing::info!(addr = %args.metrics_addr, dry_run = args.dry_run, "controller started");
    Controller::new(ctx, config).run(shutdown_signal()).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
