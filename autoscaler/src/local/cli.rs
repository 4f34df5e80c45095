//! `sluice-autoscaler run --local` flags (each also a `SLUICE_AUTOSCALER_*` variable), validated
//! into [`LocalConfig`] with messages that name the flag.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use sluice_policy::capacity::Slo;
use sluice_policy::profile::Profile;

use super::supervisor::{Ports, ReplicaCommand};
use super::{LocalConfig, LocalError};

/// Local mode's flags.
#[derive(Args, Debug, Clone)]
pub struct LocalArgs {
    /// Scale `sluice serve` processes on this machine (the Kubernetes controller is the other
    /// mode of `run`).
    #[arg(long, env = "SLUICE_AUTOSCALER_LOCAL")]
    pub local: bool,
    /// The file a routing gateway watches (`sluice serve --discover file://PATH`).
    #[arg(long, env = "SLUICE_AUTOSCALER_DISCOVERY_FILE")]
    pub discovery_file: Option<PathBuf>,
    /// The routing gateway's URL, scraped for its queue and for the replicas it routes to
    /// (a draining replica is stopped only once the gateway has dropped it).
    #[arg(long, env = "SLUICE_AUTOSCALER_GATEWAY")]
    pub gateway: Option<String>,
    /// Without --gateway: seconds after leaving the discovery file a replica is assumed no
    /// longer routed to (a few of the gateway's --discover-interval).
    #[arg(long, env = "SLUICE_AUTOSCALER_UNROUTED_AFTER", default_value_t = 15.0)]
    pub unrouted_after: f64,
    /// The `sluice` binary (default: the one next to this executable, else `sluice` on PATH).
    #[arg(long, env = "SLUICE_AUTOSCALER_SLUICE")]
    pub sluice: Option<PathBuf>,
    /// Model each replica serves (registry name or .gguf path).
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_MODEL",
        default_value = "smollm2-135m-instruct"
    )]
    pub model: String,
    #[arg(long, env = "SLUICE_MODEL_DIR", default_value = "models/cache")]
    pub model_dir: PathBuf,
    /// Extra `sluice serve` argument for replicas (repeatable: `--replica-arg=--threads
    /// --replica-arg=1`).
    #[arg(
        long = "replica-arg",
        env = "SLUICE_AUTOSCALER_REPLICA_ARGS",
        value_delimiter = ',',
        allow_hyphen_values = true
    )]
    pub replica_args: Vec<String>,
    /// Address replicas bind.
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_REPLICA_HOST",
        default_value = "127.0.0.1"
    )]
    pub replica_host: String,
    /// Replica ports: 0 (each binds a free port) or LOW-HIGH.
    #[arg(long, env = "SLUICE_AUTOSCALER_REPLICA_PORTS", default_value = "0")]
    pub replica_ports: String,
    /// Where replica logs go (one file per replica).
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_LOG_DIR",
        default_value = "sluice-local-logs"
    )]
    pub log_dir: PathBuf,
    /// Built-in profile or TOML file; its variant describes a replica.
    #[arg(long, env = "SLUICE_AUTOSCALER_PROFILE", default_value = "cpu-local")]
    pub profile: String,
    /// The profile's variant (default: its first).
    #[arg(long, env = "SLUICE_AUTOSCALER_VARIANT")]
    pub variant: Option<String>,
    /// TTFT SLO, p99, seconds. A CPU replica's decode step behind a full prefill chunk takes
    /// about a second, so the CPU profiles need a TPOT SLO above that.
    #[arg(long, env = "SLUICE_AUTOSCALER_TTFT_SLO", default_value_t = 4.0)]
    pub ttft_slo: f64,
    /// TPOT SLO, p99, seconds.
    #[arg(long, env = "SLUICE_AUTOSCALER_TPOT_SLO", default_value_t = 1.2)]
    pub tpot_slo: f64,
    /// Fewest replicas. 0 (scale to zero) needs --gateway: with no replica, the gateway's held
    /// requests are the only sign of traffic.
    #[arg(long, env = "SLUICE_AUTOSCALER_MIN_REPLICAS", default_value_t = 1)]
    pub min_replicas: u32,
    #[arg(long, env = "SLUICE_AUTOSCALER_MAX_REPLICAS", default_value_t = 3)]
    pub max_replicas: u32,
    /// Seconds between ticks (scrape, decide, act).
    #[arg(long, env = "SLUICE_AUTOSCALER_TICK", default_value_t = 2.0)]
    pub tick: f64,
    /// Per-target scrape timeout, seconds.
    #[arg(long, env = "SLUICE_AUTOSCALER_SCRAPE_TIMEOUT", default_value_t = 2.0)]
    pub scrape_timeout: f64,
    /// The long arrival window, seconds.
    #[arg(long, env = "SLUICE_AUTOSCALER_WINDOW", default_value_t = 60.0)]
    pub window: f64,
    /// The short (spike) arrival window, seconds.
    #[arg(long, env = "SLUICE_AUTOSCALER_SHORT_WINDOW", default_value_t = 10.0)]
    pub short_window: f64,
    /// The latency percentiles' window, seconds (default: the long window).
    #[arg(long, env = "SLUICE_AUTOSCALER_LATENCY_WINDOW")]
    pub latency_window: Option<f64>,
    /// Scale-down stabilisation window, seconds (it grows to a replica's start-up while
    /// cuts are bought back within one; with the default 3 s start-up, never).
    #[arg(
        long,
        env = "SLUICE_AUTOSCALER_SCALE_DOWN_WINDOW",
        default_value_t = 300.0
    )]
    pub scale_down_window: f64,
    /// With --min-replicas 0: seconds with no traffic (nothing arriving, running or waiting on
    /// replicas or in the gateway) before the last replica goes (default: --scale-down-window).
    #[arg(long, env = "SLUICE_AUTOSCALER_SCALE_TO_ZERO_AFTER")]
    pub scale_to_zero_after: Option<f64>,
    /// No scale-down for this long after a spike, seconds.
    #[arg(long, env = "SLUICE_AUTOSCALER_PANIC_WINDOW", default_value_t = 60.0)]
    pub panic_window: f64,
    /// Seconds from start to /ready before a replica counts as a failed start.
    #[arg(long, env = "SLUICE_AUTOSCALER_READY_TIMEOUT", default_value_t = 120.0)]
    pub ready_timeout: f64,
    /// Longest wait, seconds, for a draining replica to go idle before SIGTERM.
    #[arg(long, env = "SLUICE_AUTOSCALER_DRAIN_TIMEOUT", default_value_t = 60.0)]
    pub drain_timeout: f64,
    /// Serve /healthz and /metrics (sluice_autoscaler_local_*) on this address.
    #[arg(long, env = "SLUICE_AUTOSCALER_LISTEN")]
    pub listen: Option<std::net::SocketAddr>,
    /// Seconds from SIGTERM to SIGKILL (more than the replicas' own --drain-timeout).
    #[arg(long, env = "SLUICE_AUTOSCALER_STOP_TIMEOUT", default_value_t = 40.0)]
    pub stop_timeout: f64,
}

fn secs(flag: &str, v: f64, min: f64) -> Result<Duration, LocalError> {
    if !(v.is_finite() && v >= min) {
        return Err(LocalError::Config(format!(
            "--{flag} must be a number of seconds ≥ {min}"
        )));
    }
    Ok(Duration::from_secs_f64(v))
}

/// The `sluice` binary next to `exe` (cargo puts workspace binaries side by side), else the
/// bare name for a PATH lookup.
pub fn default_sluice(exe: Option<&Path>) -> PathBuf {
    exe.and_then(Path::parent)
        .map(|d| d.join("sluice"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("sluice"))
}

/// The model id the replicas serve, as the gateway and its metrics name it: the replicas'
/// `--served-model-name` if given, else the registry name, else a path's file stem (as
/// `sluice serve` names it).
pub fn served_model(model: &str, replica_args: &[String]) -> String {
    let mut it = replica_args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--served-model-name=") {
            return v.to_string();
        }
        if a == "--served-model-name" {
            if let Some(v) = it.next() {
                return v.clone();
            }
        }
    }
    let path = Path::new(model);
    if model.ends_with(".gguf") {
        path.file_stem()
    } else if model.contains('/') {
        path.file_name()
    } else {
        None
    }
    .map_or_else(|| model.to_string(), |s| s.to_string_lossy().into_owned())
}

impl LocalArgs {
    pub fn validate(&self) -> Result<LocalConfig, LocalError> {
        let bad = |m: &str| Err(LocalError::Config(m.to_string()));
        if !self.local {
            return bad("only local mode (--local) is implemented by this build of `run`");
        }
        let Some(discovery_file) = self.discovery_file.clone() else {
            return bad(
                "--discovery-file is required: the file the gateway's --discover file:// watches",
            );
        };
        if self.min_replicas == 0 && self.gateway.is_none() {
            // Arrivals are measured at replicas: with none, only the gateway's held requests
            // show traffic to wake for.
            return bad("--min-replicas 0 needs --gateway (its held requests wake the pool)");
        }
        if self.max_replicas < self.min_replicas {
            return bad("--max-replicas must be at least --min-replicas");
        }
        let profile = Profile::load(&self.profile)?;
        let variant = match &self.variant {
            Some(v) => profile.variant(v)?.name.clone(),
            None => profile.variants[0].name.clone(),
        };
        let slo = Slo {
            ttft_p99_s: self.ttft_slo,
            tpot_p99_s: self.tpot_slo,
        };
        if !(slo.ttft_p99_s > 0.0 && slo.tpot_p99_s > 0.0) {
            return bad("--ttft-slo and --tpot-slo must be positive");
        }
        let (window, short, latency) = self.windows()?;
        let ports = Ports::parse(&self.replica_ports)
            .map_err(|m| LocalError::Config(format!("--replica-ports: {m}")))?;
        self.check_gateway()?;
        let scale_down_window_s =
            secs("scale-down-window", self.scale_down_window, 0.0)?.as_secs_f64();
        let scale_to_zero_after_s = match self.scale_to_zero_after {
            Some(v) => secs("scale-to-zero-after", v, 0.0)?.as_secs_f64(),
            None => scale_down_window_s,
        };
        Ok(LocalConfig {
            served_model: served_model(&self.model, &self.replica_args),
            profile,
            variant,
            slo,
            replica: self.replica_command(ports)?,
            min_replicas: self.min_replicas,
            max_replicas: self.max_replicas,
            discovery_file,
            gateway: self.gateway.as_deref().map(crate::scrape::normalise_url),
            unrouted_after: secs("unrouted-after", self.unrouted_after, 0.0)?,
            tick: secs("tick", self.tick, 0.05)?,
            scrape_timeout: secs("scrape-timeout", self.scrape_timeout, 0.01)?,
            window_s: window,
            short_window_s: short,
            latency_window_s: latency,
            scale_down_window_s,
            scale_to_zero_after_s,
            panic_window_s: secs("panic-window", self.panic_window, 0.0)?.as_secs_f64(),
            drain_timeout: secs("drain-timeout", self.drain_timeout, 0.0)?,
            listen: self.listen,
        })
    }

    /// The arrival rate window, the short window and the latency window, in seconds.
    fn windows(&self) -> Result<(f64, f64, f64), LocalError> {
        let window = secs("window", self.window, 0.1)?.as_secs_f64();
        let short = secs("short-window", self.short_window, 0.1)?.as_secs_f64();
        if short > window {
            return Err(LocalError::Config(
                "--short-window must not exceed --window".into(),
            ));
        }
        let latency = match self.latency_window {
            Some(l) => secs("latency-window", l, 0.1)?.as_secs_f64(),
            None => window,
        };
        Ok((window, short, latency))
    }

    /// `--gateway`, if given, is an `http://HOST:PORT` URL.
    fn check_gateway(&self) -> Result<(), LocalError> {
        if let Some(g) = &self.gateway {
            let ok = g
                .parse::<hyper::Uri>()
                .is_ok_and(|u| u.scheme_str() == Some("http") && u.host().is_some());
            if !ok {
                return Err(LocalError::Config(format!(
                    "--gateway: '{g}' is not an http://HOST:PORT URL"
                )));
            }
        }
        Ok(())
    }

    /// How to start a replica: the `sluice` binary, its arguments, ports, logs and timeouts.
    fn replica_command(&self, ports: Ports) -> Result<ReplicaCommand, LocalError> {
        let binary = self
            .sluice
            .clone()
            .unwrap_or_else(|| default_sluice(std::env::current_exe().ok().as_deref()));
        let mut args = vec![
            "--model".to_string(),
            self.model.clone(),
            "--model-dir".to_string(),
            self.model_dir.display().to_string(),
        ];
        args.extend(self.replica_args.iter().cloned());
        Ok(ReplicaCommand {
            binary,
            args,
            host: self.replica_host.clone(),
            ports,
            log_dir: self.log_dir.clone(),
            ready_timeout: secs("ready-timeout", self.ready_timeout, 0.1)?,
            stop_timeout: secs("stop-timeout", self.stop_timeout, 0.1)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: LocalArgs,
    }

    fn parse(args: &[&str]) -> Result<LocalConfig, LocalError> {
        let mut v = vec!["t"];
        v.extend_from_slice(args);
        T::try_parse_from(v).unwrap().a.validate()
    }

    #[test]
    fn the_served_model_is_what_sluice_serve_calls_it() {
        assert_eq!(
            served_model("smollm2-135m-instruct", &[]),
            "smollm2-135m-instruct"
        );
        assert_eq!(served_model("/m/SmolLM2.Q4_1.gguf", &[]), "SmolLM2.Q4_1");
        assert_eq!(served_model("/models/my-hf-dir", &[]), "my-hf-dir");
        let named = [
            "--threads".to_string(),
            "1".into(),
            "--served-model-name".into(),
            "x".into(),
        ];
        assert_eq!(served_model("m", &named), "x");
        assert_eq!(
            served_model("m", &["--served-model-name=y".to_string()]),
            "y"
        );
    }

    #[test]
    fn flags_validate_into_a_config_and_bad_ones_name_the_flag() {
        let c = parse(&[
            "--local",
            "--discovery-file",
            "/tmp/r",
            "--replica-arg=--threads",
            "--replica-arg=1",
            "--tick",
            "0.5",
            "--gateway",
            "http://127.0.0.1:8080/",
        ])
        .unwrap();
        assert_eq!(c.variant, "cpu-local");
        assert_eq!(c.tick, Duration::from_millis(500));
        assert_eq!(c.gateway.as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!(c.latency_window_s, c.window_s);
        assert!(c.replica.args.ends_with(&["--threads".into(), "1".into()]));
        for (args, needle) in [
            (&["--discovery-file", "/tmp/r"][..], "--local"),
            (&["--local"][..], "--discovery-file"),
            (
                &["--local", "--discovery-file", "r", "--min-replicas", "0"][..],
                "--min-replicas",
            ),
            (
                &["--local", "--discovery-file", "r", "--max-replicas", "0"][..],
                "--max-replicas",
            ),
            (
                &["--local", "--discovery-file", "r", "--tick", "0"][..],
                "--tick",
            ),
            (
                &["--local", "--discovery-file", "r", "--short-window", "100"][..],
                "--short-window",
            ),
            (
                &["--local", "--discovery-file", "r", "--replica-ports", "9-1"][..],
                "--replica-ports",
            ),
            (
                &["--local", "--discovery-file", "r", "--gateway", "ftp://x"][..],
                "--gateway",
            ),
            (
                &["--local", "--discovery-file", "r", "--variant", "gpu"][..],
                "gpu",
            ),
            (
                &["--local", "--discovery-file", "r", "--profile", "nope"][..],
                "nope",
            ),
        ] {
            let e = parse(args).unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }
}
