//! Telling a request lost to keep-alive reuse from a server that failed it.
//!
//! A server closes an idle keep-alive connection when its timeout runs out (or after a number
//! of requests). If the client reuses the connection at that moment, the request is written,
//! the server's close arrives instead of an answer, and hyper reports `IncompleteMessage` (or a
//! reset) like any broken exchange: the client's connection reuse failed, not the server.
//! hyper resends on its own only a request it had not begun to write.
//!
//! [`Tracking`] wraps the connector so that each connection carries a [`ConnUse`]: how many
//! requests were written on it and whether any byte answered the latest one. hyper attaches the
//! connection's metadata to its errors (`Error::connect_info`), so a failed request can ask
//! [`lost_to_reuse`]: was this a reused connection that never answered? Such a request never
//! reached the server's handler and may be sent again on a new connection. Counting happens on
//! the decrypted side of TLS, so a TLS `close_notify` is not taken for an answer.
//!
//! The gateway's router (requests to replicas) and the load tester (requests to the server
//! under test) both use it: one rule for when a failed request may be sent again.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::rt::{Read, ReadBuf, ReadBufCursor, Write};
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};

/// Bytes read through a scratch buffer while waiting for the first byte of an answer: enough
/// for any response head, so the first read of each answer costs one small copy.
const FIRST_READ: usize = 16 * 1024;

/// What one connection has carried, shared between the connection and hyper's error metadata.
#[derive(Debug, Default)]
struct Usage {
    /// Requests whose writing began on this connection.
    requests: AtomicU32,
    /// Whether any byte arrived after the latest request began.
    answered: AtomicBool,
}

/// A connection's [`Usage`], as hyper hands it back in a request's extensions.
#[derive(Debug, Clone, Default)]
pub struct ConnUse(Arc<Usage>);

impl ConnUse {
    /// Requests written on the connection so far, the current one included.
    pub fn requests(&self) -> u32 {
        self.0.requests.load(Ordering::Acquire)
    }

    /// Whether any byte answered the latest request.
    pub fn answered(&self) -> bool {
        self.0.answered.load(Ordering::Acquire)
    }
}

/// Whether `err` is a request lost to connection reuse: it failed on a connection that had
/// carried an earlier request, and no byte answered it. Such a request is safe to send again on a
/// new connection; the server never began an answer.
pub fn lost_to_reuse(err: &hyper_util::client::legacy::Error) -> bool {
    if err.is_connect() {
        return false;
    }
    let Some(info) = err.connect_info() else {
        return false;
    };
    let mut ext = hyper::http::Extensions::new();
    info.get_extras(&mut ext);
    ext.get::<ConnUse>()
        .is_some_and(|u| u.requests() >= 2 && !u.answered())
}

/// A connector whose connections count their requests and answers (see the module doc).
#[derive(Debug, Clone)]
pub struct Tracking<C>(pub C);

impl<C> tower_service::Service<Uri> for Tracking<C>
where
    C: tower_service::Service<Uri>,
    C::Future: Send + 'static,
    C::Response: Connection + Read + Write + Unpin,
{
    type Response = Tracked<C::Response>;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, C::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), C::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            let io = connecting.await?;
            Ok(Tracked {
                io,
                usage: ConnUse::default(),
                awaiting: false,
                scratch: Vec::new(),
            })
        })
    }
}

/// A connection that keeps its [`ConnUse`] up to date.
#[derive(Debug)]
pub struct Tracked<T> {
    io: T,
    usage: ConnUse,
    /// A request began and no byte of its answer has arrived yet.
    awaiting: bool,
    scratch: Vec<u8>,
}

impl<T> Tracked<T> {
    /// The first write after an answer (or on a new connection) begins a request.
    fn begin_write(&mut self) {
        if !self.awaiting {
            self.awaiting = true;
            self.usage.0.answered.store(false, Ordering::Release);
            self.usage.0.requests.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl<T: Connection> Connection for Tracked<T> {
    fn connected(&self) -> Connected {
        self.io.connected().extra(self.usage.clone())
    }
}

impl<T: Read + Unpin> Read for Tracked<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.awaiting {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        // Waiting for an answer: read through the scratch buffer to see whether bytes came.
        let want = buf.remaining().min(FIRST_READ);
        this.scratch.resize(want, 0);
        let mut scratch = ReadBuf::new(&mut this.scratch);
        let polled = Pin::new(&mut this.io).poll_read(cx, scratch.unfilled());
        let got = scratch.filled();
        if !got.is_empty() {
            buf.put_slice(got);
            this.awaiting = false;
            this.usage.0.answered.store(true, Ordering::Release);
        }
        polled
    }
}

impl<T: Write + Unpin> Write for Tracked<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.begin_write();
        Pin::new(&mut this.io).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.begin_write();
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
