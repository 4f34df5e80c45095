//! `file://PATH`: the replicas listed in a file, and the models of the pool they belong to.
//! Re-read when its modification time or length changes, checked every interval. A file that
//! cannot be read or parsed keeps the last good set; the error is logged once per change, not
//! every tick.
//!
//! Two forms (`sluice-autoscaler run --local` writes them; keep them exactly so):
//!
//! - Lines: one replica URL a line, and `model NAME` lines, one model name each (blank lines
//!   and `#` comments ignored):
//!   ```text
//!   model smollm2-135m-instruct
//!   http://127.0.0.1:8001
//!   ```
//! - JSON: an array of replica URLs, or an object with the pool's model names and its
//!   replicas, either key optional:
//!   ```json
//!   {"models": ["smollm2-135m-instruct"], "replicas": ["http://127.0.0.1:8001"]}
//!   ```
//!
//! The models are known even when no replica is listed (a pool at zero): the gateway lists
//! them and holds their requests until a replica is ready.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::DiscoveryError;
use crate::router::remote::ReplicaUrl;
use crate::router::Router;

/// What an announce file says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Announce {
    pub replicas: BTreeSet<ReplicaUrl>,
    pub models: BTreeSet<String>,
}

/// The JSON object form.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnnounceJson {
    #[serde(default)]
    models: Vec<String>,
    #[serde(default)]
    replicas: Vec<String>,
}

/// Parses an announce file (either form).
pub fn parse(path: &Path, text: &str) -> Result<Announce, DiscoveryError> {
    let format = |message: String| DiscoveryError::FileFormat {
        path: path.to_path_buf(),
        message,
    };
    let trimmed = text.trim_start();
    let (entries, models): (Vec<String>, Vec<String>) = if trimmed.starts_with('[') {
        let urls = serde_json::from_str(trimmed)
            .map_err(|e| format(format!("not a JSON list of URLs: {e}")))?;
        (urls, Vec::new())
    } else if trimmed.starts_with('{') {
        let a: AnnounceJson = serde_json::from_str(trimmed).map_err(|e| {
            format(format!(
                "not a JSON object of \"models\" and \"replicas\": {e}"
            ))
        })?;
        (a.replicas, a.models)
    } else {
        let lines = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty());
        let (models, urls): (Vec<&str>, Vec<&str>) =
            lines.partition(|l| l.starts_with("model ") || l.starts_with("model\t"));
        let models = models.iter().map(|l| l[5..].trim().to_string()).collect();
        (urls.into_iter().map(str::to_string).collect(), models)
    };
    if let Some(bad) = models
        .iter()
        .find(|m| m.is_empty() || m.contains(char::is_whitespace))
    {
        return Err(format(format!("'{bad}' is not a model name")));
    }
    let replicas = entries
        .iter()
        .map(|e| ReplicaUrl::parse(e).map_err(&format))
        .collect::<Result<_, _>>()?;
    Ok(Announce {
        replicas,
        models: models.into_iter().collect(),
    })
}

/// Reads and parses the file.
pub fn read(path: &Path) -> Result<Announce, DiscoveryError> {
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
            Ok(a) => {
                router.set_source_models(slot, a.models);
                super::report(&router, slot, a.replicas);
            }
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
        assert_eq!(json.replicas.len(), 2);
        assert!(json.models.is_empty());
        assert_eq!(parse(p, "").unwrap(), Announce::default());
        let e = parse(p, "http://a:1\nftp://b\n").unwrap_err().to_string();
        assert!(e.contains("ftp://b") && e.starts_with("replicas"), "{e}");
        assert!(parse(p, "[1, 2]").is_err());
    }

    #[test]
    fn models_are_announced_in_both_forms_with_or_without_replicas() {
        let p = Path::new("pool");
        let lines = parse(p, "model a\nmodel b # second\nhttp://x:1\n").unwrap();
        let json = parse(p, r#"{"models": ["a", "b"], "replicas": ["http://x:1"]}"#).unwrap();
        assert_eq!(lines, json);
        assert_eq!(lines.models, ["a", "b"].map(String::from).into());
        let zero = parse(p, "model a\n").unwrap();
        assert!(zero.replicas.is_empty() && zero.models.len() == 1);
        assert_eq!(parse(p, r#"{"models": ["a"]}"#).unwrap(), zero);
        assert!(parse(p, r#"{"model": ["a"]}"#).is_err());
        assert!(parse(p, "model \n").is_err());
    }
}
