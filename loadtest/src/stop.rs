//! Ending a run early, as a user stops a long run with Ctrl-C or a script stops a load it
//! started in the background with SIGTERM: no request is sent after the signal, the ones in
//! flight finish and count, and the report (table, JSON, plot) covers what ran, with a note
//! saying it was cut short. A second signal exits at once, without a report.

use std::sync::Arc;

use tokio::sync::watch;

/// Exit status after a second signal: 128 + SIGINT, as shells report an interrupted command.
const ABORT_STATUS: i32 = 130;

/// A flag every sending loop checks, set once and never cleared. Clones share it.
#[derive(Debug, Clone)]
pub struct Stop(Arc<watch::Sender<bool>>);

impl Default for Stop {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(false)))
    }
}

impl Stop {
    /// Asks every loop sharing this flag to send nothing more.
    pub fn trigger(&self) {
        self.0.send_replace(true);
    }

    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the flag is set (at once if it already is).
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives in `self`, so the channel cannot close while this waits.
        let _ = rx.wait_for(|set| *set).await;
    }

    /// Sets the flag on the first SIGINT or SIGTERM (a message on stderr says what happens
    /// next); the second exits the process. Must run inside a tokio runtime.
    pub fn on_signals(&self) {
        let stop = self.clone();
        tokio::spawn(async move {
            let Ok(mut signals) = Signals::new() else {
                return; // No signal handling here: runs end only by their bounds.
            };
            signals.next().await;
            eprintln!(
                "sluice-loadtest: stopping: no new requests; waiting for those in flight \
                 (signal again to quit at once)"
            );
            stop.trigger();
            signals.next().await;
            eprintln!("sluice-loadtest: quitting without a report");
            std::process::exit(ABORT_STATUS);
        });
    }
}

/// SIGINT and SIGTERM, listened for from creation on (so none is missed between two waits).
#[cfg(unix)]
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn new() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// Ctrl-C, where there are no Unix signals.
#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Self)
    }

    async fn next(&mut self) {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_wake_when_set_and_a_set_flag_does_not_block() {
        let stop = Stop::default();
        assert!(!stop.is_set());
        let waiter = tokio::spawn({
            let stop = stop.clone();
            async move { stop.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        stop.trigger();
        waiter.await.unwrap();
        assert!(stop.is_set());
        stop.wait().await;
    }
}
