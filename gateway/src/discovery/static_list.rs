//! `--upstream URL`, repeatable: a fixed set, reported once.

use std::sync::Arc;

use crate::router::remote::ReplicaUrl;
use crate::router::Router;

pub fn report(router: &Arc<Router>, slot: usize, urls: Vec<ReplicaUrl>) {
    super::report(router, slot, urls.into_iter().collect());
}
