//! API keys → tenants: the `--api-keys FILE` format, its validation, and authentication of the
//! `Authorization` header.
//!
//! A tenant is the unit of fairness and of limits: rate limits (`rate_limit`), concurrency caps
//! and fair-share weights (`admission`) are all per tenant, never per key, so a team can rotate
//! keys without losing its share.
//!
//! Only SHA-256 digests of keys are kept in memory, so a heap dump or a `Debug` print never
//! shows a usable key, and the file itself may list digests instead of keys (operators can hand
//! out keys without the gateway's config ever holding them). A presented key is hashed and
//! compared against *every* stored digest in constant time: the time taken says nothing about
//! which digest, or how much of one, matched.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConditionallySelectable, ConstantTimeEq};

/// The tenant every request belongs to when the gateway runs without an API-key file.
pub const ANONYMOUS: &str = "anonymous";

/// One tenant: who it is and what it may use. Holds no secret, so it is safe to log.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// The name requests are attributed to in logs and metrics.
    pub name: String,
    /// Fair-share weight in the admission queue: a tenant with weight 3 gets three times the
    /// permits of one with weight 1 while both are queued. Always finite and > 0.
    pub weight: f64,
    /// Token-bucket capacity (and refill per minute) for requests; `None` = unlimited.
    pub requests_per_minute: Option<u32>,
    /// Token-bucket capacity (and refill per minute) for prompt + completion tokens.
    pub tokens_per_minute: Option<u64>,
    /// At most this many of the tenant's requests hold admission permits at once.
    pub max_concurrent: Option<usize>,
    /// The deadline of the tenant's requests that send no `X-Sluice-Deadline-Ms` header, in
    /// milliseconds from receipt; `None` = no deadline.
    pub deadline_ms: Option<u64>,
}

impl Tenant {
    /// The tenant of an open gateway: weight 1, no limits.
    pub fn anonymous() -> Tenant {
        Tenant {
            name: ANONYMOUS.to_string(),
            weight: 1.0,
            requests_per_minute: None,
            tokens_per_minute: None,
            max_concurrent: None,
            deadline_ms: None,
        }
    }
}

/// Why the API-key file was refused. Every message names the file and, where there is one, the
/// entry (`[[tenants]]` / `[[keys]]` entries are counted from 1, as a reader counts them); no
/// message ever contains a key.
#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    #[error("cannot read API-key file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("API-key file {} is not valid TOML", path.display())]
    Toml {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("API-key file {} is not valid JSON", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("API-key file {}: [[tenants]] entry {entry} has an empty name", path.display())]
    EmptyTenantName { path: PathBuf, entry: usize },
    #[error("API-key file {}: tenant '{name}' is defined twice ([[tenants]] entries {first} and {second})", path.display())]
    DuplicateTenant {
        path: PathBuf,
        name: String,
        first: usize,
        second: usize,
    },
    #[error("API-key file {}: tenant '{name}' has weight {weight}; it must be a finite number > 0", path.display())]
    BadWeight {
        path: PathBuf,
        name: String,
        weight: f64,
    },
    #[error("API-key file {}: tenant '{name}' has {field} = 0; omit the field for no limit", path.display())]
    ZeroLimit {
        path: PathBuf,
        name: String,
        field: &'static str,
    },
    #[error("API-key file {} has no [[keys]] entries; without keys run the gateway open (no --api-keys)", path.display())]
    NoKeys { path: PathBuf },
    #[error("API-key file {}: [[keys]] entry {entry} names unknown tenant '{tenant}'", path.display())]
    UnknownTenant {
        path: PathBuf,
        entry: usize,
        tenant: String,
    },
    #[error("API-key file {}: [[keys]] entry {entry} (tenant '{tenant}') has both `key` and `sha256`; give exactly one", path.display())]
    KeyAndDigest {
        path: PathBuf,
        entry: usize,
        tenant: String,
    },
    #[error("API-key file {}: [[keys]] entry {entry} (tenant '{tenant}') has neither `key` nor `sha256`; give exactly one", path.display())]
    NoKeyOrDigest {
        path: PathBuf,
        entry: usize,
        tenant: String,
    },
    #[error("API-key file {}: [[keys]] entry {entry} (tenant '{tenant}') has an empty `key`", path.display())]
    EmptyKey {
        path: PathBuf,
        entry: usize,
        tenant: String,
    },
    #[error("API-key file {}: [[keys]] entry {entry} (tenant '{tenant}'): `sha256` must be 64 hex digits", path.display())]
    BadDigest {
        path: PathBuf,
        entry: usize,
        tenant: String,
        #[source]
        source: hex::FromHexError,
    },
    #[error("API-key file {}: [[keys]] entry {second} (tenant '{tenant}') is the same key as entry {first}", path.display())]
    DuplicateKey {
        path: PathBuf,
        first: usize,
        second: usize,
        tenant: String,
    },
}

/// Why a request was not authenticated. The messages are OpenAI's 401 wording and never echo
/// what the client sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header, not the `Bearer` scheme, or an empty key.
    #[error("Missing API key: send it as 'Authorization: Bearer KEY'")]
    Missing,
    /// A bearer key that matches no stored digest.
    #[error("Incorrect API key provided")]
    Invalid,
}

impl AuthError {
    /// The reason label for a rejection counter.
    pub fn metric_label(&self) -> &'static str {
        match self {
            AuthError::Missing => "auth_missing",
            AuthError::Invalid => "auth_invalid",
        }
    }
}

/// A stored key: its digest and the index of its tenant in `Tenants::tenants`.
struct StoredKey {
    digest: [u8; 32],
    tenant: u32,
}

/// The tenants and the digests of their keys, fixed at start.
pub struct Tenants {
    tenants: Vec<Arc<Tenant>>,
    /// Empty exactly when the gateway is open (`from_file` refuses a file without keys).
    keys: Vec<StoredKey>,
}

impl fmt::Debug for Tenants {
    /// Digests are not keys, but there is no reason to print them either.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tenants")
            .field("tenants", &self.tenants)
            .field("keys", &self.keys.len())
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    tenants: Vec<RawTenant>,
    #[serde(default)]
    keys: Vec<RawKey>,
}

/// Unknown fields are errors: a misspelt `request_per_minute` silently meaning "no limit" is the
/// kind of mistake this file must not allow.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: String,
    #[serde(default = "default_weight")]
    weight: f64,
    requests_per_minute: Option<u32>,
    tokens_per_minute: Option<u64>,
    max_concurrent: Option<usize>,
    deadline_ms: Option<u64>,
}

fn default_weight() -> f64 {
    1.0
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    key: Option<String>,
    sha256: Option<String>,
    tenant: String,
}

fn sha256(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl Tenants {
    /// No API keys: every request is the tenant [`ANONYMOUS`] (weight 1, no limits).
    pub fn open() -> Tenants {
        Tenants {
            tenants: vec![Arc::new(Tenant::anonymous())],
            keys: Vec::new(),
        }
    }

    /// Reads and validates an API-key file: TOML for `.toml`, JSON for `.json`, otherwise JSON
    /// when the first non-blank character is `{` and TOML else.
    pub fn from_file(path: &Path) -> Result<Tenants, TenantsError> {
        let text = std::fs::read_to_string(path).map_err(|source| TenantsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let json = match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("json") => true,
            Some(e) if e.eq_ignore_ascii_case("toml") => false,
            _ => text.trim_start().starts_with('{'),
        };
        let raw: RawFile = if json {
            serde_json::from_str(&text).map_err(|source| TenantsError::Json {
                path: path.to_path_buf(),
                source,
            })?
        } else {
            toml::from_str(&text).map_err(|source| TenantsError::Toml {
                path: path.to_path_buf(),
                source,
            })?
        };
        Tenants::validate(raw, path)
    }

    fn validate(raw: RawFile, path: &Path) -> Result<Tenants, TenantsError> {
        let (tenants, by_name) = Self::validate_tenants(raw.tenants, path)?;
        if raw.keys.is_empty() {
            return Err(TenantsError::NoKeys {
                path: path.to_path_buf(),
            });
        }
        let mut keys = Vec::with_capacity(raw.keys.len());
        // Duplicate detection at load time may use a map: it runs once, on the operator's file,
        // not on anything a client sends.
        let mut seen: HashMap<[u8; 32], usize> = HashMap::new();
        for (i, k) in raw.keys.into_iter().enumerate() {
            let entry = i + 1;
            let Some(&(_, tenant)) = by_name.get(&k.tenant) else {
                return Err(TenantsError::UnknownTenant {
                    path: path.to_path_buf(),
                    entry,
                    tenant: k.tenant,
                });
            };
            let digest = Self::key_digest(k.key, k.sha256, &k.tenant, entry, path)?;
            if let Some(&first) = seen.get(&digest) {
                return Err(TenantsError::DuplicateKey {
                    path: path.to_path_buf(),
                    first,
                    second: entry,
                    tenant: k.tenant,
                });
            }
            seen.insert(digest, entry);
            keys.push(StoredKey { digest, tenant });
        }
        Ok(Tenants { tenants, keys })
    }

    /// The `[[tenants]]` entries, and each name's entry number and index.
    #[allow(clippy::type_complexity)]
    fn validate_tenants(
        raw: Vec<RawTenant>,
        path: &Path,
    ) -> Result<(Vec<Arc<Tenant>>, HashMap<String, (usize, u32)>), TenantsError> {
        let path = || path.to_path_buf();
        let mut tenants = Vec::with_capacity(raw.len());
        let mut by_name: HashMap<String, (usize, u32)> = HashMap::new();
        for (i, t) in raw.into_iter().enumerate() {
            let entry = i + 1;
            if t.name.trim().is_empty() {
                return Err(TenantsError::EmptyTenantName {
                    path: path(),
                    entry,
                });
            }
            if let Some(&(first, _)) = by_name.get(&t.name) {
                return Err(TenantsError::DuplicateTenant {
                    path: path(),
                    name: t.name,
                    first,
                    second: entry,
                });
            }
            if !(t.weight.is_finite() && t.weight > 0.0) {
                return Err(TenantsError::BadWeight {
                    path: path(),
                    name: t.name,
                    weight: t.weight,
                });
            }
            let zero = if t.requests_per_minute == Some(0) {
                Some("requests_per_minute")
            } else if t.tokens_per_minute == Some(0) {
                Some("tokens_per_minute")
            } else if t.max_concurrent == Some(0) {
                Some("max_concurrent")
            } else if t.deadline_ms == Some(0) {
                Some("deadline_ms")
            } else {
                None
            };
            if let Some(field) = zero {
                return Err(TenantsError::ZeroLimit {
                    path: path(),
                    name: t.name,
                    field,
                });
            }
            by_name.insert(t.name.clone(), (entry, tenants.len() as u32));
            tenants.push(Arc::new(Tenant {
                name: t.name,
                weight: t.weight,
                requests_per_minute: t.requests_per_minute,
                tokens_per_minute: t.tokens_per_minute,
                max_concurrent: t.max_concurrent,
                deadline_ms: t.deadline_ms,
            }));
        }
        Ok((tenants, by_name))
    }

    /// A `[[keys]]` entry's digest: of its key, or as given.
    fn key_digest(
        key: Option<String>,
        sha256_hex: Option<String>,
        tenant: &str,
        entry: usize,
        path: &Path,
    ) -> Result<[u8; 32], TenantsError> {
        let path = || path.to_path_buf();
        let tenant = || tenant.to_string();
        match (key, sha256_hex) {
            (Some(_), Some(_)) => Err(TenantsError::KeyAndDigest {
                path: path(),
                entry,
                tenant: tenant(),
            }),
            (None, None) => Err(TenantsError::NoKeyOrDigest {
                path: path(),
                entry,
                tenant: tenant(),
            }),
            (Some(key), None) if key.is_empty() => Err(TenantsError::EmptyKey {
                path: path(),
                entry,
                tenant: tenant(),
            }),
            (Some(key), None) => Ok(sha256(&key)),
            (None, Some(hex_digest)) => {
                let mut digest = [0u8; 32];
                hex::decode_to_slice(hex_digest.trim(), &mut digest).map_err(|source| {
                    TenantsError::BadDigest {
                        path: path(),
                        entry,
                        tenant: tenant(),
                        source,
                    }
                })?;
                Ok(digest)
            }
        }
    }

    /// Whether the gateway runs without keys (every request is [`ANONYMOUS`]).
    pub fn is_open(&self) -> bool {
        self.keys.is_empty()
    }

    /// Every tenant, in file order (the one anonymous tenant when open).
    pub fn tenants(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.tenants.iter()
    }

    /// The tenant of that name, if any.
    pub fn get(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.tenants.iter().find(|t| t.name == name)
    }

    /// The tenant of a request, from its raw `Authorization` header value.
    ///
    /// Accepts `Bearer KEY` (scheme case-insensitive, whitespace around the value and between
    /// scheme and key ignored). A header without the `Bearer` scheme counts as [`AuthError::Missing`]:
    /// the client did not send a key the way the API asks for one, and the Missing message tells
    /// it how. When open, every request succeeds as [`ANONYMOUS`] and the header is ignored.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Arc<Tenant>, AuthError> {
        if self.is_open() {
            return Ok(self.tenants[0].clone());
        }
        let key = authorization
            .and_then(bearer_key)
            .ok_or(AuthError::Missing)?;
        let presented = sha256(key);
        // Every digest is compared, and the winner is picked with a constant-time select, so
        // neither the position of the matching key nor the number of keys before it shows in
        // the timing. (The digest itself hides how many leading bytes of a guess were right.)
        let mut found = Choice::from(0);
        let mut tenant = 0u32;
        for stored in &self.keys {
            let hit = stored.digest.ct_eq(&presented);
            tenant = u32::conditional_select(&tenant, &stored.tenant, hit);
            found |= hit;
        }
        if bool::from(found) {
            Ok(self.tenants[tenant as usize].clone())
        } else {
            Err(AuthError::Invalid)
        }
    }
}

/// The key of a `Bearer KEY` header value, or `None` when the scheme is not `Bearer` or the key
/// is empty.
fn bearer_key(header: &str) -> Option<&str> {
    let header = header.trim();
    let (scheme, key) = header.split_once(|c: char| c.is_ascii_whitespace())?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let key = key.trim();
    (!key.is_empty()).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A file in a fresh directory under the system temp dir, removed when dropped.
    struct TempFile {
        dir: PathBuf,
        path: PathBuf,
    }

    impl TempFile {
        fn new(name: &str, contents: &str) -> TempFile {
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "sluice-tenants-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(name);
            std::fs::write(&path, contents).unwrap();
            TempFile { dir, path }
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn load(name: &str, contents: &str) -> Result<Tenants, TenantsError> {
        let f = TempFile::new(name, contents);
        Tenants::from_file(&f.path)
    }

    fn hex_of(key: &str) -> String {
        hex::encode(sha256(key))
    }

    const TOML: &str = r#"
[[tenants]]
name = "team-a"
weight = 2.0
requests_per_minute = 600
tokens_per_minute = 100000
max_concurrent = 8
deadline_ms = 1500

[[tenants]]
name = "team-b"

[[keys]]
key = "sk-team-a-1"
tenant = "team-a"

[[keys]]
sha256 = "SHA_B"
tenant = "team-b"
"#;

    fn toml_file() -> String {
        TOML.replace("SHA_B", &hex_of("sk-team-b-1").to_uppercase())
    }

    #[test]
    fn toml_file_loads_tenants_and_both_key_forms() {
        let t = load("keys.toml", &toml_file()).unwrap();
        assert!(!t.is_open());
        let names: Vec<_> = t.tenants().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["team-a", "team-b"]);
        assert_eq!(
            **t.get("team-a").unwrap(),
            Tenant {
                name: "team-a".into(),
                weight: 2.0,
                requests_per_minute: Some(600),
                tokens_per_minute: Some(100_000),
                max_concurrent: Some(8),
                deadline_ms: Some(1500),
            }
        );
        let b = t.get("team-b").unwrap();
        assert_eq!(b.weight, 1.0);
        assert_eq!(
            (b.requests_per_minute, b.tokens_per_minute, b.max_concurrent),
            (None, None, None)
        );

        let a = t.authenticate(Some("Bearer sk-team-a-1")).unwrap();
        assert_eq!(a.name, "team-a");
        // The uppercase-hex digest authenticates the key it was made from.
        let b = t.authenticate(Some("Bearer sk-team-b-1")).unwrap();
        assert_eq!(b.name, "team-b");
    }

    #[test]
    fn json_file_loads_by_extension_and_by_sniffing() {
        let json = format!(
            r#"{{"tenants": [{{"name": "x", "weight": 0.5, "max_concurrent": 2}}],
                "keys": [{{"key": "k1", "tenant": "x"}}, {{"sha256": "{}", "tenant": "x"}}]}}"#,
            hex_of("k2")
        );
        for name in ["keys.json", "keys.conf"] {
            let t = load(name, &json).unwrap();
            let x = t.authenticate(Some("Bearer k1")).unwrap();
            assert_eq!(
                (x.name.as_str(), x.weight, x.max_concurrent),
                ("x", 0.5, Some(2))
            );
            assert_eq!(t.authenticate(Some("Bearer k2")).unwrap().name, "x");
        }
        // Without an extension, TOML is assumed unless the text starts with `{`.
        let t = load(
            "keys",
            "[[tenants]]\nname = 'x'\n[[keys]]\nkey = 'k'\ntenant = 'x'\n",
        )
        .unwrap();
        assert_eq!(t.authenticate(Some("Bearer k")).unwrap().name, "x");
    }

    #[test]
    fn debug_shows_no_digests() {
        let t = load("keys.toml", &toml_file()).unwrap();
        let s = format!("{t:?}");
        assert!(s.contains("team-a") && s.contains("keys: 2"), "{s}");
        assert!(!s.contains(&hex_of("sk-team-b-1")[..16]), "{s}");
        assert!(!s.contains("sk-team-a-1"), "{s}");
    }

    /// Loads `contents` as TOML and returns the error's message.
    fn error_of(contents: &str) -> String {
        let err = load("bad.toml", contents).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("bad.toml"), "message names no file: {msg}");
        msg
    }

    const TENANT_X: &str = "[[tenants]]\nname = \"x\"\n";
    const KEY_X: &str = "[[keys]]\nkey = \"k\"\ntenant = \"x\"\n";

    #[test]
    fn unknown_tenant_is_refused() {
        let msg = error_of(&format!(
            "{TENANT_X}{KEY_X}[[keys]]\nkey = \"k2\"\ntenant = \"y\"\n"
        ));
        assert!(
            msg.contains("entry 2") && msg.contains("unknown tenant 'y'"),
            "{msg}"
        );
    }

    #[test]
    fn duplicate_tenant_is_refused() {
        let msg = error_of(&format!("{TENANT_X}{TENANT_X}{KEY_X}"));
        assert!(
            msg.contains("'x' is defined twice") && msg.contains("1 and 2"),
            "{msg}"
        );
    }

    #[test]
    fn duplicate_keys_are_refused_across_both_forms() {
        let msg = error_of(&format!("{TENANT_X}{KEY_X}{KEY_X}"));
        assert!(
            msg.contains("entry 2") && msg.contains("same key as entry 1"),
            "{msg}"
        );
        let msg = error_of(&format!(
            "{TENANT_X}{KEY_X}[[keys]]\nsha256 = \"{}\"\ntenant = \"x\"\n",
            hex_of("k")
        ));
        assert!(msg.contains("same key as entry 1"), "{msg}");
        assert!(!msg.contains("\"k\""), "{msg}");
    }

    #[test]
    fn bad_weights_are_refused() {
        for w in ["0.0", "-1.0", "inf", "nan"] {
            let msg = error_of(&format!("[[tenants]]\nname = \"x\"\nweight = {w}\n{KEY_X}"));
            assert!(
                msg.contains("tenant 'x' has weight") && msg.contains("> 0"),
                "{msg}"
            );
        }
    }

    #[test]
    fn zero_limits_are_refused() {
        let fields = [
            "requests_per_minute",
            "tokens_per_minute",
            "max_concurrent",
            "deadline_ms",
        ];
        for field in fields {
            let msg = error_of(&format!("[[tenants]]\nname = \"x\"\n{field} = 0\n{KEY_X}"));
            assert!(msg.contains(&format!("'x' has {field} = 0")), "{msg}");
        }
    }

    #[test]
    fn key_entries_need_exactly_one_of_key_and_sha256() {
        let msg = error_of(&format!(
            "{TENANT_X}[[keys]]\nkey = \"k\"\nsha256 = \"{}\"\ntenant = \"x\"\n",
            hex_of("k")
        ));
        assert!(msg.contains("entry 1 (tenant 'x') has both"), "{msg}");
        let msg = error_of(&format!("{TENANT_X}[[keys]]\ntenant = \"x\"\n"));
        assert!(msg.contains("entry 1 (tenant 'x') has neither"), "{msg}");
        let msg = error_of(&format!("{TENANT_X}[[keys]]\nkey = \"\"\ntenant = \"x\"\n"));
        assert!(msg.contains("empty `key`"), "{msg}");
    }

    #[test]
    fn bad_hex_is_refused() {
        let short = &hex_of("k")[..62];
        let bad_char = format!("{}zz", &hex_of("k")[..62]);
        for digest in [short, bad_char.as_str()] {
            let msg = error_of(&format!(
                "{TENANT_X}[[keys]]\nsha256 = \"{digest}\"\ntenant = \"x\"\n"
            ));
            assert!(
                msg.contains("entry 1 (tenant 'x'): `sha256` must be 64 hex"),
                "{msg}"
            );
        }
    }

    #[test]
    fn empty_key_list_and_empty_name_are_refused() {
        let msg = error_of(TENANT_X);
        assert!(msg.contains("no [[keys]] entries"), "{msg}");
        let msg = error_of(&format!("[[tenants]]\nname = \" \"\n{KEY_X}"));
        assert!(
            msg.contains("[[tenants]] entry 1 has an empty name"),
            "{msg}"
        );
    }

    #[test]
    fn syntax_errors_unknown_fields_and_missing_files_name_the_file() {
        let msg = error_of("[[tenants]\n");
        assert!(msg.contains("not valid TOML"), "{msg}");
        let msg = error_of(&format!(
            "[[tenants]]\nname = \"x\"\nrequest_per_minute = 5\n{KEY_X}"
        ));
        assert!(msg.contains("not valid TOML"), "{msg}");
        let err = load("bad.json", "{\"keys\": [}").unwrap_err();
        assert!(matches!(err, TenantsError::Json { .. }), "{err}");
        let missing = std::env::temp_dir().join("sluice-tenants-does-not-exist.toml");
        let err = Tenants::from_file(&missing).unwrap_err();
        assert!(matches!(err, TenantsError::Read { .. }));
        assert!(err
            .to_string()
            .contains("sluice-tenants-does-not-exist.toml"));
    }

    #[test]
    fn bearer_parsing() {
        let t = load("keys.toml", &toml_file()).unwrap();
        for header in [
            "Bearer sk-team-a-1",
            "bearer sk-team-a-1",
            "BEARER sk-team-a-1",
            "  Bearer   sk-team-a-1  ",
            "Bearer\tsk-team-a-1",
        ] {
            assert_eq!(
                t.authenticate(Some(header)).unwrap().name,
                "team-a",
                "{header:?}"
            );
        }
        for header in [
            "sk-team-a-1",
            "Basic sk-team-a-1",
            "Bearer",
            "Bearer   ",
            "",
            "Bearersk-team-a-1",
        ] {
            assert_eq!(
                t.authenticate(Some(header)).unwrap_err(),
                AuthError::Missing,
                "{header:?}"
            );
        }
        assert_eq!(t.authenticate(None).unwrap_err(), AuthError::Missing);
    }

    #[test]
    fn wrong_keys_are_invalid_and_never_echoed() {
        let t = load("keys.toml", &toml_file()).unwrap();
        for key in [
            "sk-team-a-2",
            "sk-team-a-1x",
            "SK-TEAM-A-1",
            &hex_of("sk-team-b-1"),
        ] {
            let err = t.authenticate(Some(&format!("Bearer {key}"))).unwrap_err();
            assert_eq!(err, AuthError::Invalid);
            assert_eq!(err.to_string(), "Incorrect API key provided");
            assert_eq!(err.metric_label(), "auth_invalid");
        }
        assert_eq!(
            AuthError::Missing.to_string(),
            "Missing API key: send it as 'Authorization: Bearer KEY'"
        );
    }

    #[test]
    fn open_mode_admits_everyone_as_anonymous() {
        let t = Tenants::open();
        assert!(t.is_open());
        assert_eq!(t.tenants().count(), 1);
        for header in [None, Some("Bearer whatever"), Some("garbage")] {
            let a = t.authenticate(header).unwrap();
            assert_eq!(*a, Tenant::anonymous());
        }
    }
}
