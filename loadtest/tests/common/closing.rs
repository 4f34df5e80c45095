//! A hand-written HTTP/1.1 fake that ends keep-alive connections the way llama.cpp's server
//! does under load. After answering `per_connection` requests it reads the next request and
//! closes the connection without a byte of answer. With `stale_after` it does the same to a
//! request that arrives on a connection idle for longer than that: its keep-alive timeout ran
//! out just as the client reused the connection. Both make the client's reuse race
//! deterministic. With `idle_close` it closes a connection that has waited that long for its
//! next request, which leaves the race to timing.

#![allow(dead_code)] // Each test binary uses a different part of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// How the fake ends connections.
#[derive(Debug, Clone, Copy)]
pub struct Closing {
    /// Requests answered per connection; the next one is read and dropped unanswered.
    pub per_connection: u64,
    /// Drop, unanswered, a request that arrives after the connection sat idle this long.
    pub stale_after: Option<Duration>,
    /// Close a connection that has waited this long for its next request.
    pub idle_close: Option<Duration>,
}

impl Closing {
    /// Answers every request, closes nothing early.
    pub fn never() -> Self {
        Self {
            per_connection: u64::MAX,
            stale_after: None,
            idle_close: None,
        }
    }
}

/// What the fake did.
#[derive(Debug, Default)]
pub struct Seen {
    pub connections: AtomicU64,
    pub answered: AtomicU64,
    /// Requests read and left unanswered (the connection closed instead).
    pub dropped: AtomicU64,
}

/// Starts the fake on 127.0.0.1:0; returns its base URL and what it sees.
pub async fn start(closing: Closing) -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let _ = tcp.set_nodelay(true);
            s.connections.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(serve(tcp, closing, s.clone()));
        }
    });
    (format!("http://{addr}"), seen)
}

/// A request's method, path and body.
struct Request {
    method: String,
    path: String,
    body: Vec<u8>,
}

async fn serve(tcp: TcpStream, closing: Closing, seen: Arc<Seen>) {
    let mut conn = BufReader::new(tcp);
    let mut answered = 0;
    let mut idle_since = tokio::time::Instant::now();
    loop {
        let next = read_request(&mut conn);
        let req = match closing.idle_close {
            Some(idle) if answered > 0 => match tokio::time::timeout(idle, next).await {
                Ok(r) => r,
                Err(_) => return,
            },
            _ => next.await,
        };
        let Some(req) = req else {
            return;
        };
        let stale = closing
            .stale_after
            .is_some_and(|d| answered > 0 && idle_since.elapsed() > d);
        if answered == closing.per_connection || stale {
            seen.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Counted before the client can see the answer, so a test reads a settled count.
        seen.answered.fetch_add(1, Ordering::Relaxed);
        if conn.get_mut().write_all(&answer(&req)).await.is_err() {
            return;
        }
        answered += 1;
        idle_since = tokio::time::Instant::now();
    }
}

/// Reads one request; `None` at the end of the connection.
async fn read_request(conn: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    if conn.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut length = 0;
    loop {
        let mut h = String::new();
        if conn.read_line(&mut h).await.ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    conn.read_exact(&mut body).await.ok()?;
    Some(Request { method, path, body })
}

fn response(status: &str, content_type: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A chat or completions answer of `max_tokens` one-token chunks (streamed or whole), or the
/// model list.
fn answer(req: &Request) -> Vec<u8> {
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/v1/models") => {
            let v = json!({"object": "list", "data": [{"id": "closing-model"}]});
            return response("200 OK", "application/json", &v.to_string());
        }
        ("GET", "/health") => return response("200 OK", "application/json", "{}"),
        ("GET", "/metrics") => return response("200 OK", "text/plain", ""),
        _ => {}
    }
    if !req.path.ends_with("completions") {
        return response("404 Not Found", "text/plain", "");
    }
    let body: Value = serde_json::from_slice(&req.body).unwrap_or_default();
    let n = body["max_tokens"].as_u64().unwrap_or(4).max(1);
    let usage = json!({"prompt_tokens": 8, "completion_tokens": n});
    if body["stream"].as_bool() != Some(true) {
        let text = "t ".repeat(n as usize);
        let v = json!({"choices": [{"index": 0, "message": {"content": text}, "text": text}],
            "usage": usage});
        return response("200 OK", "application/json", &v.to_string());
    }
    let mut sse = String::new();
    for _ in 0..n {
        let v = json!({"choices": [{"index": 0, "delta": {"content": "t "}, "text": "t "}]});
        sse.push_str(&format!("data: {v}\n\n"));
    }
    sse.push_str(&format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({"choices": [], "usage": usage})
    ));
    response("200 OK", "text/event-stream", &sse)
}
