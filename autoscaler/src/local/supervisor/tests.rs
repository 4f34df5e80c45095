//! The supervisor against fake replicas: small scripts standing in for `sluice serve` (a
//! Python HTTP server that prints sluice's listening line and answers `/ready`, or shell
//! scripts that fail in chosen ways). What the fakes leave out: models, requests, draining
//! (a fake exits at once on SIGTERM, or never).

use std::os::unix::fs::PermissionsExt;

use super::*;

const FAKE_REPLICA: &str = r#"#!/usr/bin/env python3
import http.server, sys
a = sys.argv[1:]
host, port = a[a.index('--host') + 1], int(a[a.index('--port') + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path in ('/ready', '/metrics') else 404)
        self.send_header('content-length', '0')
        self.end_headers()
    def log_message(self, *args):
        pass
srv = http.server.HTTPServer((host, port), H)
print(f"sluice listening on http://{host}:{srv.server_address[1]}", flush=True)
srv.serve_forever()
"#;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("sluice-sup-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

fn script(d: &Dir, name: &str, text: &str) -> PathBuf {
    let p = d.0.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// `s.start()`, retried while Linux refuses to run the script because a file descriptor open
/// for writing it still exists (`ETXTBSY`): a child that another test forked while `script`
/// was writing the file inherits that descriptor until it execs. The race is these tests'
/// (scripts written and run inside one multi-threaded process), not the supervisor's.
fn start(s: &mut Supervisor) -> Result<u64, LocalError> {
    for _ in 0..100 {
        match s.start() {
            Err(LocalError::Spawn { source, .. })
                if source.kind() == std::io::ErrorKind::ExecutableFileBusy =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            started => return started,
        }
    }
    s.start()
}

fn command(d: &Dir, binary: PathBuf, ports: Ports) -> ReplicaCommand {
    ReplicaCommand {
        binary,
        args: vec![],
        host: "127.0.0.1".into(),
        ports,
        log_dir: d.0.join("logs"),
        ready_timeout: Duration::from_secs(20),
        stop_timeout: Duration::from_secs(5),
    }
}

/// Polls until an event arrives (bounded).
async fn next_event(s: &mut Supervisor) -> Event {
    for _ in 0..400 {
        let mut e = s.poll().await;
        if !e.is_empty() {
            return e.remove(0);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no event within 20 s: {:?}", s.replicas());
}

#[tokio::test]
async fn a_replica_starts_is_ready_and_stops_on_sigterm() {
    let d = dir("ok");
    let bin = script(&d, "fake", FAKE_REPLICA);
    let mut s = Supervisor::new(command(&d, bin, Ports::Any)).unwrap();
    let id = start(&mut s).unwrap();
    let Event::Ready { id: rid, url } = next_event(&mut s).await else {
        panic!("expected ready");
    };
    assert_eq!(rid, id);
    assert!(
        url.starts_with("http://127.0.0.1:") && !url.ends_with(":0"),
        "{url}"
    );
    assert_eq!(s.count(|p| *p == Phase::Ready), 1);
    s.drain(id);
    assert!(matches!(s.get(id).unwrap().phase, Phase::Draining { .. }));
    s.terminate(id);
    match next_event(&mut s).await {
        Event::Stopped {
            id: sid,
            killed: false,
            url: Some(u),
            ..
        } => assert_eq!((sid, u), (id, url)),
        e => panic!("expected a stop, got {e:?}"),
    }
    assert!(s.replicas().is_empty(), "reaped");
}

#[tokio::test]
async fn a_replica_that_cannot_start_is_a_failed_start_with_its_log() {
    let d = dir("fail");
    let bin = script(
        &d,
        "fake",
        "#!/bin/sh\necho 'sluice serve: loading /nope.gguf: no such file' >&2\nexit 1\n",
    );
    let mut s = Supervisor::new(command(&d, bin, Ports::Any)).unwrap();
    start(&mut s).unwrap();
    match next_event(&mut s).await {
        Event::StartFailed { reason, .. } => {
            assert!(reason.contains("exited before it was ready"), "{reason}");
            assert!(reason.contains("/nope.gguf: no such file"), "{reason}");
        }
        e => panic!("expected a failed start, got {e:?}"),
    }
    // A binary that does not exist: an error at once, naming it.
    let mut s = Supervisor::new(command(&d, d.0.join("missing"), Ports::Any)).unwrap();
    let e = start(&mut s).unwrap_err().to_string();
    assert!(e.contains("missing"), "{e}");
}

#[tokio::test]
async fn a_replica_never_ready_is_killed_at_the_deadline() {
    let d = dir("slow");
    let bin = script(&d, "fake", "#!/bin/sh\nexec sleep 30\n");
    let mut cmd = command(&d, bin, Ports::Any);
    cmd.ready_timeout = Duration::from_millis(300);
    let mut s = Supervisor::new(cmd).unwrap();
    start(&mut s).unwrap();
    match next_event(&mut s).await {
        Event::StartFailed { reason, .. } => {
            assert!(reason.contains("not ready within"), "{reason}")
        }
        e => panic!("expected a failed start, got {e:?}"),
    }
    assert!(s.replicas().is_empty());
}

#[tokio::test]
async fn a_ready_replica_that_dies_is_reported_as_died() {
    let d = dir("die");
    let bin = script(&d, "fake", FAKE_REPLICA);
    let mut s = Supervisor::new(command(&d, bin, Ports::Any)).unwrap();
    let id = start(&mut s).unwrap();
    assert!(matches!(next_event(&mut s).await, Event::Ready { .. }));
    let pid = s.get(id).unwrap().pid;
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    match next_event(&mut s).await {
        Event::Died {
            id: did, status, ..
        } => {
            assert_eq!(did, id);
            assert!(status.contains("signal: 9"), "{status}");
        }
        e => panic!("expected a death, got {e:?}"),
    }
}

#[tokio::test]
async fn a_replica_ignoring_sigterm_is_killed_after_the_stop_timeout() {
    let d = dir("stubborn");
    let bin = script(
        &d,
        "fake",
        "#!/bin/sh\ntrap '' TERM\necho \"sluice listening on http://127.0.0.1:1\"\nwhile true; do sleep 0.1; done\n",
    );
    let mut cmd = command(&d, bin, Ports::Any);
    cmd.stop_timeout = Duration::from_millis(300);
    let mut s = Supervisor::new(cmd).unwrap();
    let id = start(&mut s).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.terminate(id);
    match next_event(&mut s).await {
        Event::Stopped { killed, status, .. } => {
            assert!(killed, "{status}");
            assert!(status.contains("signal: 9"), "{status}");
        }
        e => panic!("expected a stop, got {e:?}"),
    }
}

#[tokio::test]
async fn ports_in_use_are_skipped_and_a_full_range_is_an_error() {
    let d = dir("ports");
    let bin = script(&d, "fake", FAKE_REPLICA);
    // Two adjacent ports, the first held by someone else.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let p = held.local_addr().unwrap().port();
    let free = std::net::TcpListener::bind(("127.0.0.1", p + 1));
    let Ok(free) = free else {
        return; // the next port happens to be taken too: nothing to learn here
    };
    drop(free);
    let mut s = Supervisor::new(command(&d, bin, Ports::Range(p..=p + 1))).unwrap();
    let id = start(&mut s).unwrap();
    assert_eq!(s.get(id).unwrap().port, Some(p + 1));
    let Event::Ready { url, .. } = next_event(&mut s).await else {
        panic!("expected ready");
    };
    assert_eq!(url, format!("http://127.0.0.1:{}", p + 1));
    // Both ports taken now (one by someone else, one by our replica).
    let e = start(&mut s).unwrap_err().to_string();
    assert!(e.contains(&format!("{p}-{}", p + 1)), "{e}");
    drop(held);
    s.shutdown().await;
    assert!(s.replicas().is_empty());
}

#[test]
fn port_specs_parse() {
    assert_eq!(Ports::parse("0").unwrap(), Ports::Any);
    assert_eq!(
        Ports::parse("9000-9002").unwrap(),
        Ports::Range(9000..=9002)
    );
    for bad in ["x", "9002-9000", "0-5", "1-70000", "9000"] {
        assert!(Ports::parse(bad).is_err(), "{bad}");
    }
}
