//! What a request says beside its OpenAI body: its deadline, and the extensions a routing
//! gateway uses with its replicas for mid-stream resumption.
//!
//! - `X-Sluice-Deadline-Ms`: the request's deadline in milliseconds from receipt (a client's,
//!   or the remaining time a routing gateway forwards); without it, the tenant's default.
//! - `X-Sluice-Token-Ids: 1`: every streamed choice carries its `token_ids`, and the chunk that
//!   finishes a choice its `sluice_usage`, so the gateway knows what the client has (the
//!   gateway strips both before the chunk goes on).
//! - `X-Sluice-Resume: 1` with a body field `sluice_resume: {"index", "token_ids"}`: continue
//!   choice `index` of the request from those output tokens (one choice, numbered 0 in the
//!   answer, no opening chunk). Without the header the field is ignored, like any unknown
//!   field. A routing gateway never forwards a client's headers but `Accept`, so only a
//!   gateway can send it; replicas should be reachable from the gateway alone.

use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;

use crate::error::ApiError;
use crate::tenants::Tenant;

/// The request's deadline in milliseconds from receipt.
pub static X_SLUICE_DEADLINE_MS: HeaderName = HeaderName::from_static("x-sluice-deadline-ms");
/// Asks a replica for token ids and per-choice usage in its stream.
pub static X_SLUICE_TOKEN_IDS: HeaderName = HeaderName::from_static("x-sluice-token-ids");
/// Marks a continuation request (the body's `sluice_resume` applies).
pub static X_SLUICE_RESUME: HeaderName = HeaderName::from_static("x-sluice-resume");

/// The request's deadline: the header's, else the tenant's default, counted from `received`.
pub fn deadline(
    headers: &HeaderMap,
    tenant: &Tenant,
    received: Instant,
) -> Result<Option<Instant>, ApiError> {
    let ms = match headers.get(&X_SLUICE_DEADLINE_MS) {
        Some(v) => Some(parse_ms(v)?),
        None => tenant.deadline_ms,
    };
    Ok(ms.map(|ms| received + Duration::from_millis(ms)))
}

fn parse_ms(v: &HeaderValue) -> Result<u64, ApiError> {
    let ms = v
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0);
    ms.ok_or_else(|| ApiError::BadRequest {
        message: format!(
            "The header X-Sluice-Deadline-Ms must be a whole number of milliseconds > 0, \
             not '{}'",
            String::from_utf8_lossy(v.as_bytes())
        ),
        param: Some("X-Sluice-Deadline-Ms".into()),
        code: None,
    })
}

/// The header forwarding what is left of `deadline` (at least 1 ms: a passed deadline is the
/// replica's to report, and 0 would be refused).
pub fn remaining_header(deadline: Instant) -> (HeaderName, HeaderValue) {
    let left = deadline.saturating_duration_since(Instant::now());
    let ms = (left.as_millis() as u64).max(1);
    (X_SLUICE_DEADLINE_MS.clone(), HeaderValue::from(ms))
}

/// A continuation: which choice, and its output so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ResumeSpec {
    /// The choice in the original request's numbering (`prompt · n + choice`).
    pub index: usize,
    pub token_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct ResumeField {
    sluice_resume: Option<ResumeSpec>,
}

/// What a request asks of the replica beside its OpenAI body.
#[derive(Debug, Clone, Default)]
pub struct Internal {
    /// Stream token ids and per-choice usage.
    pub token_ids: bool,
    pub resume: Option<ResumeSpec>,
}

impl Internal {
    /// Reads the headers, and the body's `sluice_resume` when the resume header is set.
    pub fn of(headers: &HeaderMap, body: &[u8]) -> Result<Self, ApiError> {
        let on = |h: &HeaderName| headers.get(h).is_some_and(|v| v.as_bytes() == b"1");
        let resume = if on(&X_SLUICE_RESUME) {
            let field: ResumeField = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad(format!("sluice_resume: {e}"), "sluice_resume"))?;
            let spec = field
                .sluice_resume
                .ok_or_else(|| ApiError::bad("sluice_resume is missing", "sluice_resume"))?;
            Some(spec)
        } else {
            None
        };
        Ok(Self {
            token_ids: on(&X_SLUICE_TOKEN_IDS),
            resume,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert((*k).clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_header_wins_over_the_tenant_default_and_bad_values_name_it() {
        let now = Instant::now();
        let mut t = Tenant::anonymous();
        assert_eq!(deadline(&HeaderMap::new(), &t, now).unwrap(), None);
        t.deadline_ms = Some(2000);
        let d = deadline(&HeaderMap::new(), &t, now).unwrap();
        assert_eq!(d, Some(now + Duration::from_secs(2)));
        let h = headers(&[(&X_SLUICE_DEADLINE_MS, "250")]);
        assert_eq!(
            deadline(&h, &t, now).unwrap(),
            Some(now + Duration::from_millis(250))
        );
        for bad in ["soon", "-5", "0", "1.5"] {
            let h = headers(&[(&X_SLUICE_DEADLINE_MS, bad)]);
            let e = deadline(&h, &t, now).unwrap_err();
            assert_eq!(e.status(), 400);
            assert!(e.to_string().contains("X-Sluice-Deadline-Ms"), "{e}");
        }
    }

    #[test]
    fn the_resume_field_counts_only_with_its_header() {
        let body = br#"{"model": "m", "sluice_resume": {"index": 2, "token_ids": [5, 6]}}"#;
        assert_eq!(Internal::of(&HeaderMap::new(), body).unwrap().resume, None);
        let h = headers(&[(&X_SLUICE_RESUME, "1"), (&X_SLUICE_TOKEN_IDS, "1")]);
        let i = Internal::of(&h, body).unwrap();
        assert!(i.token_ids);
        assert_eq!(
            i.resume,
            Some(ResumeSpec {
                index: 2,
                token_ids: vec![5, 6]
            })
        );
    }
}
