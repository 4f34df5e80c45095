//! The policy over a small trace suite (nine synthetic families, 25 minutes each): its SLO over
//! feasible requests and its cost over the oracle's, per family, held at what it reaches so a
//! change that loses ground fails; and the oracle meets the goal, at no more than static peak
//! where static peak meets it too.

use sluice_policy::profile::Profile;
use sluice_sim::report::Summary;
use sluice_sim::scenario::Scenario;
use sluice_sim::suite::{self, Family, SuiteConfig};

fn get<'a>(s: &'a [(String, Summary)], name: &str) -> &'a Summary {
    &s.iter().find(|(n, _)| n == name).expect("policy ran").1
}

#[test]
fn sluice_holds_its_slo_and_cost_on_a_small_suite() {
    let profile = Profile::load("llama-3-8b")
        .unwrap()
        .restrict(&["nvidia-l4".into(), "nvidia-h100-80gb".into()])
        .unwrap();
    let scn = Scenario::default_for(profile);
    let cfg = SuiteConfig {
        duration_s: 1500.0,
        rate: 12.0,
        seed: 3,
        families: vec![
            Family::Poisson,
            Family::GammaBursts,
            Family::FlashCrowd,
            Family::Diurnal,
            Family::CodeLike,
            Family::Mixture,
            Family::LongPrompts,
            Family::CodeDrift,
            Family::Reasoning,
        ],
        shared: Vec::new(),
        ..SuiteConfig::default()
    };
    let entries = suite::entries(&cfg).unwrap();
    let policies: Vec<String> = ["sluice", "static-peak", "oracle"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let results = suite::run(&scn, &entries, &policies, None).unwrap();
    println!("{}", suite::table(&results));
    // (family, least SLO over feasible requests, most cost × oracle) for sluice: what it
    // reaches, a little slack for rounding. Below the targets (99 %, 1.15×) on bursts
    // of load it cannot see coming (flash crowd, a 25-minute diurnal cycle, the mixture's
    // crowd): the README reports the gap.
    // With late requests yielding in the gateway's queue (first come, first served before):
    // flash-crowd 39.37 → 59.44 %, diurnal 66.02 → 94.96 %, mixture 93.97 → 88.88 % at 1.45×
    // (79.62 % at 1.37× before the attainment margin); code-like's oracle halves (one H100
    // meets 99 % now), so sluice's two H100s are 1.99× it.
    // long-prompts: 94.89 % at 0.98× without the prompt-tail floor, 99.69 % at 1.35× with it.
    // mixture: 1.48 → 1.61× (gamma-bursts 1.68 → 1.71×) with the scale-down window grown to
    // the start-up lead after a cut bought back within it (`payback`), at the same SLO.
    // The burst floor (prompt tokens per second): mixture 88.88 → 99.30 % at 1.61 → 1.38×
    // (its code bursts arrive within seconds), flash-crowd 1.94 → 2.06× (the crowd's seconds
    // hold the fleet for a shape window after it), the rest unchanged.
    // code-drift (bursty code under a drifting level) came with no scale-down on a rise:
    // 99.99 % at 1.26× (static peak 1.13×); on the 1 h suite it falls short (README).
    // KV sized for the running sequences' length-biased outputs (`Workload::output_cv2`):
    // reasoning 95.57 → 100 % at 1.26 → 1.49×; mixture 1.38 → 1.50× at the same 99.30 % (its
    // crowd of long outputs spreads the window's outputs, and the cache holds fewer).
    // Warmed up on the opening forward and mirrored (`sim::warm`) instead of starting from
    // the fleet sized for the busiest window of the first start-up lead: gamma-bursts 1.71 →
    // 1.99× (two H100s held from the cut), reasoning 100 → 96.84 % at 1.49 → 1.43× (the trace
    // opens at the trough of its 25-minute swing: the old start had the ramp's fleet
    // ready, now the policy meets the ramp as at any trough).
    // The forecast and headroom held to 1.4× a rate seen over a lead ago (`ceiling`): mixture
    // 1.51 → 1.39×, reasoning 1.43 → 1.27×, code-drift 1.25 → 1.21×, at the same SLO.
    let held: &[(&str, f64, f64)] = &[
        ("poisson", 0.99, 1.4),
        ("gamma-bursts", 0.99, 2.05),
        ("flash-crowd", 0.59, 2.1),
        ("diurnal", 0.94, 1.4),
        ("code-like", 0.99, 2.05),
        ("mixture", 0.99, 1.45),
        ("long-prompts", 0.99, 1.45),
        ("code-drift", 0.99, 1.3),
        ("reasoning", 0.96, 1.35),
    ];
    for r in &results {
        let oracle = get(&r.summaries, "oracle");
        let peak = get(&r.summaries, "static-peak");
        let sluice = get(&r.summaries, "sluice");
        assert!(
            oracle.slo_attainment >= 0.99,
            "{}: oracle {}",
            r.trace,
            oracle.slo_attainment
        );
        assert!(
            peak.slo_attainment < 0.99 || oracle.cost_usd <= peak.cost_usd + 1e-9,
            "{}: oracle ${:.2} above static peak ${:.2}",
            r.trace,
            oracle.cost_usd,
            peak.cost_usd
        );
        let &(_, slo, ratio) = held.iter().find(|h| h.0 == r.trace).expect("listed");
        assert!(
            sluice.slo_attainment >= slo,
            "{}: sluice SLO {}",
            r.trace,
            sluice.slo_attainment
        );
        let x = sluice.cost_vs_oracle.expect("oracle ran");
        assert!(x <= ratio, "{}: sluice {x:.2}× oracle", r.trace);
    }
}
