//! Accelerator variants and their performance and price, read from a TOML profile.
//!
//! A profile describes one model served on several variants (an L4 with one GPU per replica,
//! an H100, a tensor-parallel gang of eight). Everything the policy and the simulator know
//! about hardware comes from here, so a profile is the one place to calibrate: the shipped
//! ones cite where each figure comes from.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::capacity::Slo;
use crate::error::{Error, Result};

/// The profiles shipped in `autoscaler/profiles/`, by name.
const BUILT_IN: &[(&str, &str)] = &[
    ("llama-3-8b", include_str!("../../profiles/llama-3-8b.toml")),
    (
        "llama-3-70b",
        include_str!("../../profiles/llama-3-70b.toml"),
    ),
    ("cpu", include_str!("../../profiles/cpu.toml")),
    ("cpu-local", include_str!("../../profiles/cpu-local.toml")),
];

/// One model and the variants it can be served on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Profile {
    pub model: ModelSpec,
    #[serde(rename = "variant")]
    pub variants: Vec<Variant>,
}

/// What the profile says about the model itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelSpec {
    pub name: String,
    /// Longest prompt + output a replica accepts; longer requests are refused.
    pub max_context_tokens: u64,
}

/// One way to serve the model: an accelerator type and how many of them a replica uses.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Variant {
    /// The name Deployments and node pools are keyed by (`nvidia-l4`).
    pub name: String,
    /// Human-readable hardware description.
    pub accelerator: String,
    /// Accelerators one replica holds; more than one makes the replica a gang that must land
    /// on one node, all or nothing.
    pub gpus_per_replica: u32,
    /// Accelerators per node of this variant's node pool.
    pub gpus_per_node: u32,
    /// Memory per replica, for the record (the KV figure below is what the model uses).
    pub gpu_memory_gib: f64,
    pub perf: Perf,
    pub price: Price,
    pub startup: Startup,
}

/// The performance model: a decode step costs `α + β · batch`, prefill runs at a fixed token
/// rate, and chunked prefill shares each step with the decodes up to `max_batched_tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Perf {
    pub itl_alpha_ms: f64,
    pub itl_beta_ms: f64,
    pub prefill_tokens_per_s: f64,
    /// KV-cache capacity of one replica, in tokens.
    pub kv_cache_tokens: u64,
    pub max_num_seqs: u32,
    /// Tokens per step (decodes plus one prefill chunk), as vLLM's `max_num_batched_tokens`.
    pub max_batched_tokens: u32,
}

/// Prices per hour, on demand and Spot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Price {
    pub on_demand_per_gpu_hour: f64,
    /// The host VM around the accelerators, per node (zero where the GPU price includes it).
    pub on_demand_host_per_node_hour: f64,
    pub spot_per_gpu_hour: f64,
    pub spot_host_per_node_hour: f64,
}

/// How long a new replica takes to serve, by phase.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Startup {
    pub node_provision_s: f64,
    pub image_pull_s: f64,
    pub model_load_s: f64,
}

/// How capacity is bought: Spot is cheaper and can be taken back with short notice.
#[derive(
    Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schema",
    schemars(description = "Spot or on-demand capacity.")
)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    #[default]
    OnDemand,
    Spot,
}

impl CapacityType {
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityType::OnDemand => "on-demand",
            CapacityType::Spot => "spot",
        }
    }
}

impl Variant {
    /// Decode step time in seconds at a batch of `batch` running sequences.
    pub fn itl_s(&self, batch: f64) -> f64 {
        (self.perf.itl_alpha_ms + self.perf.itl_beta_ms * batch) / 1000.0
    }

    /// Seconds to the first token of `prompt_tokens` on an idle replica: the prompt runs in
    /// chunks of `min(max_batched_tokens, prompt)` tokens, each step costing the decode step's
    /// fixed part plus the chunk at the prefill rate.
    pub fn alone_ttft_s(&self, prompt_tokens: f64) -> f64 {
        let p = prompt_tokens.max(1.0);
        let chunk = f64::from(self.perf.max_batched_tokens).min(p).max(1.0);
        p * (self.perf.itl_alpha_ms / 1000.0 / chunk + 1.0 / self.perf.prefill_tokens_per_s)
    }

    /// The longest prompt whose first token comes within `ttft_s` on an idle replica (the
    /// inverse of [`Variant::alone_ttft_s`]: `α + p/R` below one chunk, linear above).
    pub fn longest_prompt_within(&self, ttft_s: f64) -> f64 {
        let alpha = self.perf.itl_alpha_ms / 1000.0;
        let rate = self.perf.prefill_tokens_per_s;
        let chunk = f64::from(self.perf.max_batched_tokens).max(1.0);
        if ttft_s <= alpha {
            0.0
        } else if ttft_s <= alpha + chunk / rate {
            (ttft_s - alpha) * rate
        } else {
            ttft_s / (alpha / chunk + 1.0 / rate)
        }
    }

    /// Replicas that fit on one node (gangs never straddle nodes).
    pub fn replicas_per_node(&self) -> u32 {
        self.gpus_per_node / self.gpus_per_replica
    }

    /// Price of one node per hour.
    pub fn node_price_per_hour(&self, capacity: CapacityType) -> f64 {
        let p = &self.price;
        let (gpu, host) = match capacity {
            CapacityType::OnDemand => (p.on_demand_per_gpu_hour, p.on_demand_host_per_node_hour),
            CapacityType::Spot => (p.spot_per_gpu_hour, p.spot_host_per_node_hour),
        };
        gpu * f64::from(self.gpus_per_node) + host
    }

    /// Price of one replica per hour: its GPUs and its share of the host.
    pub fn replica_price_per_hour(&self, capacity: CapacityType) -> f64 {
        self.node_price_per_hour(capacity) / f64::from(self.replicas_per_node())
    }

    /// Seconds from asking for a replica to its serving, on a new node or on one already up.
    pub fn startup_s(&self, new_node: bool) -> f64 {
        let s = &self.startup;
        let node = if new_node { s.node_provision_s } else { 0.0 };
        node + s.image_pull_s + s.model_load_s
    }
}

impl Profile {
    /// The longest prompt some variant serves alone within the SLO: its first token within
    /// the TTFT target, a lone decode within the TPOT target, the prompt within the KV cache
    /// and the context. Longer prompts miss the SLO whatever the fleet.
    pub fn longest_feasible_prompt(&self, slo: &Slo) -> f64 {
        self.variants
            .iter()
            .map(|v| self.longest_prompt_served(v, slo))
            .fold(0.0, f64::max)
    }

    /// The longest prompt a replica of `v` serves alone within the SLO (0 when its lone
    /// decode misses the TPOT target): what its `sluice serve --max-prompt-tokens` would be.
    pub fn longest_prompt_served(&self, v: &Variant, slo: &Slo) -> f64 {
        if v.itl_s(1.0) > slo.tpot_p99_s {
            return 0.0;
        }
        v.longest_prompt_within(slo.ttft_p99_s)
            .min(v.perf.kv_cache_tokens as f64)
            .min(self.model.max_context_tokens as f64)
    }

    /// A built-in profile by name, else a TOML file at that path.
    pub fn load(name_or_path: &str) -> Result<Profile> {
        if let Some((name, text)) = BUILT_IN.iter().find(|(n, _)| *n == name_or_path) {
            return Profile::parse(name, text);
        }
        let path = Path::new(name_or_path);
        if !path.exists() {
            return Err(Error::UnknownProfile(name_or_path.to_string()));
        }
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Profile::parse(name_or_path, &text)
    }

    /// Names of the built-in profiles.
    pub fn built_in_names() -> impl Iterator<Item = &'static str> {
        BUILT_IN.iter().map(|(n, _)| *n)
    }

    /// Parses and checks a profile's text.
    pub fn parse(name: &str, text: &str) -> Result<Profile> {
        let profile: Profile = toml::from_str(text).map_err(|source| Error::ProfileToml {
            name: name.to_string(),
            source,
        })?;
        profile.validate(name)?;
        Ok(profile)
    }

    fn validate(&self, name: &str) -> Result<()> {
        let bad = |v: &Variant, m: &str| {
            Err(Error::ProfileInvalid {
                profile: name.to_string(),
                variant: v.name.clone(),
                message: m.to_string(),
            })
        };
        for v in &self.variants {
            let p = &v.perf;
            if v.gpus_per_replica == 0 || v.gpus_per_node == 0 {
                return bad(v, "GPUs per replica and per node must be at least 1");
            }
            if v.gpus_per_replica > v.gpus_per_node {
                return bad(
                    v,
                    "a replica's GPUs must fit on one node (gangs do not straddle nodes)",
                );
            }
            if !(p.itl_alpha_ms > 0.0 && p.itl_beta_ms >= 0.0 && p.prefill_tokens_per_s > 0.0) {
                return bad(v, "ITL α and prefill rate must be positive, β non-negative");
            }
            if p.kv_cache_tokens == 0 || p.max_num_seqs == 0 || p.max_batched_tokens == 0 {
                return bad(
                    v,
                    "KV tokens, max_num_seqs and max_batched_tokens must be positive",
                );
            }
            if p.max_batched_tokens < p.max_num_seqs {
                return bad(
                    v,
                    "max_batched_tokens must hold one decode token per sequence",
                );
            }
            if v.node_price_per_hour(CapacityType::OnDemand) <= 0.0 {
                return bad(v, "the on-demand price must be positive");
            }
        }
        if self.variants.is_empty() {
            return Err(Error::ProfileInvalid {
                profile: name.to_string(),
                variant: String::new(),
                message: "no variant".into(),
            });
        }
        Ok(())
    }

    /// The variant of that name.
    pub fn variant(&self, name: &str) -> Result<&Variant> {
        self.variants
            .iter()
            .find(|v| v.name == name)
            .ok_or_else(|| Error::UnknownVariant {
                variant: name.to_string(),
                profile: self.model.name.clone(),
                known: self.variant_names().join(", "),
            })
    }

    /// Keeps only the named variants, in the order given.
    pub fn restrict(&self, names: &[String]) -> Result<Profile> {
        let variants = names
            .iter()
            .map(|n| self.variant(n).cloned())
            .collect::<Result<Vec<_>>>()?;
        Ok(Profile {
            model: self.model.clone(),
            variants,
        })
    }

    pub fn variant_names(&self) -> Vec<String> {
        self.variants.iter().map(|v| v.name.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_profiles_parse_and_price_replicas_with_their_host() {
        let p = Profile::load("llama-3-8b").unwrap();
        let l4 = p.variant("nvidia-l4").unwrap();
        assert!((l4.replica_price_per_hour(CapacityType::OnDemand) - 0.842).abs() < 1e-9);
        let h100 = p.variant("nvidia-h100-80gb").unwrap();
        assert!((h100.replica_price_per_hour(CapacityType::OnDemand) - 9.88).abs() < 1e-9);
        let gang = p.variant("nvidia-h100-80gb-x8").unwrap();
        assert_eq!(gang.replicas_per_node(), 1);
        assert!((gang.replica_price_per_hour(CapacityType::OnDemand) - 79.04).abs() < 1e-9);
        // The NIM points the H100 line was drawn through.
        assert!((h100.itl_s(1.0) * 1000.0 - 4.6).abs() < 0.01);
        assert!((h100.itl_s(200.0) * 1000.0 - 12.7).abs() < 0.01);
        let cpu = Profile::load("cpu").unwrap();
        assert_eq!(cpu.variants.len(), 1);
        assert!(l4.startup_s(true) > l4.startup_s(false));
        // The 70B class runs on gangs only, each a whole node, priced per GPU.
        let big = Profile::load("llama-3-70b").unwrap();
        assert_eq!(big.variants.len(), 3);
        for v in &big.variants {
            assert!(
                v.gpus_per_replica >= 2 && v.replicas_per_node() == 1,
                "{}",
                v.name
            );
        }
        let x2 = big.variant("nvidia-h100-80gb-x2").unwrap();
        assert!((x2.replica_price_per_hour(CapacityType::OnDemand) - 19.76).abs() < 1e-9);
    }

    #[test]
    fn invalid_profiles_are_refused_with_the_variant_named() {
        let text = include_str!("../../profiles/cpu.toml")
            .replace("gpus_per_node = 1", "gpus_per_node = 0");
        let err = Profile::parse("broken", &text).unwrap_err();
        assert!(err.to_string().contains("cpu-2core"), "{err}");
        assert!(matches!(
            Profile::load("no-such-profile"),
            Err(Error::UnknownProfile(_))
        ));
        let p = Profile::load("llama-3-8b").unwrap();
        assert!(p.restrict(&["nvidia-t4".into()]).is_err());
        let r = p
            .restrict(&["nvidia-h100-80gb".into(), "nvidia-l4".into()])
            .unwrap();
        assert_eq!(r.variant_names(), ["nvidia-h100-80gb", "nvidia-l4"]);
    }
}
