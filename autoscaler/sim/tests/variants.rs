//! sluice over every variant of the Llama-3-8B profile (L4, H100, A100 and an 8-GPU H100
//! node), not just the L4 and H100 the other tests use: with more variants the cheapest mix
//! changes as load grows, and a switch of mix must not leave the fleet short meanwhile.
//!
//! Two failures this guards against: ready replicas of a variant the capacity model rules out
//! for the mean request shape were dropped at once while their replacement took minutes to
//! start (on Mooncake's long prompts six ready H100s went, and every request queued for
//! nine minutes behind the starting 8-GPU node); and a switch of mix mid-ramp cancelled
//! replicas minutes from ready, tick after tick, while the queue grew. And one from a subset
//! of variants: where none meets the TTFT target for the mean prompt.

use std::path::PathBuf;

use sluice_policy::profile::Profile;
use sluice_policy::timeline::Request;
use sluice_sim::report::{self, Summary};
use sluice_sim::scenario::{self, Scenario};
use sluice_sim::suite::{self, Family};
use sluice_sim::trace;

/// sluice and static peak over `requests` on `variants` of the profile (all when empty).
fn run(requests: &[Request], variants: &[&str]) -> Vec<(String, Summary)> {
    run_at(requests, variants, None)
}

/// [`run`] with the TPOT SLO at `tpot_s` when given.
fn run_at(requests: &[Request], variants: &[&str], tpot_s: Option<f64>) -> Vec<(String, Summary)> {
    let mut profile = Profile::load("llama-3-8b").unwrap();
    if variants.is_empty() {
        assert_eq!(profile.variants.len(), 4, "every variant of the profile");
    } else {
        let names: Vec<String> = variants.iter().map(|v| v.to_string()).collect();
        profile = profile.restrict(&names).unwrap();
    }
    let mut scn = Scenario::default_for(profile);
    if let Some(t) = tpot_s {
        scn.slo.tpot_p99_s = t;
    }
    let names: Vec<String> = ["sluice", "static-peak"].map(String::from).to_vec();
    let prepared = scenario::prepare(&scn, requests, &names).unwrap();
    let runs = scenario::run_all(&scn, requests, prepared);
    let out: Vec<(String, Summary)> = runs
        .iter()
        .map(|r| (r.policy.clone(), report::summarise(r, &scn.slo, scn.goal)))
        .collect();
    for (name, s) in &out {
        println!(
            "{name}: {:.2} % of feasible requests in SLO, ${:.2}",
            s.slo_attainment * 100.0,
            s.cost_usd
        );
    }
    out
}

fn slo(summaries: &[(String, Summary)], name: &str) -> f64 {
    summaries
        .iter()
        .find(|(n, _)| n == name)
        .expect("policy ran")
        .1
        .slo_attainment
}

fn mooncake() -> Vec<Request> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/traces/mooncake-synthetic.jsonl");
    assert!(path.exists(), "{} is missing", path.display());
    trace::scale(&trace::load(&path).unwrap(), 1.0, 1).unwrap()
}

#[test]
fn long_prompts_keep_the_ready_fleet_until_the_larger_variant_serves() {
    let s = run(&mooncake(), &[]);
    // Before the fix: 33.9 %.
    assert!(slo(&s, "sluice") >= 0.95, "{}", slo(&s, "sluice"));
}

/// On L4s and A100s no variant meets the TTFT target for Mooncake's mean prompt, so the
/// fleet is sized for TPOT only; prefill must still not be planned near full utilisation,
/// where the shorter prompts queue behind the long ones.
#[test]
fn sized_for_tpot_only_the_prompts_still_get_prefill_capacity() {
    let s = run(&mooncake(), &["nvidia-l4", "nvidia-a100-80gb"]);
    // Before the fix: 71.4 %, against static peak's 99 %.
    assert!(slo(&s, "sluice") >= 0.97, "{}", slo(&s, "sluice"));
}

#[test]
fn a_ramp_across_a_switch_of_mix_keeps_the_replicas_on_their_way() {
    let requests = suite::generate(Family::Diurnal, 4, 3600.0, 15.0);
    let s = run(&requests, &[]);
    // Before the fix: 78.4 %; static peak, sized with hindsight, holds 100 %.
    assert!(slo(&s, "sluice") >= 0.95, "{}", slo(&s, "sluice"));
}

/// Sessions at 15 req/s with twenty idle minutes between, on L4s and A100s: an A100 serves
/// ~4.5 req/s, so staying warm means keeping several, sized for the rate the sessions come
/// back at (their peak, not a mean the emptying window drags down) and held while the window
/// refills after each return.
#[test]
fn idle_gaps_keep_enough_small_replicas_warm_for_the_sessions_return() {
    let requests = suite::generate(Family::IdleGaps, 8, 3600.0, 15.0);
    let s = run(&requests, &["nvidia-l4", "nvidia-a100-80gb"]);
    // One warm A100: 36.6 %; kept for a mean rate and released on the return: 68.8 %.
    assert!(slo(&s, "sluice") >= 0.99, "{}", slo(&s, "sluice"));
}

/// At a 200 ms TPOT SLO the L4 decodes in time and its capacity per dollar beats the H100's,
/// but ~3 % of conversation prompts are longer than it prefills within the TTFT target even
/// idle: a fleet holding L4s misses them whatever its size. The capacity model rules the L4
/// out for such a shape while a faster variant is on offer.
#[test]
fn a_loose_tpot_slo_does_not_buy_l4s_that_leave_long_prompts_late() {
    let requests = suite::generate(Family::Diurnal, 1, 3600.0, 15.0);
    let s = run_at(&requests, &["nvidia-l4", "nvidia-h100-80gb"], Some(0.2));
    // Before: 97.70 % for 2.0× static peak's cost (66 L4s at the peak, 2 H100s would do).
    assert!(slo(&s, "sluice") >= 0.99, "{}", slo(&s, "sluice"));
    let cost = |n: &str| s.iter().find(|(p, _)| p == n).unwrap().1.cost_usd;
    assert!(cost("sluice") <= 1.1 * cost("static-peak"), "{s:?}");
}
