//! A replica that closes idle keep-alive connections: the gateway's pooled client reuses a
//! connection just as the replica ends it, and the request must still succeed without counting
//! against the replica.

mod common;

// The loadtest's fake server that closes keep-alive connections, compiled here as it is: the
// loadtest depends on no sluice crate, so the two crates' tests share the file, not a crate.
#[path = "../../loadtest/tests/common/closing.rs"]
mod closing;

use std::sync::atomic::Ordering;
use std::time::Duration;

use closing::Closing;
use common::routing::*;
use sluice_gateway::api::HttpLimits;
use sluice_gateway::discovery::Source;
use sluice_gateway::router::health::EjectionPolicy;
use sluice_gateway::router::policy::Policy;
use sluice_gateway::router::remote::ReplicaUrl;
use sluice_gateway::router::RouterConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_after_idle_survive_the_replica_closing_pooled_connections() {
    // A request that arrives on a connection idle for over 30 ms is read and dropped without a
    // byte of answer, as a server whose keep-alive timeout just ran out does.
    let (base_url, seen) = closing::start(Closing {
        stale_after: Some(Duration::from_millis(30)),
        ..Closing::never()
    })
    .await;
    let url = ReplicaUrl::parse(&base_url).unwrap();
    let cfg = RouterConfig {
        policy: Policy::RoundRobin,
        // No background traffic after the first check: only the test's requests reuse
        // connections, so every burst after a pause meets the race.
        health_interval: Duration::from_secs(3600),
        poll_interval: Duration::from_secs(3600),
        stale_after: Duration::from_secs(7200),
        // One attempt, and ejection on the first failure: a lost request would show as a 502
        // and an ejection.
        max_attempts: 1,
        ejection: EjectionPolicy {
            eject_after: 1,
            ..Default::default()
        },
        ..quick_config()
    };
    let gw = gateway(
        cfg,
        vec![Source::Static(vec![url.clone()])],
        HttpLimits::default(),
    )
    .await;
    let router = gw.router.clone();
    eventually(
        Duration::from_secs(5),
        "the replica becomes eligible",
        || {
            let now = std::time::Instant::now();
            router.replicas().values().any(|r| r.eligible(now))
        },
    )
    .await;
    let b = format!("http://{}", gw.addr);
    for round in 0..3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let burst = (0..4).map(|i| {
            let b = b.clone();
            async move {
                let body = chat("closing-model", &format!("r{round} q{i}"), i % 2 == 0);
                post(&b, "/v1/chat/completions", body, &[]).await
            }
        });
        for (i, r) in futures_util::future::join_all(burst)
            .await
            .iter()
            .enumerate()
        {
            assert_eq!(r.status, 200, "round {round} request {i}: {r:?}");
            let text = r.body.as_ref().unwrap();
            assert!(text.contains("t "), "round {round} request {i}: {text}");
        }
    }
    let dropped = seen.dropped.load(Ordering::Relaxed);
    assert!(
        dropped >= 3,
        "the fake dropped {dropped} requests: no race was met"
    );
    let m = get(&b, "/metrics").await.body.unwrap();
    let at = |s: &str| {
        metric(
            &m,
            "sluice_gateway_upstream_requests_total",
            &[("replica", url.as_str()), ("status", s)],
        )
    };
    assert_eq!(at("io_error"), 0.0, "{m}");
    assert_eq!(at("200"), 12.0, "{m}");
    assert_eq!(
        metric(
            &m,
            "sluice_gateway_replica_ejections_total",
            &[("replica", url.as_str())]
        ),
        0.0,
        "{m}"
    );
}
