//! Telling a routing gateway which replicas to use: the file its `--discover file://PATH`
//! source re-reads when the file's modification time or length changes
//! (`gateway/src/discovery/file.rs`): one URL a line, `#` comments allowed, then a line
//! `model NAME` for each model the pool serves. The model lines are written whatever the
//! replica count, so at zero replicas the gateway still knows the model and holds its requests
//! (instead of answering 404) while the autoscaler starts a replica.
//!
//! Written atomically — a temporary file in the same directory, flushed to disk, renamed over
//! the old one — so the gateway never reads half a list (a truncated list would make it drop
//! replicas that are serving). The gateway notices by modification time, which Linux file
//! systems keep to the nanosecond; on a file system with coarse times two writes of equal
//! length within one tick could go unnoticed, so each write also carries a generation number.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::LocalError;

/// The discovery file and the generation of its last write.
#[derive(Debug)]
pub struct Announcer {
    path: PathBuf,
    /// The models the pool serves, one `model NAME` line each.
    models: Vec<String>,
    generation: u64,
    last: Option<Vec<String>>,
    /// The last write was [`Announcer::withdraw`]'s.
    withdrawn: bool,
}

impl Announcer {
    pub fn new(path: PathBuf, models: Vec<String>) -> Announcer {
        Announcer {
            path,
            models,
            generation: 0,
            last: None,
            withdrawn: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The URLs last written.
    pub fn current(&self) -> &[String] {
        self.last.as_deref().unwrap_or(&[])
    }

    /// Writes `urls` (sorted) and the model lines unless the file already lists exactly them.
    /// Returns whether it wrote.
    pub fn announce(&mut self, urls: &[String]) -> Result<bool, LocalError> {
        let mut urls = urls.to_vec();
        urls.sort();
        urls.dedup();
        if self.last.as_ref() == Some(&urls) && !self.withdrawn {
            return Ok(false);
        }
        self.write(&urls, true)?;
        self.withdrawn = false;
        Ok(true)
    }

    /// Empties the file, model lines included: the pool is going away, so the gateway should
    /// forget its models rather than hold their requests for a replica that will not come.
    pub fn withdraw(&mut self) -> Result<(), LocalError> {
        self.write(&[], false)?;
        self.withdrawn = true;
        Ok(())
    }

    fn write(&mut self, urls: &[String], models: bool) -> Result<(), LocalError> {
        self.generation += 1;
        let mut text = format!(
            "# replicas of sluice-autoscaler run --local (pid {}), generation {}\n",
            std::process::id(),
            self.generation
        );
        for u in urls {
            text.push_str(u);
            text.push('\n');
        }
        for m in self.models.iter().filter(|_| models) {
            text.push_str(&format!("model {m}\n"));
        }
        write_atomically(&self.path, text.as_bytes())?;
        self.last = Some(urls.to_vec());
        Ok(())
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), LocalError> {
    let io = |source| LocalError::DiscoveryFile {
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_sorted_lists_only_when_they_change_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("sluice-announce-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("replicas");
        let mut a = Announcer::new(path.clone(), Vec::new());
        assert!(a
            .announce(&["http://127.0.0.1:2".into(), "http://127.0.0.1:1".into()])
            .unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        let urls: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(urls, ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        assert!(text.starts_with("# replicas") && text.contains("generation 1"));
        assert!(!a
            .announce(&["http://127.0.0.1:1".into(), "http://127.0.0.1:2".into()])
            .unwrap());
        assert!(a.announce(&[]).unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().filter(|l| !l.starts_with('#')).count(), 0);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "only the file itself");
        std::fs::remove_dir_all(&dir).unwrap();
        // A directory that does not exist: a clear error naming the file.
        let mut bad = Announcer::new(dir.join("missing/replicas"), Vec::new());
        let e = bad.announce(&["http://127.0.0.1:1".into()]).unwrap_err();
        assert!(e.to_string().contains("missing/replicas"), "{e}");
    }

    #[test]
    fn model_lines_stay_at_zero_replicas() {
        let dir = std::env::temp_dir().join(format!("sluice-announce-m-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("replicas");
        let mut a = Announcer::new(path.clone(), vec!["smollm2-135m-instruct".into()]);
        a.announce(&["http://127.0.0.1:1".into()]).unwrap();
        let lines = |p: &Path| -> Vec<String> {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(
            lines(&path),
            ["http://127.0.0.1:1", "model smollm2-135m-instruct"]
        );
        assert!(a.announce(&[]).unwrap());
        assert_eq!(lines(&path), ["model smollm2-135m-instruct"]);
        assert!(a.current().is_empty());
        // Going away: nothing left, not even the model.
        a.withdraw().unwrap();
        assert!(lines(&path).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
