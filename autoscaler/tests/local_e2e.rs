//! Local mode end to end, real processes on loopback and the real model: a routing gateway
//! (`sluice serve --discover file://…`), `sluice-autoscaler run --local` starting at one
//! replica, and the real `sluice-loadtest` CLI.
//!
//! A burst (10 req/s for 10 s of short requests, far above what one replica serves at the
//! SLO on this machine) must make the autoscaler scale past one replica; a trickle (one request
//! every two seconds) keeps going while the burst's arrivals leave the shortened windows, so
//! the scale-down back to one replica happens with traffic flowing, through the drain
//! (out of the discovery file, unrouted, idle, SIGTERM); the trickle is stopped (SIGTERM, which
//! ends a load test early with its report) a few requests after the fleet is back to one.
//! Both load tests must report zero failed requests. At the end SIGTERM to the autoscaler must
//! stop every replica it started.
//!
//! Behaviour, not timings: every wait is bounded generously (a busy two-core machine) and
//! the assertions are about what happened and in which order.
//!
//! Needs the `sluice` and `sluice-loadtest` binaries next to this package's (`make test` and
//! `cargo build -p sluice-gateway --bin sluice -p sluice-loadtest` build them) and the model
//! (`make model`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

const MODEL: &str = "smollm2-135m-instruct";

fn model_dir() -> PathBuf {
    let d = std::env::var_os("SLUICE_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/cache"));
    let gguf = d.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        gguf.is_file(),
        "{} is missing: run `make model` (or set SLUICE_MODEL_DIR)",
        gguf.display()
    );
    d
}

/// A binary built beside this package's (target/debug).
fn sibling(name: &str) -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_sluice-autoscaler"));
    let p = exe.parent().unwrap().join(name);
    assert!(
        p.is_file(),
        "{} is missing: build it first (cargo build -p sluice-gateway --bin sluice -p sluice-loadtest)",
        p.display()
    );
    p
}

/// A child killed (SIGKILL) and reaped when dropped, unless already waited for.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(x) = f() {
            return x;
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Sends signal `name` (`TERM`, `INT`) to `child`.
fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {}", child.id());
}

/// `GET url` on loopback with a plain socket: the body, if the status is 200.
fn get(url: &str) -> Option<String> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').map_or((rest, "/"), |(h, p)| (h, p));
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    let mut s = std::net::TcpStream::connect(host).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

fn loadtest(gateway: &str, json: &Path, extra: &[&str]) -> Child {
    Command::new(sibling("sluice-loadtest"))
        .args([
            "--url",
            gateway,
            "--model",
            MODEL,
            "--endpoint",
            "completions",
        ])
        .args(["--input-len", "24", "--output-len", "6", "--ignore-eos"])
        .args(["--timeout", "300", "--quiet", "--json"])
        .arg(json)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sluice-loadtest starts")
}

fn summary(path: &Path) -> (u64, u64) {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    (
        v["completed"].as_u64().unwrap(),
        v["failed"].as_u64().unwrap(),
    )
}

/// The tests here each run a fleet of real processes: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn a_burst_scales_up_and_the_fleet_drains_back_to_one_without_losing_requests() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, file) = fresh_dir("sluice-local-e2e");
    // The burst waits in the gateway's queue for a replica with room (late binding) longer
    // than the default 30 s queue timeout, as it did on the replicas.
    let (gw, gateway) = start_gateway(&dir, &file, &["--queue-timeout", "300s"]);
    let mut scaler = start_burst_autoscaler(&dir, &file, &gateway);
    let records = collect_records(&mut scaler);
    let last = |key: &str| -> Option<u64> {
        records
            .lock()
            .unwrap()
            .last()
            .and_then(|(_, v)| v[key].as_u64())
    };

    // One replica ready, announced, and known to the gateway.
    wait_for("the first replica", Duration::from_secs(120), || {
        (last("ready") == Some(1)).then_some(())
    });
    wait_for(
        "the gateway to list the model",
        Duration::from_secs(30),
        || get(&format!("{gateway}/v1/models")).filter(|b| b.contains(MODEL)),
    );
    let before = records.lock().unwrap().len();
    assert_status_endpoint_sees_one_replica(&dir);

    // The trickle runs through the burst and the scale-down; the burst is on top.
    let trickle_json = dir.join("trickle.json");
    let mut trickle = Proc(loadtest(
        &gateway,
        &trickle_json,
        // Until stopped below, once the fleet is back to one replica.
        &[
            "--rate",
            "0.5",
            "--arrival",
            "constant",
            "--duration",
            "600",
            "--seed",
            "2",
        ],
    ));
    let burst_json = dir.join("burst.json");
    let mut burst = Proc(loadtest(
        &gateway,
        &burst_json,
        &[
            "--rate",
            "10",
            "--arrival",
            "constant",
            "--requests",
            "100",
            "--seed",
            "1",
        ],
    ));
    let burst_status = wait_for("the burst", Duration::from_secs(400), || {
        burst.0.try_wait().unwrap()
    });

    // Back to one replica, nothing draining or stopping.
    wait_for(
        "the scale-down to one replica",
        Duration::from_secs(400),
        || {
            let r = records.lock().unwrap();
            let (_, v) = r.last()?;
            let settled = v["desired"] == 1
                && v["ready"] == 1
                && v["starting"] == 0
                && v["draining"] == 0
                && v["stopping"] == 0
                && v["announced"].as_array().map(Vec::len) == Some(1);
            settled.then_some(())
        },
    );
    // A couple of trickle requests to the one replica left, then the trickle ends.
    std::thread::sleep(Duration::from_secs(4));
    let trickle_end = Instant::now();
    signal(&trickle.0, "TERM");
    let trickle_status = wait_for("the trickle", Duration::from_secs(60), || {
        trickle.0.try_wait().unwrap()
    });

    let recs: Vec<(Instant, Value)> = records.lock().unwrap()[before..].to_vec();
    assert_scaled_up_and_drained_under_load(&recs, trickle_end);
    assert!(burst_status.success(), "burst load test: {burst_status}");
    assert!(
        trickle_status.success(),
        "trickle load test: {trickle_status}"
    );
    assert_eq!(summary(&burst_json), (100, 0), "burst: completed, failed");
    let (done, failed) = summary(&trickle_json);
    assert!(done > 10, "trickle completed only {done}");
    assert_eq!(
        failed, 0,
        "trickle lost requests while replicas came and went"
    );

    let log = std::fs::read_to_string(dir.join("autoscaler.log")).unwrap();
    assert!(log.contains("replica stopped"), "{log}");
    assert!(
        !log.contains("killed=true"),
        "a replica needed SIGKILL:\n{log}"
    );
    assert!(!log.contains("replica died"), "{log}");
    let pids = replica_pids(&log);
    assert!(pids.len() >= 2, "{log}");
    assert_stops_cleanly(&mut scaler, &pids, &file);
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh scratch folder named for `name` and this process, with an empty discovery file.
fn fresh_dir(name: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("replicas");
    std::fs::write(&file, "").unwrap();
    (dir, file)
}

/// The autoscaler of the burst test: up to three replicas of eight sequences each, windows
/// shortened for the test, its status endpoint on a free port.
fn start_burst_autoscaler(dir: &Path, file: &Path, gateway: &str) -> Proc {
    Proc(
        local_autoscaler(file, gateway)
            .args([
                "--replica-arg=--threads",
                "--replica-arg=1",
                "--replica-arg=--kv-cache-mib",
                "--replica-arg=64",
                "--replica-arg=--max-model-len",
                "--replica-arg=1024",
                // Eight sequences at a time: the burst queues visibly in the engines.
                "--replica-arg=--max-num-seqs",
                "--replica-arg=8",
                // A burst queued behind eight sequences waits longer than the default 30 s
                // admission timeout; a 429 would be retried elsewhere, but three in a row fail.
                "--replica-arg=--queue-timeout",
                "--replica-arg=300s",
            ])
            .arg("--log-dir")
            .arg(dir.join("logs"))
            .args(["--min-replicas", "1", "--max-replicas", "3", "--tick", "1"])
            .args([
                "--window",
                "10",
                "--short-window",
                "3",
                "--scale-down-window",
                "8",
            ])
            .args([
                "--panic-window",
                "5",
                "--drain-timeout",
                "60",
                "--stop-timeout",
                "30",
            ])
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("autoscaler.log")).unwrap())
            .spawn()
            .expect("sluice-autoscaler starts"),
    )
}

/// The autoscaler's own endpoint (its address from its log): healthy, and its metrics say
/// one replica is ready.
fn assert_status_endpoint_sees_one_replica(dir: &Path) {
    let status = wait_for("the status endpoint", Duration::from_secs(10), || {
        std::fs::read_to_string(dir.join("autoscaler.log"))
            .ok()?
            .lines()
            .filter(|l| l.contains("serving /healthz"))
            .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("addr=")))
            .map(|a| format!("http://{a}"))
    });
    assert_eq!(get(&format!("{status}/healthz")).as_deref(), Some("ok\n"));
    let metrics = get(&format!("{status}/metrics")).expect("/metrics answers");
    assert!(
        metrics.contains("sluice_autoscaler_local_replicas{phase=\"ready\"} 1"),
        "{metrics}"
    );
}

/// Over the tick records from the burst on (printed as a timeline): a second replica came
/// up, requests queued, and a replica was drained while the trickle was still sending.
fn assert_scaled_up_and_drained_under_load(recs: &[(Instant, Value)], trickle_end: Instant) {
    let timeline: Vec<String> = recs
        .iter()
        .map(|(_, v)| {
            format!(
                "t={:.0} want={} ready={} start={} drain={} stop={} wait={} run={} rate={:.1}",
                v["t"].as_f64().unwrap_or(0.0),
                v["desired"],
                v["ready"],
                v["starting"],
                v["draining"],
                v["stopping"],
                v["waiting"],
                v["running"],
                v["rate"].as_f64().unwrap_or(0.0)
            )
        })
        .collect();
    eprintln!("{}", timeline.join("\n"));
    let max_ready = recs.iter().filter_map(|(_, v)| v["ready"].as_u64()).max();
    assert!(
        max_ready >= Some(2),
        "the burst never brought a second replica up"
    );
    assert!(
        recs.iter().any(|(_, v)| v["waiting"].as_u64() > Some(0)),
        "the burst never queued"
    );
    assert!(
        recs.iter()
            .any(|(_, v)| v["busiest_second_tokens"].as_f64() > Some(0.0)),
        "the gateway's prompt tokens per second never reached the autoscaler"
    );
    assert!(
        recs.iter()
            .any(|(_, v)| v["max_prompt_tokens"].as_u64() > Some(0)),
        "the replicas' prompt lengths never reached the autoscaler"
    );
    let first_drain = recs
        .iter()
        .find(|(_, v)| v["draining"].as_u64() > Some(0))
        .map(|(t, _)| *t)
        .expect("no replica was drained");
    assert!(
        first_drain < trickle_end,
        "the scale-down began only after the trickle ended"
    );
}

/// The pids of the replicas the autoscaler's log says it started.
fn replica_pids(log: &str) -> Vec<i32> {
    log.lines()
        .filter(|l| l.contains("replica starting"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("pid="))
                .and_then(|p| p.parse().ok())
        })
        .collect()
}

/// SIGTERM to the autoscaler: it exits cleanly, no replica in `pids` outlives it, and the
/// discovery file lists no replica.
fn assert_stops_cleanly(scaler: &mut Proc, pids: &[i32], file: &Path) {
    terminate(scaler);
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "replica pid {pid} outlived the autoscaler"
        );
    }
    let listed = std::fs::read_to_string(file).unwrap();
    assert_eq!(
        listed.lines().filter(|l| !l.starts_with('#')).count(),
        0,
        "the discovery file still lists replicas: {listed}"
    );
}

/// `sluice-autoscaler run --local` for the model behind `gateway`, announcing to `file`.
fn local_autoscaler(file: &Path, gateway: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice-autoscaler"));
    c.args(["run", "--local", "--discovery-file"])
        .arg(file)
        .args(["--gateway", gateway, "--model", MODEL, "--model-dir"])
        .arg(model_dir());
    c
}

/// SIGTERM to the autoscaler: it exits, successfully.
fn terminate(scaler: &mut Proc) {
    signal(&scaler.0, "TERM");
    let exit = wait_for("the autoscaler to exit", Duration::from_secs(60), || {
        scaler.0.try_wait().unwrap()
    });
    assert!(exit.success(), "autoscaler exit: {exit}");
}

/// `POST url` with a JSON body on loopback: the status and the body.
fn post(url: &str, body: &str, timeout: Duration) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/')?;
    let mut s = std::net::TcpStream::connect(host).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    write!(
        s,
        "POST /{path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// A routing gateway watching `file` (and given `extra` arguments), its log in `dir`; and
/// its URL.
fn start_gateway(dir: &Path, file: &Path, extra: &[&str]) -> (Proc, String) {
    let mut gw = Proc(
        Command::new(sibling("sluice"))
            .args(["serve", "--port", "0", "--policy", "least-load"])
            .args(extra)
            .arg("--discover")
            .arg(format!("file://{}", file.display()))
            .args(["--discover-interval", "100ms", "--poll-interval", "100ms"])
            .args(["--health-interval", "200ms", "--health-path", "/ready"])
            .args(["--stale-after", "3s"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("gateway.log")).unwrap())
            .spawn()
            .expect("sluice starts"),
    );
    let mut line = String::new();
    BufReader::new(gw.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .strip_prefix("sluice listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .trim()
        .to_string();
    (gw, url)
}

/// The autoscaler's tick records, collected from its stdout as they come.
fn collect_records(scaler: &mut Proc) -> Arc<Mutex<Vec<(Instant, Value)>>> {
    let records: Arc<Mutex<Vec<(Instant, Value)>>> = Arc::default();
    let out = scaler.0.stdout.take().unwrap();
    let r = records.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                r.lock().unwrap().push((Instant::now(), v));
            }
        }
    });
    records
}

/// One completion through the gateway; the time to its answer.
fn one_request(gateway: &str) -> Duration {
    let body = format!(
        r#"{{"model":"{MODEL}","prompt":"Once upon a time","max_tokens":4,"temperature":0}}"#
    );
    let t0 = Instant::now();
    let (status, answer) = post(
        &format!("{gateway}/v1/completions"),
        &body,
        Duration::from_secs(180),
    )
    .expect("the gateway answers");
    let took = t0.elapsed();
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"choices\""), "{answer}");
    took
}

/// Scale to zero and back with real processes: local mode at `--min-replicas 0` starts no
/// replica, the gateway still lists the model (the discovery file's `model` line), and a
/// request is held by the gateway while the autoscaler, seeing it held, starts a replica; the
/// answer is a 200. Idle past the (shortened) scale-down window, the pool goes back to no
/// replica process at all, and a second request wakes it again. The cold-start latencies are
/// printed, not asserted.
#[test]
fn a_pool_at_zero_replicas_wakes_for_a_held_request_and_idles_back_to_zero() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, file) = fresh_dir("sluice-zero-e2e");
    // A cold start on a busy machine may take a while: hold past it.
    let (gw, gateway) = start_gateway(&dir, &file, &["--hold-timeout", "150s"]);
    let mut scaler = Proc(
        local_autoscaler(&file, &gateway)
            .args(["--replica-arg=--threads", "--replica-arg=1"])
            .arg("--log-dir")
            .arg(dir.join("logs"))
            .args([
                "--min-replicas",
                "0",
                "--max-replicas",
                "1",
                "--tick",
                "0.5",
            ])
            .args([
                "--window",
                "4",
                "--short-window",
                "2",
                "--scale-down-window",
                "6",
            ])
            .args(["--panic-window", "2", "--stop-timeout", "30"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("autoscaler.log")).unwrap())
            .spawn()
            .expect("sluice-autoscaler starts"),
    );
    let records = collect_records(&mut scaler);
    let fleet = |key: &str| -> Option<u64> {
        records
            .lock()
            .unwrap()
            .last()
            .and_then(|(_, v)| v[key].as_u64())
    };
    let log = || std::fs::read_to_string(dir.join("autoscaler.log")).unwrap_or_default();
    let starts = || log().matches("replica starting").count();

    // At zero: the gateway knows the model, and no replica process exists.
    wait_for(
        "the gateway to list the model at zero replicas",
        Duration::from_secs(30),
        || get(&format!("{gateway}/v1/models")).filter(|b| b.contains(MODEL)),
    );
    wait_for("a few ticks", Duration::from_secs(30), || {
        (records.lock().unwrap().len() >= 4).then_some(())
    });
    assert_eq!((fleet("ready"), fleet("starting")), (Some(0), Some(0)));
    assert_eq!(starts(), 0, "{}", log());

    // A request at zero: held, a replica started for it, answered.
    let first = one_request(&gateway);
    assert_eq!(starts(), 1, "{}", log());
    eprintln!(
        "cold start from zero replicas: first answer after {:.2} s",
        first.as_secs_f64()
    );

    // Idle: back to no replica process.
    wait_for("the pool to idle to zero", Duration::from_secs(120), || {
        let r = records.lock().unwrap();
        let woke = r.iter().position(|(_, v)| v["ready"] == 1)?;
        let zero = |v: &Value| {
            v["desired"] == 0
                && v["ready"] == 0
                && v["starting"] == 0
                && v["draining"] == 0
                && v["stopping"] == 0
        };
        r[woke..].iter().any(|(_, v)| zero(v)).then_some(())
    });
    let pids = replica_pids(&log());
    assert_eq!(pids.len(), 1);
    assert!(
        !Path::new(&format!("/proc/{}", pids[0])).exists(),
        "the replica process outlived the scale to zero"
    );
    let listed = std::fs::read_to_string(&file).unwrap();
    assert!(listed.contains(&format!("model {MODEL}")), "{listed}");
    assert!(!listed.contains("http://"), "{listed}");

    // A second request wakes it again.
    let second = one_request(&gateway);
    assert_eq!(starts(), 2, "{}", log());
    eprintln!(
        "cold start from zero replicas, again: first answer after {:.2} s",
        second.as_secs_f64()
    );
    assert!(!log().contains("replica died"), "{}", log());

    terminate(&mut scaler);
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A prompt every replica refuses as too long reaches the policy: one replica run with
/// `--max-prompt-tokens 48` refuses a 160-word prompt (a 400 `context_length_exceeded`
/// through the gateway), the gateway counts it in
/// `sluice_gateway_model_refused_prompt_tokens` at its estimate (800 bytes / 4: the
/// `(181, 256]` bucket), and, since the CPU variant serves about a thousand tokens within the
/// 4 s target, the autoscaler's ticks show it as the window's longest prompt, where the
/// replica's own histogram holds none.
#[test]
fn a_prompt_refused_as_too_long_reaches_the_policys_request_shape() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (dir, file) = fresh_dir("sluice-refused-e2e");
    let (gw, gateway) = start_gateway(&dir, &file, &[]);
    let mut scaler = Proc(
        local_autoscaler(&file, &gateway)
            .args(["--replica-arg=--threads", "--replica-arg=1"])
            .args(["--replica-arg=--max-prompt-tokens", "--replica-arg=48"])
            .arg("--log-dir")
            .arg(dir.join("logs"))
            .args([
                "--min-replicas",
                "1",
                "--max-replicas",
                "1",
                "--tick",
                "0.5",
            ])
            .args(["--window", "10", "--short-window", "2"])
            .args(["--stop-timeout", "30"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("autoscaler.log")).unwrap())
            .spawn()
            .expect("sluice-autoscaler starts"),
    );
    let records = collect_records(&mut scaler);
    wait_for("the replica", Duration::from_secs(120), || {
        let r = records.lock().unwrap();
        (r.last()?.1["ready"] == 1).then_some(())
    });
    wait_for(
        "the gateway to list the model",
        Duration::from_secs(30),
        || get(&format!("{gateway}/v1/models")).filter(|b| b.contains(MODEL)),
    );
    let longest = |v: &Value| v["max_prompt_tokens"].as_u64().unwrap_or(0);
    assert!(records.lock().unwrap().iter().all(|(_, v)| longest(v) == 0));

    let prompt = "word ".repeat(160);
    let body = format!(r#"{{"model":"{MODEL}","prompt":"{prompt}","max_tokens":4}}"#);
    let (status, answer) = post(
        &format!("{gateway}/v1/completions"),
        &body,
        Duration::from_secs(60),
    )
    .expect("the gateway answers");
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("context_length_exceeded"), "{answer}");
    let sent = records.lock().unwrap().len();
    let seen = wait_for(
        "the refused prompt in a tick",
        Duration::from_secs(30),
        || {
            let r = records.lock().unwrap();
            r[sent..].iter().map(|(_, v)| longest(v)).find(|&l| l > 0)
        },
    );
    assert_eq!(seen, 256, "the estimate's bucket bound");

    terminate(&mut scaler);
    drop(gw);
    let _ = std::fs::remove_dir_all(&dir);
}
