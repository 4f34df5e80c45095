//! Keep-alive connections a server closes under the client: a request lost to connection reuse
//! is sent again on a new connection and reported as a retry, never as a server failure.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Parser;
use common::closing::{self, Closing};
use sluice_loadtest::config::{Args, Config};
use sluice_loadtest::report::Report;
use sluice_loadtest::session;

async fn run(base: &str, args: &[&str]) -> Report {
    let mut v = vec![
        "sluice-loadtest",
        "--url",
        base,
        "--quiet",
        "--no-tokenize",
        "--input-len",
        "16",
        "--output-len",
        "4",
    ];
    v.extend_from_slice(args);
    let cfg = Config::from_args(Args::try_parse_from(v).unwrap()).unwrap();
    session::execute(cfg).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_connections_closed_at_reuse_are_retried_not_failed() {
    // Every connection answers one request, then drops the next unanswered: each reuse of a
    // pooled connection meets the race, deterministically.
    let (base, seen) = closing::start(Closing {
        per_connection: 1,
        ..Closing::never()
    })
    .await;
    let r = run(&base, &["--concurrency", "4", "--requests", "16"]).await;
    let s = &r.points[0].summary;
    assert_eq!((s.completed, s.failed), (16, 0), "errors: {:?}", s.errors);
    let dropped = seen.dropped.load(Ordering::Relaxed);
    assert!(dropped >= 4, "the fake dropped {dropped} requests");
    assert_eq!(s.retried_stale, dropped, "one retry per dropped request");
    let records = &r.points[0].records;
    assert_eq!(records.iter().filter(|r| r.retried).count() as u64, dropped);
    assert!(records.iter().all(|r| r.ok && r.output_tokens == 4));
    assert_eq!(r.to_json()["retried_stale_connection"], dropped);
    let table = r.render();
    assert!(
        table.contains("retried after a stale keep-alive connection"),
        "{table}"
    );
    // The model lookup and every answer used a connection; the retries each a new one.
    assert_eq!(seen.answered.load(Ordering::Relaxed), 16 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_requests_are_retried_too() {
    let (base, seen) = closing::start(Closing {
        per_connection: 2,
        ..Closing::never()
    })
    .await;
    let r = run(
        &base,
        &["--no-stream", "--concurrency", "2", "--requests", "12"],
    )
    .await;
    let s = &r.points[0].summary;
    assert_eq!((s.completed, s.failed), (12, 0), "errors: {:?}", s.errors);
    assert_eq!(s.retried_stale, seen.dropped.load(Ordering::Relaxed));
    assert!(s.retried_stale >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_closed_while_idle_cost_no_requests() {
    // The fake closes a connection idle for 30 ms; an open loop at 20/s leaves ~50 ms gaps, so
    // most reuses find the connection closing or closed.
    let (base, seen) = closing::start(Closing {
        idle_close: Some(Duration::from_millis(30)),
        ..Closing::never()
    })
    .await;
    let r = run(
        &base,
        &["--rate", "20", "--arrival", "constant", "--requests", "20"],
    )
    .await;
    let s = &r.points[0].summary;
    assert_eq!((s.completed, s.failed), (20, 0), "errors: {:?}", s.errors);
    assert!(seen.connections.load(Ordering::Relaxed) >= 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_connections_past_the_server_keep_alive_are_retried() {
    // The fake's keep-alive is 20 ms and it notices only when the next request arrives; an
    // open loop at 10/s leaves every connection idle ~100 ms between requests.
    let (base, seen) = closing::start(Closing {
        stale_after: Some(Duration::from_millis(20)),
        ..Closing::never()
    })
    .await;
    let r = run(
        &base,
        &["--rate", "10", "--arrival", "constant", "--requests", "10"],
    )
    .await;
    let s = &r.points[0].summary;
    assert_eq!((s.completed, s.failed), (10, 0), "errors: {:?}", s.errors);
    let dropped = seen.dropped.load(Ordering::Relaxed);
    // Every other request: a dropped one's retry leaves the pool empty for the next.
    assert!(dropped >= 4, "the fake dropped {dropped} requests");
    assert_eq!(s.retried_stale, dropped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_drops_every_request_still_fails_them() {
    // A fresh connection that never answers is the server's failure, retried by nobody.
    let (base, _) = closing::start(Closing {
        per_connection: 0,
        ..Closing::never()
    })
    .await;
    let r = run(
        &base,
        &["--model", "m", "--concurrency", "2", "--requests", "4"],
    )
    .await;
    let s = &r.points[0].summary;
    assert_eq!((s.completed, s.failed), (0, 4));
    assert_eq!(s.retried_stale, 0);
}
