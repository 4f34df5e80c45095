//! Connections that remember whether they were reused and whether the replica answered, so a
//! request lost to keep-alive reuse can be told from a replica that failed it.
//!
//! A replica's server closes an idle keep-alive connection when its timeout runs out (or after
//! a number of requests). If the gateway reuses the connection at that moment, the request is
//! written, the server's close arrives instead of an answer, and hyper reports
//! `IncompleteMessage`: the connection pool failed, not the replica. hyper resends on its own
//! only a request it had not begun to write.
//!
//! [`Counting`] wraps the connector; each connection it makes carries a [`Usage`] in hyper's
//! connection metadata, which hyper attaches to a failed request's error. [`lost_to_reuse`]
//! reads it: a request on a connection that had carried an earlier one, with no byte of answer,
//! was never seen by the replica's handler and may be sent again on a new connection.
//!
//! The same idea lives in `sluice-loadtest` (`conn.rs`), which depends on no sluice crate, so
//! the two cannot share this code.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::rt::{Read, ReadBuf, ReadBufCursor, Write};
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};

/// Largest read made through the probe buffer while an answer's first byte is awaited.
const PROBE: usize = 8 * 1024;

/// What one connection has carried.
#[derive(Debug, Default)]
struct Counts {
    /// Requests begun on the connection.
    requests: AtomicU32,
    /// Whether a byte arrived since the latest request began.
    answered: AtomicBool,
}

/// A connection's [`Counts`], shared with hyper's error metadata.
#[derive(Debug, Clone, Default)]
pub struct Usage(Arc<Counts>);

/// Whether `err` lost its request to connection reuse: not a connect error, on a connection
/// that had carried an earlier request, with no byte of answer. Such a request is safe to send
/// once more on a new connection.
pub fn lost_to_reuse(err: &hyper_util::client::legacy::Error) -> bool {
    if err.is_connect() {
        return false;
    }
    let Some(info) = err.connect_info() else {
        return false;
    };
    let mut ext = hyper::http::Extensions::new();
    info.get_extras(&mut ext);
    ext.get::<Usage>().is_some_and(|u| {
        u.0.requests.load(Ordering::Acquire) > 1 && !u.0.answered.load(Ordering::Acquire)
    })
}

/// A connector whose connections keep a [`Usage`].
#[derive(Debug, Clone)]
pub struct Counting<C>(pub C);

impl<C> tower::Service<Uri> for Counting<C>
where
    C: tower::Service<Uri>,
    C::Future: Send + 'static,
    C::Response: Connection + Read + Write + Unpin,
{
    type Response = Counted<C::Response>;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, C::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), C::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            Ok(Counted {
                io: connecting.await?,
                usage: Usage::default(),
                waiting: false,
                probe: Vec::new(),
            })
        })
    }
}

/// A connection that keeps its [`Usage`] current.
#[derive(Debug)]
pub struct Counted<T> {
    io: T,
    usage: Usage,
    /// A request was written and no byte of its answer has come.
    waiting: bool,
    probe: Vec<u8>,
}

impl<T> Counted<T> {
    /// A write while no request is waiting begins the next request.
    fn on_write(&mut self) {
        if !self.waiting {
            self.waiting = true;
            self.usage.0.answered.store(false, Ordering::Release);
            self.usage.0.requests.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl<T: Connection> Connection for Counted<T> {
    fn connected(&self) -> Connected {
        self.io.connected().extra(self.usage.clone())
    }
}

impl<T: Read + Unpin> Read for Counted<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.waiting {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        // The cursor cannot say how much a read filled, so the first read of an answer goes
        // through the probe buffer.
        this.probe.resize(buf.remaining().min(PROBE), 0);
        let mut probe = ReadBuf::new(&mut this.probe);
        let polled = Pin::new(&mut this.io).poll_read(cx, probe.unfilled());
        if !probe.filled().is_empty() {
            buf.put_slice(probe.filled());
            this.waiting = false;
            this.usage.0.answered.store(true, Ordering::Release);
        }
        polled
    }
}

impl<T: Write + Unpin> Write for Counted<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.on_write();
        Pin::new(&mut this.io).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.on_write();
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
