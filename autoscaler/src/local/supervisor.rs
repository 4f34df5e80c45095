//! The replica processes: starting `sluice serve --model …` on a free port with its output in
//! a log file, noticing when it is ready (`/ready` answers 200), when it exits (expected or
//! not), and stopping it — SIGTERM (sluice serve drains: readiness false, in-flight requests
//! finish), then SIGKILL after a timeout — and reaping it.
//!
//! No orphans: every child is started with `kill_on_drop`, so if the supervisor is dropped
//! (an error, a panic) the children are killed; in its own process group, so a Ctrl-C at a
//! terminal reaches the autoscaler alone, which then drains its replicas in order instead of
//! every process stopping at once. A SIGKILL of the autoscaler itself cannot be caught: its
//! replicas then keep running (their pids are in the log), as with any supervisor that does
//! not own a cgroup.
//!
//! Ports: `--port 0` by default (the replica binds any free port and prints it: no race
//! between choosing a port and binding it); or a fixed range, where a port that another
//! process holds is skipped, and a port a replica failed to start on is avoided for a while.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::LocalError;

/// How long a port a replica failed to start on is not chosen again.
const BAD_PORT_FOR: Duration = Duration::from_secs(30);
/// The line `sluice serve` prints on stdout once it has bound its port.
const LISTENING: &str = "sluice listening on ";

/// How replicas are started.
#[derive(Debug, Clone)]
pub struct ReplicaCommand {
    /// The `sluice` binary.
    pub binary: PathBuf,
    /// Arguments after `serve` other than `--host`/`--port` (the model, its directory, ...).
    pub args: Vec<String>,
    pub host: String,
    pub ports: Ports,
    /// One log file per replica goes here.
    pub log_dir: PathBuf,
    /// From start to `/ready`; past it the process is killed as a failed start.
    pub ready_timeout: Duration,
    /// From SIGTERM to SIGKILL.
    pub stop_timeout: Duration,
}

/// Which ports replicas listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ports {
    /// Any free port, chosen by the replica (`--port 0`).
    Any,
    Range(RangeInclusive<u16>),
}

impl Ports {
    /// `0` or `LOW-HIGH`.
    pub fn parse(s: &str) -> Result<Ports, String> {
        if s.trim() == "0" {
            return Ok(Ports::Any);
        }
        let (lo, hi) = s
            .split_once('-')
            .ok_or_else(|| format!("'{s}' is not 0 or a range LOW-HIGH"))?;
        let p = |x: &str| {
            x.trim()
                .parse::<u16>()
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("'{x}' is not a port (1-65535)"))
        };
        let (lo, hi) = (p(lo)?, p(hi)?);
        if lo > hi {
            return Err(format!("'{s}': the range is empty"));
        }
        Ok(Ports::Range(lo..=hi))
    }
}

/// Where a replica is in its life.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Phase {
    /// Started, not ready yet.
    Starting,
    /// Ready and announced.
    Ready,
    /// Taken out of the discovery file; waiting until the gateway no longer routes to it and
    /// it has no requests, then SIGTERM.
    Draining { since: Instant },
    /// SIGTERM sent (`killed`: SIGKILL too); waiting for it to exit.
    Stopping { since: Instant, killed: bool },
}

/// One replica process.
#[derive(Debug)]
pub struct Replica {
    pub id: u64,
    pub pid: u32,
    /// `http://HOST:PORT` once known (at once for a fixed port, from its first line otherwise).
    pub url: Option<String>,
    pub port: Option<u16>,
    pub log: PathBuf,
    pub phase: Phase,
    pub started: Instant,
    child: tokio::process::Child,
}

/// What happened to a replica since the last poll.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Ready {
        id: u64,
        url: String,
    },
    /// Exited, or was killed for not being ready in time, before it ever served.
    StartFailed {
        id: u64,
        reason: String,
    },
    /// Exited while ready or draining: nobody asked it to.
    Died {
        id: u64,
        url: Option<String>,
        status: String,
    },
    /// Exited after SIGTERM (or SIGKILL).
    Stopped {
        id: u64,
        url: Option<String>,
        status: String,
        killed: bool,
    },
}

/// The replica processes.
#[derive(Debug)]
pub struct Supervisor {
    cmd: ReplicaCommand,
    replicas: Vec<Replica>,
    next_id: u64,
    bad_ports: HashMap<u16, Instant>,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Supervisor {
    pub fn new(cmd: ReplicaCommand) -> Result<Supervisor, LocalError> {
        std::fs::create_dir_all(&cmd.log_dir).map_err(|source| LocalError::Io {
            what: format!("creating the log directory {}", cmd.log_dir.display()),
            source,
        })?;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(Duration::from_secs(1)));
        Ok(Supervisor {
            cmd,
            replicas: Vec::new(),
            next_id: 1,
            bad_ports: HashMap::new(),
            client: Client::builder(TokioExecutor::new()).build(http),
        })
    }

    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    pub fn get(&self, id: u64) -> Option<&Replica> {
        self.replicas.iter().find(|r| r.id == id)
    }

    /// Replicas in a phase.
    pub fn count(&self, f: impl Fn(&Phase) -> bool) -> u32 {
        self.replicas.iter().filter(|r| f(&r.phase)).count() as u32
    }

    fn free_port(&self) -> Result<Option<u16>, LocalError> {
        let Ports::Range(range) = &self.cmd.ports else {
            return Ok(None);
        };
        let now = Instant::now();
        for p in range.clone() {
            let ours = self.replicas.iter().any(|r| r.port == Some(p));
            let bad = self
                .bad_ports
                .get(&p)
                .is_some_and(|&t| now.duration_since(t) < BAD_PORT_FOR);
            // Held by another process: skip it (a race remains; a replica that then fails to
            // bind is a failed start, and its port is avoided for a while).
            if !ours && !bad && std::net::TcpListener::bind((self.cmd.host.as_str(), p)).is_ok() {
                return Ok(Some(p));
            }
        }
        Err(LocalError::NoFreePort(format!(
            "{}-{}",
            range.start(),
            range.end()
        )))
    }

    /// Starts one replica; it is `Starting` until a poll finds it ready.
    pub fn start(&mut self) -> Result<u64, LocalError> {
        let port = self.free_port()?;
        let id = self.next_id;
        self.next_id += 1;
        let log = self.cmd.log_dir.join(format!("replica-{id}.log"));
        let io = |what: String| move |source| LocalError::Io { what, source };
        let out = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io(format!("opening {}", log.display())))?;
        let mut c = tokio::process::Command::new(&self.cmd.binary);
        c.arg("serve")
            .args([
                "--host",
                &self.cmd.host,
                "--port",
                &port.unwrap_or(0).to_string(),
            ])
            .args(&self.cmd.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .process_group(0);
        let child = c.spawn().map_err(|source| LocalError::Spawn {
            binary: self.cmd.binary.clone(),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        tracing::info!(id, pid, port, log = %log.display(), "replica starting");
        self.replicas.push(Replica {
            id,
            pid,
            url: port.map(|p| format!("http://{}:{p}", self.cmd.host)),
            port,
            log,
            phase: Phase::Starting,
            started: Instant::now(),
            child,
        });
        Ok(id)
    }

    /// Marks a ready replica as draining (the caller takes it out of the discovery file).
    pub fn drain(&mut self, id: u64) {
        if let Some(r) = self.replicas.iter_mut().find(|r| r.id == id) {
            if matches!(r.phase, Phase::Ready | Phase::Starting) {
                r.phase = Phase::Draining {
                    since: Instant::now(),
                };
            }
        }
    }

    /// Sends SIGTERM (once); the replica drains and exits, a later poll reaps it.
    pub fn terminate(&mut self, id: u64) {
        if let Some(r) = self.replicas.iter_mut().find(|r| r.id == id) {
            if !matches!(r.phase, Phase::Stopping { .. }) {
                signal(r, Signal::SIGTERM);
                r.phase = Phase::Stopping {
                    since: Instant::now(),
                    killed: false,
                };
            }
        }
    }

    /// Checks every replica: exits, readiness, start and stop deadlines.
    pub async fn poll(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        let mut gone = Vec::new();
        for i in 0..self.replicas.len() {
            let r = &mut self.replicas[i];
            match r.child.try_wait() {
                Ok(Some(status)) => {
                    events.push(exit_event(r, status.to_string(), &mut self.bad_ports));
                    gone.push(r.id);
                    continue;
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(id = r.id, "cannot check the replica: {e}"),
            }
            match r.phase {
                Phase::Starting => {
                    if r.url.is_none() {
                        r.url = listening_url(&r.log);
                    }
                    let ready = match &r.url {
                        Some(u) => is_ready(&self.client, u).await,
                        None => false,
                    };
                    if ready {
                        r.phase = Phase::Ready;
                        let url = r.url.clone().unwrap_or_default();
                        tracing::info!(id = r.id, %url, secs = r.started.elapsed().as_secs_f64(), "replica ready");
                        events.push(Event::Ready { id: r.id, url });
                    } else if r.started.elapsed() > self.cmd.ready_timeout {
                        let _ = r.child.start_kill();
                        let status = r
                            .child
                            .wait()
                            .await
                            .map_or_else(|e| e.to_string(), |s| s.to_string());
                        if let Some(p) = r.port {
                            self.bad_ports.insert(p, Instant::now());
                        }
                        events.push(Event::StartFailed {
                            id: r.id,
                            reason: format!(
                                "not ready within {:?}; killed ({status}); last lines of {}:\n{}",
                                self.cmd.ready_timeout,
                                r.log.display(),
                                tail(&r.log, 5)
                            ),
                        });
                        gone.push(r.id);
                    }
                }
                Phase::Stopping {
                    since,
                    killed: false,
                } if since.elapsed() > self.cmd.stop_timeout => {
                    tracing::warn!(id = r.id, pid = r.pid, "no exit after SIGTERM: SIGKILL");
                    let _ = r.child.start_kill();
                    r.phase = Phase::Stopping {
                        since,
                        killed: true,
                    };
                }
                _ => {}
            }
        }
        self.replicas.retain(|r| !gone.contains(&r.id));
        events
    }

    /// Stops every replica: SIGTERM, up to the stop timeout to exit, then SIGKILL; reaps all.
    pub async fn shutdown(&mut self) -> Vec<Event> {
        for r in &mut self.replicas {
            if !matches!(r.phase, Phase::Stopping { .. }) {
                signal(r, Signal::SIGTERM);
                r.phase = Phase::Stopping {
                    since: Instant::now(),
                    killed: false,
                };
            }
        }
        let deadline = Instant::now() + self.cmd.stop_timeout;
        let mut events = Vec::new();
        while !self.replicas.is_empty() {
            events.extend(self.poll().await);
            if Instant::now() > deadline {
                for r in &mut self.replicas {
                    let _ = r.child.start_kill();
                    let killed = matches!(r.phase, Phase::Stopping { .. });
                    let status = r
                        .child
                        .wait()
                        .await
                        .map_or_else(|e| e.to_string(), |s| s.to_string());
                    events.push(Event::Stopped {
                        id: r.id,
                        url: r.url.clone(),
                        status,
                        killed,
                    });
                }
                self.replicas.clear();
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        events
    }
}

fn signal(r: &Replica, s: Signal) {
    let Ok(pid) = i32::try_from(r.pid) else {
        return;
    };
    if pid <= 0 {
        return;
    }
    if let Err(e) = kill(Pid::from_raw(pid), s) {
        tracing::warn!(id = r.id, pid, "cannot send {s}: {e}");
    }
}

fn exit_event(r: &Replica, status: String, bad_ports: &mut HashMap<u16, Instant>) -> Event {
    match r.phase {
        Phase::Starting => {
            if let Some(p) = r.port {
                bad_ports.insert(p, Instant::now());
            }
            Event::StartFailed {
                id: r.id,
                reason: format!(
                    "exited before it was ready ({status}); last lines of {}:\n{}",
                    r.log.display(),
                    tail(&r.log, 5)
                ),
            }
        }
        Phase::Ready | Phase::Draining { .. } => Event::Died {
            id: r.id,
            url: r.url.clone(),
            status,
        },
        Phase::Stopping { killed, .. } => Event::Stopped {
            id: r.id,
            url: r.url.clone(),
            status,
            killed,
        },
    }
}

/// The URL from a replica's `sluice listening on http://ADDR` line, once it is in the log.
pub fn listening_url(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(LISTENING))
        .map(|u| u.trim().to_string())
}

/// The last `n` lines of a log, for error messages.
pub fn tail(log: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Whether `GET url/ready` answers 200 within a second.
async fn is_ready(client: &Client<HttpConnector, Empty<Bytes>>, url: &str) -> bool {
    let Ok(uri) = format!("{url}/ready").parse::<hyper::Uri>() else {
        return false;
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), client.get(uri)).await,
        Ok(Ok(resp)) if resp.status() == hyper::StatusCode::OK
    )
}

#[cfg(test)]
mod tests;
