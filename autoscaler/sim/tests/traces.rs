//! Every policy over the sample traces in `../shared/data/traces`, with the default scenario.
//! The traces must be there: a missing file fails the test, it does not skip it.

use std::path::PathBuf;

use sluice_policy::profile::Profile;
use sluice_sim::report::{self, Summary};
use sluice_sim::scenario::{self, Scenario, POLICIES};
use sluice_sim::trace;

fn traces() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/traces")
}

fn run(file: &str, rate_scale: f64) -> Vec<(String, Summary)> {
    let path = traces().join(file);
    assert!(
        path.exists(),
        "{} is missing: the sample traces live in ../shared/data/traces",
        path.display()
    );
    let profile = Profile::load("llama-3-8b")
        .unwrap()
        .restrict(&["nvidia-l4".into(), "nvidia-h100-80gb".into()])
        .unwrap();
    let mut scn = Scenario::default_for(profile);
    scn.rate_scale = rate_scale;
    let requests =
        trace::scale(&trace::load(&path).unwrap(), scn.rate_scale, scn.sim.seed).unwrap();
    let names: Vec<String> = POLICIES.iter().map(|s| s.to_string()).collect();
    let prepared = scenario::prepare(&scn, &requests, &names).unwrap();
    let runs = scenario::run_all(&scn, &requests, prepared);
    let mut out: Vec<(String, Summary)> = runs
        .iter()
        .map(|r| (r.policy.clone(), report::summarise(r, &scn.slo, scn.goal)))
        .collect();
    report::relate_to_oracle(&mut out);
    for r in &runs {
        assert_eq!(
            r.outcomes.len(),
            requests.len(),
            "{}: every request accounted for",
            r.policy
        );
    }
    out
}

fn get<'a>(s: &'a [(String, Summary)], name: &str) -> &'a Summary {
    &s.iter().find(|(n, _)| n == name).unwrap().1
}

#[test]
fn azure_default_scenario_ranks_the_policies() {
    let s = run("azure-llm-2023-conv.csv", 4.0);
    let sluice = get(&s, "sluice");
    let oracle = get(&s, "oracle");
    let hpa_cpu = get(&s, "hpa-cpu");
    let hpa_conc = get(&s, "hpa-concurrency");
    let peak = get(&s, "static-peak");
    // The capacity model's policies meet the SLO; CPU-driven HPA cannot see the load.
    assert!(
        oracle.slo_attainment >= 0.99,
        "oracle {}",
        oracle.slo_attainment
    );
    assert!(
        peak.slo_attainment >= 0.99,
        "static-peak {}",
        peak.slo_attainment
    );
    assert!(
        sluice.slo_attainment >= 0.99,
        "sluice {}",
        sluice.slo_attainment
    );
    // (With late requests yielding in the gateway's queue, even a fleet far too small serves
    // its capacity's share on time: 66 %, against 7.8 % first come, first served.)
    assert!(
        hpa_cpu.slo_attainment < 0.8,
        "hpa-cpu {}",
        hpa_cpu.slo_attainment
    );
    // The oracle is the floor among the policies that meet the SLO; sluice beats HPA on
    // concurrency and the static fleet.
    for (name, x) in &s {
        if x.slo_attainment >= 0.99 {
            assert!(
                x.cost_usd >= oracle.cost_usd - 1e-9,
                "{name} is cheaper than the oracle"
            );
        }
    }
    assert!(sluice.cost_usd < hpa_conc.cost_usd && sluice.cost_usd < peak.cost_usd);
    // The goal on this trace is within 15 % of the oracle's cost. Against the searched
    // schedule (a floor, not a window-average sizing) sluice sits at 1.32× ($25.33; $25.08
    // when it started from the fleet sized for the opening's busiest window instead of its
    // own warm-up, `sim::warm`): held here so it does not drift further while the gap is
    // closed.
    assert!(
        sluice.cost_usd <= 1.32 * oracle.cost_usd,
        "sluice ${:.2} vs oracle ${:.2}",
        sluice.cost_usd,
        oracle.cost_usd
    );
}

#[test]
fn mooncake_runs_every_policy_and_cpu_blind_hpa_falls_behind() {
    let s = run("mooncake-synthetic.jsonl", 1.0);
    // Prompts average ~15k tokens: the longest cannot meet a 2 s TTFT on any variant and are
    // infeasible; of the rest, sluice serves the SLO's 99 %. Its misses with nothing queued
    // come from long prompts ahead of shorter ones in each H100's own prefill, which only the
    // attainment over feasible requests shows (the p99 is past the target whatever the
    // fleet): 98.56 % before the planning margin answered it. Warmed up on its own opening
    // (`sim::warm`): 99.12 → 99.44 % at 1.03 → 1.10×.
    let oracle = get(&s, "oracle");
    let sluice = get(&s, "sluice");
    assert!(
        oracle.slo_attainment >= 0.99,
        "oracle {}",
        oracle.slo_attainment
    );
    assert!(
        sluice.slo_attainment >= 0.99,
        "sluice {}",
        sluice.slo_attainment
    );
    assert!(
        sluice.cost_usd <= 1.11 * oracle.cost_usd,
        "{} vs {}",
        sluice.cost_usd,
        oracle.cost_usd
    );
    assert!(get(&s, "hpa-cpu").slo_attainment < sluice.slo_attainment - 0.2);
}
