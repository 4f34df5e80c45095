//! `make bench-gateway`: what the routing gateway costs. A fake OpenAI server that answers at
//! once (`tests/common/fake_upstream.rs`, on its own runtime) is measured straight, then
//! through `sluice serve --upstream` (the release binary, round-robin, one replica), then —
//! when it is installed — through SGLang's Rust router (`python -m sglang_router.launch_router
//! --worker-urls URL --policy round_robin`), all in the same run:
//!
//! - throughput: closed loop, `--connections` keep-alive connections for `--seconds`;
//! - added latency: one connection, requests back to back, p50 and p99 against the direct
//!   figures.
//!
//! Both for non-streaming chat requests and for streaming ones (three SSE events).
//! The load generator is a hyper client on its own runtime; every process shares this
//! machine's cores, so the ratios matter more than the absolute figures.

#[path = "../tests/common/fake_upstream.rs"]
mod fake_upstream;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

#[derive(Parser, Debug)]
struct Args {
    /// The sluice binary (release).
    #[arg(long, default_value = "target/release/sluice")]
    sluice: String,
    /// Python with `sglang_router` installed; measured when it imports.
    #[arg(
        long,
        env = "SGLANG_PYTHON",
        default_value = "target/sglang-venv/bin/python"
    )]
    sglang_python: String,
    #[arg(long, default_value_t = 32)]
    connections: usize,
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const MODEL: &str = "fake";

fn body(stream: bool) -> Bytes {
    Bytes::from(format!(
        r#"{{"model":"{MODEL}","stream":{stream},"max_tokens":4,"messages":[{{"role":"user","content":"Say hi."}}]}}"#
    ))
}

/// One keep-alive connection's sender.
async fn connect(addr: &str) -> http1::SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).unwrap();
    let (send, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    send
}

async fn one(send: &mut http1::SendRequest<Full<Bytes>>, addr: &str, body: &Bytes) -> bool {
    if send.ready().await.is_err() {
        return false;
    }
    let req = hyper::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("host", addr)
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .unwrap();
    match send.send_request(req).await {
        Ok(resp) => resp.status() == 200 && resp.into_body().collect().await.is_ok(),
        Err(_) => false,
    }
}

#[derive(Debug, Clone, Copy)]
struct Figures {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    errors: usize,
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64
}

async fn measure(addr: &str, stream: bool, conns: usize, secs: f64) -> Figures {
    let body = body(stream);
    // Warm-up: connections open, pools filled.
    let mut s = connect(addr).await;
    for _ in 0..200 {
        one(&mut s, addr, &body).await;
    }
    // Throughput.
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (stop, addr, body) = (stop.clone(), addr.to_string(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut s = connect(&addr).await;
            let (mut ok, mut err) = (0usize, 0usize);
            while !stop.load(Ordering::Relaxed) {
                if one(&mut s, &addr, &body).await {
                    ok += 1;
                } else {
                    err += 1;
                    s = connect(&addr).await;
                }
            }
            (ok, err)
        }));
    }
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut ok, mut errors) = (0, 0);
    for t in tasks {
        let (o, e) = t.await.unwrap();
        ok += o;
        errors += e;
    }
    let rps = ok as f64 / t0.elapsed().as_secs_f64();
    // Latency at concurrency 1.
    let mut lat = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < secs.min(3.0) {
        let t = Instant::now();
        if one(&mut s, addr, &body).await {
            lat.push(t.elapsed().as_micros() as u64);
        } else {
            errors += 1;
            s = connect(addr).await;
        }
    }
    lat.sort_unstable();
    Figures {
        rps,
        p50_us: pct(&lat, 0.5),
        p99_us: pct(&lat, 0.99),
        errors,
    }
}

/// Waits until `GET url` answers 200.
async fn wait_http(addr: &str, path: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(stream) = tokio::net::TcpStream::connect(addr).await {
            if let Ok((mut send, conn)) =
                http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await
            {
                tokio::spawn(conn);
                let req = hyper::Request::get(format!("http://{addr}{path}"))
                    .header("host", addr)
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                if let Ok(r) = send.send_request(req).await {
                    if r.status() == 200 {
                        return true;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

fn start_sluice(bin: &str, upstream: &str) -> (Proc, String) {
    let mut child = Command::new(bin)
        .args([
            "serve",
            "--port",
            "0",
            "--upstream",
            upstream,
            "--policy",
            "round-robin",
        ])
        .args(["--max-in-flight", "4096", "--max-queue", "4096"])
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin}: {e} (make bench-gateway builds it)"));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("sluice listening on http://")
        .expect("sluice prints its address")
        .to_string();
    (Proc(child), addr)
}

fn start_sglang(python: &str, upstream: &str) -> Option<(Proc, String)> {
    let ok = Command::new(python)
        .args(["-c", "import sglang_router"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = Command::new(python)
        .args([
            "-m",
            "sglang_router.launch_router",
            "--worker-urls",
            upstream,
        ])
        .args([
            "--policy",
            "round_robin",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    Some((Proc(child), format!("127.0.0.1:{port}")))
}

fn row(name: &str, f: &Figures, direct: &Figures) {
    println!(
        "{name:<28} {:>10.0} {:>10.0} {:>10.0} {:>12.0} {:>8}",
        f.rps,
        f.p50_us,
        f.p99_us,
        f.p50_us - direct.p50_us,
        f.errors
    );
}

fn main() {
    let args = Args::parse();
    // The fake on its own runtime and thread, so the load generator does not slow it.
    let fake_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (fake_addr, _task) = fake_rt.block_on(async {
        let f = fake_upstream::Fake::new(MODEL);
        f.healthy.store(true, Ordering::SeqCst);
        fake_upstream::serve(f, 0).await
    });
    let upstream = format!("http://{fake_addr}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (_sluice, sluice_addr) = start_sluice(&args.sluice, &upstream);
        assert!(
            wait_http(&sluice_addr, "/ready", Duration::from_secs(10)).await,
            "the gateway did not become ready"
        );
        let sglang = start_sglang(&args.sglang_python, &upstream);
        let sglang = match sglang {
            Some((p, addr)) if wait_http(&addr, "/health", Duration::from_secs(30)).await => {
                Some((p, addr))
            }
            Some(_) => {
                println!("sglang_router did not become healthy; skipped");
                None
            }
            None => {
                println!(
                    "sglang_router not installed at {}; skipped",
                    args.sglang_python
                );
                None
            }
        };
        println!(
            "{} connections for {} s; latency at concurrency 1 (µs)\n",
            args.connections, args.seconds
        );
        println!(
            "{:<28} {:>10} {:>10} {:>10} {:>12} {:>8}",
            "target", "req/s", "p50", "p99", "added p50", "errors"
        );
        for stream in [false, true] {
            let kind = if stream { "stream" } else { "json" };
            let fake = fake_addr.to_string();
            let direct = measure(&fake, stream, args.connections, args.seconds).await;
            row(&format!("direct ({kind})"), &direct, &direct);
            let gw = measure(&sluice_addr, stream, args.connections, args.seconds).await;
            row(&format!("sluice gateway ({kind})"), &gw, &direct);
            if let Some((_, addr)) = &sglang {
                let sg = measure(addr, stream, args.connections, args.seconds).await;
                row(&format!("sglang router ({kind})"), &sg, &direct);
                println!(
                    "{:<28} sluice / sglang throughput: {:.2}×",
                    "",
                    gw.rps / sg.rps
                );
            }
        }
    });
}
