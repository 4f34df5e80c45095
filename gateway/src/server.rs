//! Serving the router on a socket: hyper's HTTP/1 connections with a header-read timeout
//! (slow-loris), and the drain sequence that SIGTERM starts.
//!
//! Drain: readiness turns false at once and new generation requests get 503 (the listener
//! stays open so load balancers see a clean refusal, not a reset) until in-flight requests
//! finish or the drain timeout passes; then the listener closes and open connections are
//! shut down gracefully.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::api::AppState;

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub header_timeout: Duration,
    pub drain_timeout: Duration,
}

/// Serves until `shutdown` resolves, then drains. Returns whether every in-flight request
/// finished within the drain timeout.
pub async fn run(
    listener: TcpListener,
    app: Router,
    state: Arc<AppState>,
    opts: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> bool {
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(opts.header_timeout)
        .keep_alive(true);
    let accept = |graceful: &GracefulShutdown, stream: tokio::net::TcpStream| {
        let _ = stream.set_nodelay(true);
        let svc = TowerToHyperService::new(app.clone());
        let conn = http.serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection ended: {e}");
            }
        });
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            res = listener.accept() => match res {
                Ok((stream, _)) => accept(&graceful, stream),
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = &mut shutdown => break,
        }
    }
    tracing::info!(
        in_flight = state.in_flight.count(),
        "draining: readiness is false, new requests get 503"
    );
    state.draining.store(true, Ordering::Release);
    if let Some(b) = state.backend.get() {
        b.shutdown();
    }
    let drained = {
        let idle = state.in_flight.idle();
        tokio::pin!(idle);
        let deadline = tokio::time::sleep(opts.drain_timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut idle => break true,
                _ = &mut deadline => break false,
                res = listener.accept() => if let Ok((stream, _)) = res {
                    accept(&graceful, stream);
                },
            }
        }
    };
    drop(listener);
    if !drained {
        tracing::warn!(
            in_flight = state.in_flight.count(),
            "drain timeout: exiting with requests still in flight"
        );
    }
    // Idle keep-alive connections close now; give busy ones a moment.
    let _ = tokio::time::timeout(Duration::from_secs(1), graceful.shutdown()).await;
    drained
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
