//! A fake routing gateway on loopback: `/metrics` answers whatever the test sets. Shared by
//! the controller's unit tests (included by path from `src/controller/gateway.rs`) and the
//! operator tests (`tests/controller_k8s.rs`).

use std::sync::{Arc, Mutex};

/// Starts one; its base URL (`http://127.0.0.1:PORT`) and the `/metrics` text to set.
pub async fn fake_gateway() -> (String, Arc<Mutex<String>>) {
    let body = Arc::new(Mutex::new(String::new()));
    let served = body.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let b = served.lock().unwrap().clone();
            async move { b }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, body)
}
