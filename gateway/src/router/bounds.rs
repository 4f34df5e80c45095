//! Prompt bounds in routing: which replicas take a prompt of a given length, and what a
//! replica's refusal of one as too long teaches.
//!
//! A replica lists the longest prompt it takes on `/v1/models`: its `--max-prompt-tokens`
//! (the longest it prefills within its latency target; an L4 a tenth of what an H100 does) or
//! else its context. A mixed pool then has replicas of one model with different bounds, and a
//! prompt one refuses another serves in time. The router sends each request only to replicas
//! whose bound takes its prompt's estimated tokens (the proxied prompt is not tokenised:
//! bytes / 4); while none does, to those that take the longest prompts, which refuse it with
//! the clearest answer if the estimate was right. An estimate that ran short is caught by the
//! replica, which tokenises: its 400 `context_length_exceeded` is retried, before anything
//! reached the client, on a replica that takes longer prompts, the request now known to be
//! longer than the refusing replica's bound. The 400 reaches the client only from a replica
//! no other ready one outreaches.
//!
//! With late binding the head of a model's queue waits for a replica that takes its prompt to
//! have room, as a replica's own scheduler holds its line for a long prompt.

use std::sync::Arc;

use bytes::Bytes;
use hyper::header::CONTENT_LENGTH;
use hyper::StatusCode;

use crate::router::remote::ReplicaUrl;
use crate::router::replica::Replica;
use crate::router::Router;

/// The replicas of `pool` that take a prompt of `tokens` tokens of `model`; while none does,
/// those that take the longest prompts. `None` (a request without a prompt): all of them.
pub fn taking<'a>(
    pool: Vec<&'a Arc<Replica>>,
    model: &str,
    tokens: Option<usize>,
) -> Vec<&'a Arc<Replica>> {
    let Some(tokens) = tokens else {
        return pool;
    };
    let reach: Vec<usize> = pool.iter().map(|r| r.longest_prompt(model)).collect();
    // The prompt's length while some replica takes it, else the longest any takes.
    let need = tokens.min(reach.iter().copied().max().unwrap_or(0));
    pool.into_iter()
        .zip(reach)
        .filter(|&(_, reach)| reach >= need)
        .map(|(r, _)| r)
        .collect()
}

impl Router {
    /// Whether another ready replica of `model`, below its concurrency cap, takes longer
    /// prompts than `replica`: a too-long refusal from `replica` is worth retrying there.
    pub(super) fn outreached(&self, model: &str, replica: &Arc<Replica>) -> bool {
        let now = std::time::Instant::now();
        let reach = replica.longest_prompt(model);
        self.replicas().values().any(|r| {
            r.serves(model)
                && r.eligible(now)
                && r.in_flight() < self.config().replica_max_in_flight
                && r.longest_prompt(model) > reach
        })
    }

    /// [`past_bound`] of the replica at `url`.
    pub(super) fn past_bound_of(&self, url: &ReplicaUrl, model: &str) -> Option<usize> {
        past_bound(self.replicas().get(url)?, model)
    }
}

/// The fewest tokens a prompt `replica` refused as too long has: one past its bound; `None`
/// when it reports none.
pub fn past_bound(replica: &Replica, model: &str) -> Option<usize> {
    let longest = replica.longest_prompt(model);
    (longest < usize::MAX).then_some(longest + 1)
}

/// Whether an answer is a refusal of the request as too long for the replica (a 400
/// `context_length_exceeded`, its prompt past the replica's bound or context). Only an
/// error whole in its first frame (its `content-length`) is read; any other answer is
/// passed on as it came.
pub fn refused_as_too_long(head: &hyper::http::response::Parts, first: Option<&Bytes>) -> bool {
    if head.status != StatusCode::BAD_REQUEST {
        return false;
    }
    let Some(first) = first else {
        return false;
    };
    let whole = head
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        == Some(first.len());
    whole
        && serde_json::from_slice::<serde_json::Value>(first)
            .is_ok_and(|v| v["error"]["code"] == "context_length_exceeded")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(status: u16, length: Option<usize>) -> hyper::http::response::Parts {
        let mut b = hyper::Response::builder().status(status);
        if let Some(n) = length {
            b = b.header(CONTENT_LENGTH, n);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn only_a_whole_too_long_refusal_reads_as_one() {
        let refusal = Bytes::from_static(
            br#"{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        );
        let other = Bytes::from_static(
            br#"{"error":{"message":"bad","type":"invalid_request_error","param":"n","code":null}}"#,
        );
        let n = refusal.len();
        assert!(refused_as_too_long(&head(400, Some(n)), Some(&refusal)));
        // Cut across frames, a 422, another code, no body: passed on as they came.
        assert!(!refused_as_too_long(
            &head(400, Some(n + 10)),
            Some(&refusal)
        ));
        assert!(!refused_as_too_long(&head(400, None), Some(&refusal)));
        assert!(!refused_as_too_long(&head(422, Some(n)), Some(&refusal)));
        assert!(!refused_as_too_long(
            &head(400, Some(other.len())),
            Some(&other)
        ));
        assert!(!refused_as_too_long(&head(400, Some(0)), None));
    }
}
