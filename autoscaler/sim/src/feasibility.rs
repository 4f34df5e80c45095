//! Which requests any fleet could serve within the SLO at all.
//!
//! A request is feasible when at least one variant, holding it alone on an idle replica, would
//! meet both targets: it fits the variant's KV cache and the model's context, its prefill alone
//! (chunked, by the simulator's step model) ends within the TTFT target, and a batch of one
//! decodes within the TPOT target. No scaling decision changes the outcome of an infeasible
//! request, so attainment is reported over feasible requests, with raw attainment beside it.

use sluice_policy::capacity::Slo;
use sluice_policy::profile::{Profile, Variant};
use sluice_policy::timeline::Request;

/// Seconds to the first token of `prompt_tokens` on an idle replica of `v`: the simulator runs
/// a lone prompt in chunks of `min(max_batched_tokens, prompt)` tokens, each step costing the
/// decode step's fixed part plus the chunk at the prefill rate.
pub fn alone_ttft_s(v: &Variant, prompt_tokens: u32) -> f64 {
    let p = f64::from(prompt_tokens.max(1));
    let chunk = f64::from(v.perf.max_batched_tokens).min(p).max(1.0);
    let alpha = v.perf.itl_alpha_ms / 1000.0;
    p * (alpha / chunk + 1.0 / v.perf.prefill_tokens_per_s)
}

/// Whether a replica of `v`, alone and idle, serves the request within the SLO.
pub fn serves_alone(v: &Variant, max_context: u64, slo: &Slo, r: &Request) -> bool {
    let total = u64::from(r.prompt_tokens) + u64::from(r.output_tokens);
    if total > v.perf.kv_cache_tokens || total > max_context {
        return false;
    }
    let tpot_ok = r.output_tokens <= 1 || v.itl_s(1.0) <= slo.tpot_p99_s;
    tpot_ok && alone_ttft_s(v, r.prompt_tokens) <= slo.ttft_p99_s
}

/// Whether any variant of the profile serves the request alone within the SLO.
pub fn feasible(profile: &Profile, slo: &Slo, r: &Request) -> bool {
    profile
        .variants
        .iter()
        .any(|v| serves_alone(v, profile.model.max_context_tokens, slo, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(prompt_tokens: u32, output_tokens: u32) -> Request {
        Request {
            arrival_s: 0.0,
            prompt_tokens,
            output_tokens,
        }
    }

    #[test]
    fn long_prompts_and_slow_decodes_are_infeasible() {
        let p = Profile::load("llama-3-8b")
            .unwrap()
            .restrict(&["nvidia-l4".into(), "nvidia-h100-80gb".into()])
            .unwrap();
        let slo = Slo {
            ttft_p99_s: 2.0,
            tpot_p99_s: 0.1,
        };
        let h100 = p.variant("nvidia-h100-80gb").unwrap();
        // 24k tokens/s with a 4.56 ms step per 2048-token chunk: ~44 µs a token.
        let t = alone_ttft_s(h100, 20_000);
        assert!((t - 20_000.0 * (0.00456 / 2048.0 + 1.0 / 24_000.0)).abs() < 1e-9);
        assert!(feasible(&p, &slo, &req(1_000, 200)));
        assert!(feasible(&p, &slo, &req(40_000, 200)));
        assert!(!feasible(&p, &slo, &req(60_000, 200)));
        // Longer than the model's context.
        assert!(!feasible(&p, &slo, &req(1_000, 1_000_000)));
        // The L4 alone decodes at ~51 ms a token: a 50 ms TPOT target leaves only the H100.
        let tight = Slo {
            ttft_p99_s: 2.0,
            tpot_p99_s: 0.05,
        };
        let l4 = p.variant("nvidia-l4").unwrap();
        assert!(!serves_alone(l4, u64::MAX, &tight, &req(100, 100)));
        assert!(feasible(&p, &tight, &req(100, 100)));
    }
}
