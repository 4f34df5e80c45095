//! Real `sluice serve` processes on loopback, for the tests that start replicas and gateways
//! as the binary (`replicas.rs`, `resume.rs`).

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::routing::send;

/// The model directory: `SLUICE_MODEL_DIR`, else the workspace's `models/cache`.
pub fn model_dir() -> PathBuf {
    std::env::var_os("SLUICE_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/cache"))
}

/// A `sluice serve` process, killed when dropped.
pub struct Proc {
    pub child: Child,
    pub url: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `sluice serve ARGS` and reads its URL from the first line it prints (its log goes
/// to the test's stderr with `SLUICE_TEST_LOGS` set).
pub fn spawn<S: AsRef<OsStr>>(args: &[S]) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(if std::env::var_os("SLUICE_TEST_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .expect("the sluice binary starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .strip_prefix("sluice listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .trim()
        .to_string();
    Proc { child, url }
}

/// Waits until `url`'s `/ready` answers 200, failing the test after `within`.
pub async fn wait_ready(url: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(a) = send(url, "GET", "/ready", None, &[]).await {
            if a.status == 200 {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{url} did not become ready");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
