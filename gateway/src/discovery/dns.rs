//! `dns://NAME:PORT`: every address the name resolves to is a replica. A headless Service's
//! name resolves to its ready pods, so re-resolving every interval follows scale-ups,
//! restarts and removals. A failed lookup keeps the last good set (a resolver hiccup must not
//! empty the fleet); an empty answer is reported as is (the Service has no ready pods).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::router::remote::ReplicaUrl;
use crate::router::Router;

/// The replicas `host:port` resolves to now.
pub async fn resolve(host: &str, port: u16) -> std::io::Result<BTreeSet<ReplicaUrl>> {
    Ok(tokio::net::lookup_host((host, port))
        .await?
        .map(ReplicaUrl::from_addr)
        .collect())
}

pub async fn run(host: String, port: u16, router: Arc<Router>, slot: usize, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match resolve(&host, port).await {
            Ok(set) => super::report(&router, slot, set),
            Err(e) => {
                tracing::warn!(%host, "DNS discovery: lookup failed, keeping the last set: {e}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn localhost_resolves_to_loopback_replicas() {
        let set = resolve("localhost", 8123).await.unwrap();
        assert!(!set.is_empty());
        for u in &set {
            assert!(
                u.as_str() == "http://127.0.0.1:8123" || u.as_str() == "http://[::1]:8123",
                "{u}"
            );
        }
        let ip = resolve("127.0.0.1", 9).await.unwrap();
        assert_eq!(
            ip.into_iter().map(|u| u.to_string()).collect::<Vec<_>>(),
            ["http://127.0.0.1:9"]
        );
    }
}
