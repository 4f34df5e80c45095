//! `file://PATH`: the replicas listed in a file — a JSON array of URLs, or one URL a line
//! (blank lines and `#` comments ignored). Re-read when its modification time or length
//! changes, checked every interval. A file that cannot be read or parsed keeps the last good
//! set; the error is logged once per change, not every tick.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::DiscoveryError;
use crate::router::remote::ReplicaUrl;
use crate::router::Router;

/// Parses a replica list.
pub fn parse(path: &Path, text: &str) -> Result<BTreeSet<ReplicaUrl>, DiscoveryError> {
    let format = |message: String| DiscoveryError::FileFormat {
        path: path.to_path_buf(),
        message,
    };
    let trimmed = text.trim_start();
    let entries: Vec<String> = if trimmed.starts_with('[') {
        serde_json::from_str(trimmed)
            .map_err(|e| format(format!("not a JSON list of URLs: {e}")))?
    } else {
        text.lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    };
    entries
        .iter()
        .map(|e| ReplicaUrl::parse(e).map_err(&format))
        .collect()
}

/// Reads and parses the file.
pub fn read(path: &Path) -> Result<BTreeSet<ReplicaUrl>, DiscoveryError> {
    let text = std::fs::read_to_string(path).map_err(|source| DiscoveryError::File {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &text)
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

pub async fn run(path: PathBuf, router: Arc<Router>, slot: usize, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen: Option<Option<(SystemTime, u64)>> = None;
    loop {
        tick.tick().await;
        let p = path.clone();
        let Ok((now, result)) = tokio::task::spawn_blocking(move || {
            let now = stamp(&p);
            (now, read(&p))
        })
        .await
        else {
            continue;
        };
        if seen == Some(now) {
            continue;
        }
        seen = Some(now);
        match result {
            Ok(set) => super::report(&router, slot, set),
            Err(e) => tracing::warn!("file discovery: {e}; keeping the last set"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_line_lists_parse_and_bad_urls_are_named() {
        let p = Path::new("replicas");
        let json = parse(p, r#"["http://a:1", "http://b:2/"]"#).unwrap();
        let lines = parse(p, "# replicas\nhttp://a:1\n\n  http://b:2  # second\n").unwrap();
        assert_eq!(json, lines);
        assert_eq!(json.len(), 2);
        assert!(parse(p, "").unwrap().is_empty());
        let e = parse(p, "http://a:1\nftp://b\n").unwrap_err().to_string();
        assert!(e.contains("ftp://b") && e.starts_with("replicas"), "{e}");
        assert!(parse(p, "[1, 2]").is_err());
    }
}
