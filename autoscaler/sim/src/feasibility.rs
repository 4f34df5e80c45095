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

/// Whether a replica of `v`, alone and idle, serves the request within the SLO.
pub fn serves_alone(v: &Variant, max_context: u64, slo: &Slo, r: &Request) -> bool {
    let total = u64::from(r.prompt_tokens) + u64::from(r.output_tokens);
    if total > v.perf.kv_cache_tokens || total > max_context {
        return false;
    }
    let tpot_ok = r.output_tokens <= 1 || v.itl_s(1.0) <= slo.tpot_p99_s;
    tpot_ok && v.alone_ttft_s(f64::from(r.prompt_tokens)) <= slo.ttft_p99_s
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

    /// The default scenario's variants.
    fn l4_and_h100() -> Profile {
        Profile::load("llama-3-8b")
            .unwrap()
            .restrict(&["nvidia-l4".into(), "nvidia-h100-80gb".into()])
            .unwrap()
    }

    #[test]
    fn long_prompts_and_slow_decodes_are_infeasible() {
        let p = l4_and_h100();
        let slo = Slo {
            ttft_p99_s: 2.0,
            tpot_p99_s: 0.1,
        };
        let h100 = p.variant("nvidia-h100-80gb").unwrap();
        // 24k tokens/s with a 4.56 ms step per 2048-token chunk: ~44 µs a token.
        let t = h100.alone_ttft_s(20_000.0);
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

    /// The longest feasible prompt (what a controller divides TTFT attainment by) is the
    /// boundary `feasible` draws, within a token, on both sides of one chunk.
    #[test]
    fn the_longest_feasible_prompt_is_the_feasibility_boundary() {
        let p = l4_and_h100();
        for ttft in [0.05, 0.3, 2.0, 5.0] {
            let slo = Slo {
                ttft_p99_s: ttft,
                tpot_p99_s: 0.1,
            };
            let longest = p.longest_feasible_prompt(&slo);
            assert!(longest > 0.0, "{ttft}");
            let below = longest.floor() as u32;
            assert!(
                feasible(&p, &slo, &req(below.saturating_sub(1), 1)),
                "{ttft}"
            );
            assert!(!feasible(&p, &slo, &req(below + 2, 1)), "{ttft}");
        }
        // Nothing decodes within 1 ms a token: no prompt is feasible.
        let none = Slo {
            ttft_p99_s: 2.0,
            tpot_p99_s: 0.001,
        };
        assert_eq!(p.longest_feasible_prompt(&none), 0.0);
    }
}
