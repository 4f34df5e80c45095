//! A replica's load as its `/metrics` states it: requests waiting, requests running and KV-cache
//! use, under vLLM's names (which sluice replicas export), vLLM's older KV name, or llama.cpp
//! server's names. The gateway's router scores replicas by it and the autoscaler's scraper
//! reads it, so both read the same names the same way.

use crate::exposition;
use crate::{llamacpp, vllm};

/// Which load figure a series is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadSeries {
    Waiting,
    Running,
    KvUsage,
}

impl LoadSeries {
    /// The load figure `name` carries, if any.
    pub fn of(name: &str) -> Option<LoadSeries> {
        match name {
            vllm::NUM_REQUESTS_WAITING | llamacpp::REQUESTS_DEFERRED => Some(LoadSeries::Waiting),
            vllm::NUM_REQUESTS_RUNNING | llamacpp::REQUESTS_PROCESSING => Some(LoadSeries::Running),
            vllm::KV_CACHE_USAGE_PERC
            | vllm::GPU_CACHE_USAGE_PERC
            | llamacpp::KV_CACHE_USAGE_RATIO => Some(LoadSeries::KvUsage),
            _ => None,
        }
    }
}

/// The load figures one scrape found; `None` where the target exports no such series. Waiting
/// and running are summed over label sets (one per model); KV use takes the fullest cache.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReplicaLoad {
    pub waiting: Option<f64>,
    pub running: Option<f64>,
    /// 0..1
    pub kv_usage: Option<f64>,
}

impl ReplicaLoad {
    /// Reads the load series from Prometheus text. Lines that do not parse are skipped, never
    /// fatal: a replica's one odd line must not hide its load.
    pub fn from_text(text: &str) -> ReplicaLoad {
        let mut load = ReplicaLoad::default();
        let named = exposition::samples_named(text, |name| LoadSeries::of(name).is_some());
        for sample in named.flatten() {
            load.record(sample.name, sample.value);
        }
        load
    }

    /// Counts one sample if `name` is a load series and `value` is finite (a `NaN` gauge says
    /// nothing); returns whether `name` is a load series.
    pub fn record(&mut self, name: &str, value: f64) -> bool {
        let Some(series) = LoadSeries::of(name) else {
            return false;
        };
        if value.is_finite() {
            let add = |slot: &mut Option<f64>| *slot = Some(slot.unwrap_or(0.0) + value);
            match series {
                LoadSeries::Waiting => add(&mut self.waiting),
                LoadSeries::Running => add(&mut self.running),
                LoadSeries::KvUsage => {
                    self.kv_usage = Some(self.kv_usage.unwrap_or(0.0).max(value.clamp(0.0, 1.0)))
                }
            }
        }
        true
    }

    /// Whether the target exported none of the load series.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_none() && self.running.is_none() && self.kv_usage.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_maps_and_others_do_not() {
        assert_eq!(
            LoadSeries::of("vllm:num_requests_waiting"),
            Some(LoadSeries::Waiting)
        );
        assert_eq!(
            LoadSeries::of("llamacpp:requests_processing"),
            Some(LoadSeries::Running)
        );
        assert_eq!(
            LoadSeries::of("vllm:gpu_cache_usage_perc"),
            Some(LoadSeries::KvUsage)
        );
        assert_eq!(LoadSeries::of("vllm:num_requests_waiting_total"), None);
    }

    #[test]
    fn non_finite_values_are_load_series_that_count_nothing() {
        let mut l = ReplicaLoad::default();
        assert!(l.record("vllm:num_requests_running", f64::NAN));
        assert!(l.is_empty());
        assert!(l.record("vllm:kv_cache_usage_perc", 1.5));
        assert_eq!(l.kv_usage, Some(1.0));
        assert!(!l.record("up", 1.0));
    }
}
