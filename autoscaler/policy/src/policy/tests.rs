//! The sluice policy's behaviour, tick by tick, on hand-made signals.

use super::plan::VariantLimits;
use super::{Policy, Sluice, SluiceConfig};
use crate::capacity::Slo;
use crate::decision::{Decision, Mode, ReasonKind};
use crate::profile::{CapacityType, Profile};
use crate::signals::{Arrivals, Queue, SecondSums, Signals, VariantSignals};

const L4: &str = "nvidia-l4";
const H100: &str = "nvidia-h100-80gb";

fn profile() -> Profile {
    Profile::load("llama-3-8b")
        .unwrap()
        .restrict(&[L4.into(), H100.into()])
        .unwrap()
}

/// A TPOT SLO loose enough for the L4 to be worth something, so the mix has a choice.
fn config() -> SluiceConfig {
    let slo = Slo {
        ttft_p99_s: 2.0,
        tpot_p99_s: 0.2,
    };
    SluiceConfig::new(
        slo,
        vec![VariantLimits::new(L4, 100), VariantLimits::new(H100, 100)],
    )
}

/// Signals at `t` for `rate` requests/s of 1000 + 200 tokens, with the given fleet
/// (variant, capacity, ready, starting).
fn signals(t: f64, rate: f64, waiting: u64, fleet: &[(&str, CapacityType, u32, u32)]) -> Signals {
    Signals {
        time_s: t,
        model: "llama-3-8b".into(),
        arrivals: Arrivals {
            window_s: 60.0,
            requests_per_s: rate,
            prompt_tokens_per_s: rate * 1000.0,
            output_tokens_per_s: rate * 200.0,
            short_window_s: 10.0,
            short_requests_per_s: rate,
            max_prompt_tokens: 1000,
            prompt_tokens_cv2: 0.0,
            output_tokens_cv2: 0.0,
            wide: None,
            per_second: None,
        },
        queue: Queue {
            waiting,
            waiting_prompt_tokens: waiting * 1000,
            running: 0,
        },
        variants: fleet
            .iter()
            .map(|&(v, c, ready, starting)| VariantSignals {
                variant: v.into(),
                capacity: c,
                ready,
                starting,
                ..VariantSignals::default()
            })
            .collect(),
        ..Signals::default()
    }
}

/// Runs the policy at a steady rate for `ticks` ticks, applying each decision as if replicas
/// were ready at once; returns the last decision.
fn settle(p: &mut Sluice, from: f64, ticks: usize, rate: f64) -> Decision {
    settle_with(p, from, ticks, rate, |_| {})
}

/// [`settle`] with each tick's signals changed by `tweak` first.
fn settle_with(
    p: &mut Sluice,
    from: f64,
    ticks: usize,
    rate: f64,
    tweak: impl Fn(&mut Signals),
) -> Decision {
    let mut fleet = vec![
        (L4, CapacityType::OnDemand, 0, 0),
        (H100, CapacityType::OnDemand, 0, 0),
    ];
    let mut d = Decision::default();
    for i in 0..ticks {
        let mut s = signals(from + i as f64 * 15.0, rate, 0, &fleet);
        tweak(&mut s);
        d = p.decide(&s);
        fleet = vec![
            (
                L4,
                CapacityType::OnDemand,
                d.replicas(L4, CapacityType::OnDemand),
                0,
            ),
            (
                H100,
                CapacityType::OnDemand,
                d.replicas(H100, CapacityType::OnDemand),
                0,
            ),
        ];
    }
    d
}

#[test]
fn small_demand_takes_small_replicas_and_large_demand_takes_h100s() {
    let mut p = Sluice::new(profile(), config());
    let small = settle(&mut p, 0.0, 10, 0.5);
    assert!(
        small.replicas_of(L4) >= 1 && small.replicas_of(H100) == 0,
        "{:?}",
        small.targets
    );
    let mut p = Sluice::new(profile(), config());
    let large = settle(&mut p, 0.0, 10, 60.0);
    assert!(large.replicas_of(H100) >= 3, "{:?}", large.targets);
    // The chosen mix covers the planned demand, and the decision says why.
    assert!(large.demand.capacity_requests_per_s >= large.demand.planned_requests_per_s);
    assert!(large.has_reason(ReasonKind::CheapestMix) || large.has_reason(ReasonKind::KeepMix));
    // Pools follow replicas (one GPU per node for both variants).
    let pool = large
        .pools
        .iter()
        .find(|p| p.variant == H100 && p.capacity == CapacityType::OnDemand)
        .unwrap();
    assert_eq!(pool.nodes, large.replicas_of(H100));
}

/// Prompts of 700 tokens on average with cv² 1: ~0.75 % are longer than an idle L4 prefills
/// within the TTFT target, between half the budget for prompts a variant cannot serve in time
/// and all of it. An L4 is not bought for them, but L4s already serving are not ruled out
/// either: a window's fitted tail wobbling across one threshold would cancel and rebuy them.
#[test]
fn a_variant_near_the_slow_prompt_threshold_is_kept_but_not_bought() {
    let shaped = |mean: f64, l4s: u32| {
        let fleet = [
            (L4, CapacityType::OnDemand, l4s, 0),
            (H100, CapacityType::OnDemand, 0, 0),
        ];
        let mut s = signals(0.0, 0.5, 0, &fleet);
        s.arrivals.prompt_tokens_per_s = 0.5 * mean;
        s.arrivals.prompt_tokens_cv2 = 1.0;
        s
    };
    let slo = config().slo;
    let l4 = profile().variant(L4).unwrap().clone();
    let late = |mean: f64| {
        let w = shaped(mean, 0).workload().unwrap();
        crate::capacity::slow_prompt_share(&l4, &w, &slo)
    };
    let budget = crate::capacity::SLOW_PROMPT_BUDGET;
    assert!(
        late(700.0) > budget / 2.0 && late(700.0) < budget,
        "{}",
        late(700.0)
    );
    assert!(late(900.0) > budget, "{}", late(900.0));
    let decide = |mean: f64, l4s: u32| Sluice::new(profile(), config()).decide(&shaped(mean, l4s));
    let ruled_out = |d: &Decision| {
        d.reasons
            .iter()
            .any(|r| r.kind == ReasonKind::Ineligible && r.variant.as_deref() == Some(L4))
    };
    let fresh = decide(700.0, 0);
    assert!(ruled_out(&fresh), "{:?}", fresh.reasons);
    assert_eq!(fresh.replicas_of(L4), 0, "{:?}", fresh.targets);
    let serving = decide(700.0, 1);
    assert!(!ruled_out(&serving), "{:?}", serving.reasons);
    assert!(serving.replicas_of(L4) >= 1, "{:?}", serving.targets);
    assert!(ruled_out(&decide(900.0, 1)));
}

/// Prompts of the same mean with a conversation's spread (cv² 0.9): ~3 % are longer than an
/// idle L4 prefills within the TTFT target, late however many L4s there are, so the mix takes
/// an H100 where equal prompts take L4s (above), and says why.
#[test]
fn an_l4_that_leaves_long_prompts_late_is_not_bought() {
    let mut p = Sluice::new(profile(), config());
    let d = settle_with(&mut p, 0.0, 10, 0.5, |s| s.arrivals.prompt_tokens_cv2 = 0.9);
    assert_eq!(d.replicas(L4, CapacityType::OnDemand), 0, "{:?}", d.targets);
    assert!(
        d.replicas(H100, CapacityType::OnDemand) >= 1,
        "{:?}",
        d.targets
    );
    assert!(
        d.reasons
            .iter()
            .any(|r| r.kind == ReasonKind::Ineligible && r.variant.as_deref() == Some(L4)),
        "{:?}",
        d.reasons
    );
}

#[test]
fn a_queue_spike_panics_scales_up_at_once_and_blocks_scale_down() {
    let mut p = Sluice::new(profile(), config());
    let d = settle(&mut p, 0.0, 30, 20.0);
    let before = d.replicas_of(H100);
    let fleet = [(H100, CapacityType::OnDemand, before, 0)];
    // Arrivals triple over the last ten seconds and a thousand requests queue up.
    let mut s = signals(450.0, 20.0, 1000, &fleet);
    s.arrivals.short_requests_per_s = 60.0;
    let spike = p.decide(&s);
    assert_eq!(spike.mode, Mode::Panic);
    assert!(spike.has_reason(ReasonKind::Panic) && spike.has_reason(ReasonKind::Backlog));
    let grown = spike.replicas_of(H100);
    assert!(grown > before, "{before} → {grown}");
    // The queue drains and the rate halves, but panic holds the fleet for its window.
    let fleet = [(H100, CapacityType::OnDemand, grown, 0)];
    let calm = p.decide(&signals(480.0, 10.0, 0, &fleet));
    assert_eq!(calm.mode, Mode::Panic);
    assert_eq!(calm.replicas_of(H100), grown);
}

#[test]
fn replicas_bought_for_a_drained_backlog_are_not_held_a_window_after_panic() {
    let mut p = Sluice::new(profile(), config());
    let d = settle(&mut p, 0.0, 30, 20.0);
    let before = d.replicas_of(H100);
    // A crowd leaves five thousand requests queued: panic buys for the backlog.
    let mut s = signals(
        450.0,
        20.0,
        5000,
        &[(H100, CapacityType::OnDemand, before, 0)],
    );
    s.arrivals.short_requests_per_s = 60.0;
    let grown = p.decide(&s).replicas_of(H100);
    assert!(grown > before + 2, "{before} → {grown}");
    // The rate is back at once; the queue takes six minutes to drain while the new replicas
    // start, and panic holds the fleet all along.
    let starting = [(H100, CapacityType::OnDemand, before, grown - before)];
    for i in 1..=24 {
        let d = p.decide(&signals(450.0 + f64::from(i) * 15.0, 20.0, 5000, &starting));
        assert_eq!(d.mode, Mode::Panic);
        assert_eq!(d.replicas_of(H100), grown, "tick {i}");
    }
    // The replicas serve and the queue is gone: once panic's window has passed, the fleet
    // follows the demand planned over the stabilisation window, not the fleet panic held.
    let mut fleet = [(H100, CapacityType::OnDemand, grown, 0)];
    let mut last = grown;
    for i in 25..34 {
        let d = p.decide(&signals(450.0 + f64::from(i) * 15.0, 20.0, 0, &fleet));
        last = d.replicas_of(H100);
        fleet = [(H100, CapacityType::OnDemand, last, 0)];
    }
    assert!(last <= before + 1, "{grown} → {last}, from {before}");
}

/// An H100-only policy settled at 20 req/s, then a crowd: the short window's rate triples
/// and a thousand requests queue. Returns the policy, the crowd's time, the fleet before it
/// and what the panic ordered.
fn after_a_crowd() -> (Sluice, f64, u32, u32) {
    let (mut p, t, fleet) = settled_at_20();
    let mut s = signals(t, 20.0, 1000, &[(H100, CapacityType::OnDemand, fleet, 0)]);
    s.arrivals.short_requests_per_s = 60.0;
    let spike = p.decide(&s);
    assert_eq!(spike.mode, Mode::Panic);
    let grown = spike.replicas_of(H100);
    assert!(grown > fleet + 1, "{fleet} → {grown}");
    (p, t, fleet, grown)
}

/// A panic plans for the crowd at its peak, and what it orders comes a start-up later: once
/// the panic is over, replicas still starting are held only as far as the demand planned
/// since needs them. What a rise outside panic ordered is held for the window.
#[test]
fn replicas_a_panic_ordered_are_cancelled_if_it_ends_before_they_serve() {
    let (p, t, before, grown) = after_a_crowd();
    // The crowd is over and its queue drained at once: the panic's minute holds the order...
    let starting = [(H100, CapacityType::OnDemand, before, grown - before)];
    let mut calm = p.clone();
    let d = calm.decide(&signals(t + 30.0, 20.0, 0, &starting));
    assert_eq!((d.mode, d.replicas_of(H100)), (Mode::Panic, grown));
    // ...and after it what still starts is cancelled down to the demand planned since.
    let d = calm.decide(&signals(t + 75.0, 20.0, 0, &starting));
    assert_eq!(d.mode, Mode::Stable);
    assert_eq!(d.replicas_of(H100), before, "{d:?}");
    // Had they come up during the panic, the window would hold them as any ready fleet.
    let mut served = p.clone();
    let ready = [(H100, CapacityType::OnDemand, grown, 0)];
    served.decide(&signals(t + 30.0, 20.0, 0, &ready));
    let d = served.decide(&signals(t + 75.0, 20.0, 0, &ready));
    assert_eq!((d.mode, d.replicas_of(H100)), (Mode::Stable, grown));
}

/// A panic's episode spans one rate window on either side of it: a tick whose long-window rate
/// already held the crowd before the short window panicked, and one after the panic whose rate
/// still holds it, plan for the crowd too. Once it is gone, what they ordered and is still
/// starting is cancelled as the panic's own order is, not held for the scale-down window.
#[test]
fn the_ticks_around_a_panic_are_its_episode() {
    let (mut p, t, before) = settled_at_20();
    let starting = |n: u32| [(H100, CapacityType::OnDemand, before, n - before)];
    // The crowd's onset: the rate at 34 req/s, within what the ready fleet absorbs, no panic.
    let onset = p.decide(&signals(t, 34.0, 0, &starting(before)));
    let ordered = onset.replicas_of(H100);
    assert_eq!(onset.mode, Mode::Stable);
    assert!(ordered > before, "{before} → {ordered}");
    // A tick later the short window and the queue panic.
    let mut s = signals(t + 15.0, 34.0, 1000, &starting(ordered));
    s.arrivals.short_requests_per_s = 60.0;
    let spike = p.decide(&s);
    assert_eq!(spike.mode, Mode::Panic);
    let grown = spike.replicas_of(H100);
    // The panic over (at t + 75 s), the rate still holds the crowd: it plans for more.
    let after = p.decide(&signals(t + 90.0, 34.0, 0, &starting(grown)));
    assert_eq!(after.mode, Mode::Stable);
    assert!(after.replicas_of(H100) > before, "{after:?}");
    // Back at 20 req/s, past the episode: all that still starts is cancelled, and says why.
    let calm = p.decide(&signals(t + 150.0, 20.0, 0, &starting(grown)));
    assert_eq!(calm.replicas_of(H100), before, "{calm:?}");
    let why: Vec<&str> = calm.reasons.iter().map(|r| r.detail.as_str()).collect();
    assert!(
        why.iter().any(|r| r.contains("a panic's episode planned")),
        "{why:?}"
    );
}

/// A rise that keeps a panic's replicas while they start holds back no cut of the window's
/// own: the rise going on past them teaches no longer scale-down window.
#[test]
fn a_rise_keeping_a_panics_replicas_teaches_no_longer_window() {
    let (mut p, t, before, grown) = after_a_crowd();
    let starting = [(H100, CapacityType::OnDemand, before, grown - before)];
    // The crowd was the start of a climb: the rate rises on while the replicas start.
    for i in 1..=24 {
        let rate = 20.0 + 2.0 * f64::from(i);
        let d = p.decide(&signals(t + 15.0 * f64::from(i), rate, 0, &starting));
        let lessons: Vec<&str> = d
            .reasons
            .iter()
            .map(|r| r.detail.as_str())
            .filter(|r| r.contains("would have been bought again"))
            .collect();
        assert!(lessons.is_empty(), "tick {i}: {lessons:?}");
    }
}

#[test]
fn scale_down_waits_for_the_stabilisation_window() {
    let mut p = Sluice::new(profile(), config());
    let d = settle(&mut p, 0.0, 30, 40.0);
    let high = d.replicas_of(H100);
    let mut fleet = [
        (L4, CapacityType::OnDemand, d.replicas_of(L4), 0),
        (H100, CapacityType::OnDemand, high, 0),
    ];
    // The rate falls to a quarter: nothing is released for five minutes...
    for i in 0..19 {
        let d = p.decide(&signals(450.0 + f64::from(i) * 15.0, 10.0, 0, &fleet));
        assert_eq!(d.replicas_of(H100), high, "tick {i}");
        if i > 0 {
            assert!(d.has_reason(ReasonKind::Stabilisation));
        }
    }
    // ...then the fleet follows the demand down.
    for i in 19..30 {
        let d = p.decide(&signals(450.0 + f64::from(i) * 15.0, 10.0, 0, &fleet));
        fleet = [
            (L4, CapacityType::OnDemand, d.replicas_of(L4), 0),
            (H100, CapacityType::OnDemand, d.replicas_of(H100), 0),
        ];
    }
    assert!(fleet[1].2 < high, "{} → {}", high, fleet[1].2);
}

#[test]
fn a_rising_rate_is_provisioned_ahead_by_the_forecast() {
    let mut p = Sluice::new(profile(), config());
    let mut last = Decision::default();
    for i in 0..60 {
        let t = f64::from(i) * 15.0;
        last = p.decide(&signals(t, 5.0 + 0.02 * t, 0, &[]));
    }
    let observed = last.demand.observed_requests_per_s;
    assert!(last.has_reason(ReasonKind::Forecast));
    assert!(
        last.demand.forecast_requests_per_s > observed + 2.0,
        "{:?}",
        last.demand
    );
    assert!(last.demand.planned_requests_per_s > last.demand.forecast_requests_per_s);
}

#[test]
fn spot_first_replaced_when_preempted_and_on_demand_when_out_of_stock() {
    // H100s only, so a Spot stockout has one way out: on-demand H100s.
    let mut cfg = config();
    cfg.limits.remove(0);
    cfg.spot = true;
    let mut p = Sluice::new(profile(), cfg);
    let d = settle(&mut p, 0.0, 4, 0.0);
    assert_eq!(d.replicas_of(H100), 0);
    let d = p.decide(&signals(60.0, 30.0, 0, &[]));
    let spot = d.replicas(H100, CapacityType::Spot);
    assert!(
        spot >= 1 && d.replicas(H100, CapacityType::OnDemand) == 0,
        "{:?} {:?}",
        d.targets,
        d.reasons
    );
    // One reclaimed: it vanishes from the counts and is asked for again at once (with a
    // little more, now that reclaims are seen).
    let mut s = signals(75.0, 30.0, 0, &[(H100, CapacityType::Spot, spot - 1, 0)]);
    s.variants[0].preempted = 1;
    let d = p.decide(&s);
    assert!(d.has_reason(ReasonKind::SpotReplacement));
    assert!(
        d.replicas(H100, CapacityType::Spot) >= spot,
        "{:?}",
        d.targets
    );
    // Spot replicas pending for over ten minutes: a stockout, on-demand takes over.
    let mut s = signals(90.0, 30.0, 0, &[(H100, CapacityType::Spot, 0, 0)]);
    s.variants[0].pending = spot;
    s.variants[0].oldest_pending_s = 700.0;
    let d = p.decide(&s);
    assert!(d.has_reason(ReasonKind::Spot));
    assert!(
        d.replicas(H100, CapacityType::OnDemand) >= 1,
        "{:?}",
        d.targets
    );
}

/// Each reclaim takes a Spot replica away for a start-up lead: at two reclaims per
/// replica-hour and a 7 min lead, a replica serves ~77 % of its time, and the policy plans
/// for that; without reclaims it does not.
#[test]
fn spot_replicas_are_planned_with_the_time_reclaims_take_from_them() {
    let run = |reclaims_every: Option<u32>| {
        let mut cfg = config();
        cfg.limits.remove(0);
        cfg.spot = true;
        let mut p = Sluice::new(profile(), cfg);
        let mut ready = 0;
        let mut d = Decision::default();
        // Two hours at 60 req/s, every replica asked for ready at the next tick.
        for i in 0..480u32 {
            let mut s = signals(
                f64::from(i) * 15.0,
                60.0,
                0,
                &[(H100, CapacityType::Spot, ready, 0)],
            );
            if reclaims_every.is_some_and(|n| i > 0 && i % n == 0) {
                s.variants[0].preempted = 1;
            }
            d = p.decide(&s);
            ready = d.replicas(H100, CapacityType::Spot);
        }
        d
    };
    let calm = run(None);
    assert!(!calm.reasons.iter().any(|r| r.detail.contains("reclaims")));
    // Four replicas when calm, one reclaimed every 7.5 min: about two an hour each.
    let reclaimed = run(Some(30));
    let (n, m) = (
        calm.replicas(H100, CapacityType::Spot),
        reclaimed.replicas(H100, CapacityType::Spot),
    );
    assert!(
        f64::from(m) >= 1.15 * f64::from(n),
        "{n} calm, {m} under reclaims"
    );
    assert!(
        reclaimed
            .reasons
            .iter()
            .any(|r| r.kind == ReasonKind::Spot && r.detail.contains("reclaims per replica-hour")),
        "{:?}",
        reclaimed.reasons
    );
}

#[test]
fn idle_models_scale_to_zero_but_keep_warm_replicas_while_traffic_is_recent() {
    let mut cfg = config();
    cfg.limits[0].keep_warm = 1;
    cfg.scale_to_zero_after_s = 300.0;
    let mut p = Sluice::new(profile(), cfg);
    settle(&mut p, 0.0, 10, 0.5);
    // Traffic stops: the warm L4 stays while the last request is recent...
    let fleet = [(L4, CapacityType::OnDemand, 1, 0)];
    let d = p.decide(&signals(200.0, 0.0, 0, &fleet));
    assert!(d.replicas_of(L4) >= 1);
    // ...and goes once the model has idled past the delay.
    let mut d = Decision::default();
    for i in 0..40 {
        d = p.decide(&signals(215.0 + f64::from(i) * 15.0, 0.0, 0, &fleet));
    }
    assert_eq!(d.replicas_of(L4) + d.replicas_of(H100), 0);
    assert!(d.has_reason(ReasonKind::ScaleToZero));
}

#[test]
fn under_the_error_budget_rule_zero_waits_for_enough_traffic_to_pay_a_cold_start() {
    use crate::zero::ZeroRule;
    let mut cfg = config();
    cfg.scale_to_zero_after_s = 300.0;
    cfg.zero_rule = ZeroRule::ErrorBudget {
        horizon_s: 86_400.0,
        miss_share: 0.01,
    };
    let idle_for = |p: &mut Sluice, from: f64| {
        let fleet = [(L4, CapacityType::OnDemand, 1, 0)];
        let mut d = Decision::default();
        for i in 0..40 {
            d = p.decide(&signals(from + f64::from(i) * 15.0, 0.0, 0, &fleet));
        }
        d
    };
    // A few minutes at 0.5 req/s, then idle: an L4 cold start (minutes) would miss more
    // than 1 % of those requests, so a replica stays, and the reason says so.
    let mut p = Sluice::new(profile(), cfg.clone());
    settle(&mut p, 0.0, 10, 0.5);
    let d = idle_for(&mut p, 200.0);
    assert_eq!(d.replicas_of(L4) + d.replicas_of(H100), 1, "{d:?}");
    assert!(d.has_reason(ReasonKind::ScaleToZero));
    // Hours of traffic, then a trickle, then idle: waking at the trickle's rate fits.
    let mut p = Sluice::new(profile(), cfg);
    settle(&mut p, 0.0, 2000, 2.0);
    settle(&mut p, 30_000.0, 200, 0.02);
    let d = idle_for(&mut p, 40_000.0);
    assert_eq!(d.replicas_of(L4) + d.replicas_of(H100), 0, "{d:?}");
}

/// An on-demand offer of up to 100 replicas of `variant`.
fn offer(variant: &str, requests_per_s: f64, price_per_hour: f64) -> crate::mix::Offer {
    crate::mix::Offer {
        variant: variant.into(),
        capacity: CapacityType::OnDemand,
        requests_per_s,
        price_per_hour,
        min: 0,
        max: 100,
    }
}

/// A ramp covered tick by tick: each rise is small, and the replica with the lowest price
/// covers it, not the one with the lowest cost per request. Figures of a 70B-class model:
/// two H100s at 3.94 req/s for $19.76/h, eight at 18.57 for $79.04, four A100s at 1.43 for
/// $15.72 ($3.05 per thousand requests against $1.18–1.39).
#[test]
fn a_ramp_is_not_covered_with_replicas_dear_per_request() {
    use crate::policy::plan::{cap_dear_growth, keep_or_switch};
    let mut offers = vec![
        offer("h100-x2", 3.94, 19.76),
        offer("h100-x8", 18.57, 79.04),
        offer("a100-x4", 1.43, 15.72),
    ];
    let ramp = |offers: &[crate::mix::Offer], capped: bool| {
        let (mut current, mut most_a100s) = (vec![2, 0, 0], 0);
        for i in 0..40 {
            let demand = 7.0 + 0.6 * f64::from(i);
            let grown = cap_dear_growth(offers, &current);
            let offers = if capped { &grown[..] } else { offers };
            let startup = [510.0, 600.0, 510.0];
            current = keep_or_switch(offers, &current, demand, &startup, 600.0)
                .0
                .counts;
            most_a100s = most_a100s.max(current[2]);
        }
        (current, most_a100s)
    };
    // Uncapped, the small rises buy A100s; capped, the ramp is met with H100s only.
    assert!(ramp(&offers, false).1 >= 2, "{:?}", ramp(&offers, false));
    let (capped, a100s) = ramp(&offers, true);
    assert_eq!(a100s, 0, "{capped:?}");
    let served = capped[0] as f64 * 3.94 + capped[1] as f64 * 18.57;
    assert!(served >= 7.0 + 0.6 * 39.0, "{capped:?}");
    // A100s already there are not cut for it, and an offer that may not grow (a Spot key
    // outside a stockout's end) sets no reference: here Spot H100s, cheap per request.
    let mut spot = offer("h100-x2-spot", 3.94, 7.0);
    spot.max = 0;
    offers.push(spot);
    let grown = cap_dear_growth(&offers, &[2, 0, 3, 0]);
    assert_eq!(
        grown.iter().map(|o| o.max).collect::<Vec<_>>(),
        vec![100, 100, 3, 0]
    );
}

#[test]
fn a_switch_of_mix_keeps_ready_replicas_until_the_new_ones_serve() {
    use crate::mix::Offer;
    use crate::policy::plan::make_before_break;
    // Six of the first key (some ready) and one of the second on its way; the mix wants none
    // of the first. Whether anything is held, and the counts after.
    let switch = |offers: &[Offer], ready: [u32; 2], demand: f64| {
        let mut counts = [0, 1];
        let held = make_before_break(offers, &[6, 1], &ready, &mut counts, demand);
        (held, counts)
    };
    let offers = [offer(L4, 1.0, 0.842), offer(H100, 16.0, 9.88)];
    // Six ready L4s; the cheapest answer to 8 req/s is one H100, not ready yet: the ready
    // L4s serve until the H100 is up; once it is ready, they go.
    assert_eq!(switch(&offers, [6, 0], 8.0), (true, [6, 1]));
    assert_eq!(switch(&offers, [6, 1], 8.0), (false, [0, 1]));
    // Starting L4s are cancelled at once: only ready capacity is kept.
    assert_eq!(switch(&offers, [2, 0], 8.0).1, [2, 1]);
    // Ready replicas the capacity model values at nothing (ineligible for the mean shape)
    // still serve what they can: kept until the replacement is ready, then let go.
    let offers = [offer(H100, 0.0, 9.88), offer("x8", 5.0, 79.0)];
    assert_eq!(switch(&offers, [6, 0], 4.0), (true, [6, 1]));
    assert_eq!(switch(&offers, [6, 1], 4.0), (false, [0, 1]));
}

#[test]
fn replicas_on_their_way_are_kept_while_the_ready_fleet_is_short() {
    use crate::mix;
    use crate::policy::plan::keep_in_flight;
    // Two ready A100s and two starting; demand has grown to where one H100 is the cheapest
    // answer, but the starting A100s are minutes nearer than any H100.
    let offers = [offer("a100", 4.5, 3.93), offer(H100, 16.0, 9.88)];
    let kept = keep_in_flight(&offers, &[4, 0], &[2, 0], 16.0).expect("short: kept");
    assert_eq!((kept[0].min, kept[1].min), (4, 0));
    let m = mix::cheapest(&kept, 16.0);
    assert!(m.counts[0] >= 4, "{:?}", m.counts);
    // Only as many as the shortfall needs: 12 req/s against 9 ready keeps one of the two.
    let kept = keep_in_flight(&offers, &[4, 0], &[2, 0], 12.0).expect("short: kept");
    assert_eq!((kept[0].min, kept[1].min), (3, 0));
    // Once the ready fleet covers the demand, surplus on its way may go.
    assert!(keep_in_flight(&offers, &[4, 0], &[3, 0], 14.0).is_some());
    assert!(keep_in_flight(&offers, &[4, 0], &[3, 0], 13.0).is_none());
    // Nothing on its way: nothing to keep.
    assert!(keep_in_flight(&offers, &[2, 0], &[2, 0], 12.0).is_none());
    // Ready replicas are never below their count while short; in-flight replicas the model
    // values at nothing are not kept for the shortfall.
    let offers = [offer(L4, 0.0, 0.84), offer(H100, 16.0, 9.88)];
    let kept = keep_in_flight(&offers, &[5, 2], &[2, 1], 20.0).expect("short: kept");
    assert_eq!((kept[0].min, kept[1].min), (2, 2));
}

#[test]
fn signals_and_decisions_round_trip_through_json() {
    let s = signals(15.0, 3.0, 2, &[(H100, CapacityType::Spot, 1, 1)]);
    let text = serde_json::to_string(&s).unwrap();
    assert!(text.contains("\"capacity\":\"spot\""));
    let back: Signals = serde_json::from_str(&text).unwrap();
    assert_eq!(back, s);
    let mut p = Sluice::new(profile(), config());
    let d = p.decide(&s);
    let back: Decision = serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
    // Floats may differ in the last bit through JSON; the actionable parts must not.
    assert_eq!(
        (&back.targets, &back.pools, &back.reasons, back.mode),
        (&d.targets, &d.pools, &d.reasons, d.mode)
    );
    assert!((back.demand.planned_requests_per_s - d.demand.planned_requests_per_s).abs() < 1e-9);
    // Partial signals (what a controller may have) parse with defaults.
    let partial: Signals = serde_json::from_str(r#"{"time_s": 1.0, "model": "m", "arrivals": {"window_s": 60, "requests_per_s": 1, "prompt_tokens_per_s": 100, "output_tokens_per_s": 10, "short_window_s": 10, "short_requests_per_s": 1, "max_prompt_tokens": 100}, "queue": {"waiting": 0, "waiting_prompt_tokens": 0, "running": 0}, "latency": {"window_s": 60}, "variants": [], "pools": []}"#).unwrap();
    assert_eq!(partial.request_shape(), Some((100.0, 10.0)));
}

#[test]
fn a_learnt_headroom_falls_below_the_prior_on_a_steady_rate() {
    let mut cfg = config();
    cfg.headroom_quantile = Some(0.9);
    let mut learnt = Sluice::new(profile(), cfg);
    let mut fixed = Sluice::new(profile(), config());
    // Two hours at a steady 40 req/s: every plan was met exactly a lead later.
    let l = settle(&mut learnt, 0.0, 480, 40.0);
    let f = settle(&mut fixed, 0.0, 480, 40.0);
    assert!(
        (f.demand.planned_requests_per_s - 48.0).abs() < 1e-6,
        "{:?}",
        f.demand
    );
    assert!(
        l.demand.planned_requests_per_s < 41.0 && l.demand.planned_requests_per_s >= 40.0,
        "{:?}",
        l.demand
    );
    assert!(l.demand.cost_per_hour <= f.demand.cost_per_hour);
}

#[test]
fn late_first_tokens_with_nothing_queued_discount_the_slower_prefilling_variant() {
    let late = |waiting: u64, ttft: f64| {
        let mut p = Sluice::new(profile(), config());
        settle(&mut p, 0.0, 10, 3.0);
        let mut d = Decision::default();
        for i in 0..10 {
            let mut s = signals(
                150.0 + f64::from(i) * 15.0,
                3.0,
                waiting,
                &[
                    (L4, CapacityType::OnDemand, 4, 0),
                    (H100, CapacityType::OnDemand, 1, 0),
                ],
            );
            for v in &mut s.variants {
                v.ttft_p99_s = Some(ttft);
                v.tpot_p99_s = Some(0.05);
            }
            d = p.decide(&s);
        }
        d
    };
    let breach = |d: &Decision, v: &str| {
        d.reasons
            .iter()
            .any(|r| r.kind == ReasonKind::LatencyBreach && r.variant.as_deref() == Some(v))
    };
    // First tokens at 3 s against a 2 s SLO, nothing queued: the L4's own prefill is slow and
    // the H100 prefills eight times faster, so the L4 alone is credited with less.
    let d = late(0, 3.0);
    assert!(breach(&d, L4) && !breach(&d, H100), "{:?}", d.reasons);
    // With a queue, late first tokens are the queue's (the demand margin answers them).
    let d = late(500, 3.0);
    assert!(!breach(&d, L4) && !breach(&d, H100), "{:?}", d.reasons);
    // In time: nothing to attribute.
    let d = late(0, 0.5);
    assert!(!breach(&d, L4), "{:?}", d.reasons);
}

/// First tokens late with nothing queued and a p99 above the target whatever the fleet (some
/// prompts no variant prefills in time): only the attainment over feasible requests tells
/// whether the replicas' own prefill queues make feasible ones late. Below the goal the
/// planning margin grows, and so does the demand the fleet is sized for; at the goal again it
/// decays, also while decode steps behind long prompts' prefill chunks keep the TPOT p99 near
/// (within) its target: that margin answers first tokens, not steps.
#[test]
fn feasible_first_tokens_late_without_a_queue_grow_the_fleet() {
    let run_with = |attainments: &[f64], tpot_p99_s: f64| {
        let mut p = Sluice::new(profile(), config());
        settle(&mut p, 0.0, 10, 20.0);
        let mut d = Decision::default();
        for (i, &a) in attainments.iter().enumerate() {
            let mut s = signals(
                150.0 + i as f64 * 15.0,
                20.0,
                0,
                &[(H100, CapacityType::OnDemand, 2, 0)],
            );
            s.latency.ttft_p99_s = Some(3.0);
            s.latency.tpot_p99_s = Some(tpot_p99_s);
            s.latency.ttft_attainment = Some(a);
            d = p.decide(&s);
        }
        d
    };
    let run = |attainments: &[f64]| run_with(attainments, 0.05);
    let planned = |d: &Decision| d.demand.planned_requests_per_s;
    let breach = |d: &Decision| {
        d.reasons
            .iter()
            .any(|r| r.kind == ReasonKind::LatencyBreach)
    };
    let on_time = run(&[0.995; 5]);
    let late = run(&[0.97; 5]);
    assert!(!breach(&on_time), "{:?}", on_time.reasons);
    assert!(breach(&late), "{:?}", late.reasons);
    // Five ticks of ×1.1, to the 1.5 cap.
    let ratio = planned(&late) / planned(&on_time);
    assert!((1.45..=1.51).contains(&ratio), "{ratio}");
    // Forty ticks in time again: ×0.97 a tick, back to no margin.
    let mut recovered = vec![0.97; 5];
    recovered.extend([0.995; 40]);
    let back = run(&recovered);
    assert!(
        (planned(&back) - planned(&on_time)).abs() < 1e-9,
        "{}",
        planned(&back)
    );
    // The same with TPOT p99 at 90 % of its 200 ms target (decode steps behind full prefill
    // chunks, as in a code-completion load): the margin comes back too.
    let back = run_with(&recovered, 0.18);
    assert!(
        (planned(&back) - planned(&on_time)).abs() < 1e-9,
        "{}",
        planned(&back)
    );
}

/// First tokens late in the latency window just after a replica came up are the backlog it
/// found: the capacity that answers them is there, and widening the planning margin on them
/// would order more for a ramp already met (anti-windup, as while replicas start). The margin
/// waits until a window after that backlog drained; then late first tokens are the fleet's.
/// Without a replica come up, the same late first tokens widen it at once.
#[test]
fn first_tokens_late_from_before_a_replica_came_up_widen_no_margin() {
    let breaches = |came_up: bool| {
        let mut p = Sluice::new(profile(), config());
        settle(&mut p, 0.0, 10, 20.0);
        let mut breached = Vec::new();
        for i in 0..7 {
            let t = 150.0 + i as f64 * 15.0;
            let ready = if came_up && i > 0 { 3 } else { 2 };
            let waiting = if i < 2 { 50 } else { 0 };
            let mut s = signals(
                t,
                20.0,
                waiting,
                &[(H100, CapacityType::OnDemand, ready, 0)],
            );
            s.latency.window_s = 60.0;
            s.latency.ttft_p99_s = Some(3.0);
            s.latency.tpot_p99_s = Some(0.05);
            s.latency.ttft_attainment = Some(0.9);
            let d = p.decide(&s);
            if d.reasons
                .iter()
                .any(|r| r.kind == ReasonKind::LatencyBreach)
            {
                breached.push(t);
            }
        }
        breached
    };
    assert_eq!(
        breaches(false),
        [150.0, 165.0, 180.0, 195.0, 210.0, 225.0, 240.0]
    );
    // Up at 165 with 50 queued, drained by 180: late first tokens count again from 240.
    assert_eq!(breaches(true), [150.0, 240.0]);
}

#[test]
fn a_heavy_tail_of_long_prompts_keeps_a_second_replica_at_low_load() {
    // Half a request a second of 9,000-token prompts is a fifth of one H100's prefill. With
    // equal prompts one H100 serves it; with log-normal ones (cv² 2.25, tens of thousands of
    // tokens now and then) a lone replica is blocked too often and a second one is kept.
    let fleet = [
        (L4, CapacityType::OnDemand, 0, 0),
        (H100, CapacityType::OnDemand, 1, 0),
    ];
    let decide = |cv2: f64| {
        let mut p = Sluice::new(profile(), config());
        let mut s = signals(0.0, 0.5, 0, &fleet);
        s.arrivals.prompt_tokens_per_s = 0.5 * 9000.0;
        s.arrivals.output_tokens_per_s = 0.5 * 300.0;
        s.arrivals.prompt_tokens_cv2 = cv2;
        p.decide(&s)
    };
    let equal = decide(0.0);
    assert_eq!(equal.replicas_of(H100), 1, "{:?}", equal.targets);
    assert!(!equal.has_reason(ReasonKind::PromptTail));
    let heavy = decide(2.25);
    assert_eq!(heavy.replicas_of(H100), 2, "{:?}", heavy.reasons);
    assert!(heavy.has_reason(ReasonKind::PromptTail));
}

#[test]
fn batches_sent_within_a_second_keep_the_fleet_that_prefills_them_in_time() {
    // Two requests a second of 1,000-token prompts: one H100 serves the rate. But ten times
    // in the window a batch of 131k–150k prompt tokens arrived within one second, which one
    // H100 prefills in 5.5–6.3 s against a 2 s target: the fleet is held at what prefills a
    // batch within it, and says why.
    let fleet = [
        (L4, CapacityType::OnDemand, 0, 0),
        (H100, CapacityType::OnDemand, 1, 0),
    ];
    let decide = |per_second: Option<SecondSums>| {
        let mut p = Sluice::new(profile(), config());
        let mut s = signals(0.0, 2.0, 0, &fleet);
        s.arrivals.per_second = per_second;
        p.decide(&s)
    };
    let steady = decide(None);
    assert_eq!(steady.replicas_of(H100), 1, "{:?}", steady.targets);
    assert!(!steady.has_reason(ReasonKind::Burst));
    let batches = SecondSums {
        buckets: vec![
            (2048.0, 400.0),
            (131_072.0, 400.0),
            (150_000.0, 410.0),
            (f64::INFINITY, 410.0),
        ],
        sum: 400.0 * 2000.0 + 10.0 * 140_000.0,
    };
    let bursty = decide(Some(batches));
    assert!(bursty.has_reason(ReasonKind::Burst), "{:?}", bursty.reasons);
    let prof = profile();
    let within_target: f64 = [L4, H100]
        .iter()
        .map(|v| {
            let perf = &prof.variant(v).unwrap().perf;
            f64::from(bursty.replicas_of(v)) * perf.prefill_tokens_per_s * 2.0
        })
        .sum();
    assert!(
        within_target >= 131_072.0,
        "{within_target} {:?}",
        bursty.targets
    );
}

/// A crowd's seconds (the rate ×5 for two minutes) look like batches in the per-second sums:
/// after the crowd the burst floor reads none of them until they have left the window;
/// seconds like them outside a crowd are bursts, and are again once the window has passed.
#[test]
fn a_crowds_seconds_are_no_bursts_within_a_second() {
    // Two minutes of 100 req/s of 1,000-token prompts among five of 20 req/s.
    let crowd_seconds = SecondSums {
        buckets: vec![
            (32_768.0, 300.0),
            (131_072.0, 420.0),
            (f64::INFINITY, 420.0),
        ],
        sum: 300.0 * 20_000.0 + 120.0 * 100_000.0,
    };
    let calm = |p: &mut Sluice, t: f64, fleet: u32| {
        let mut s = signals(t, 20.0, 0, &[(H100, CapacityType::OnDemand, fleet, 0)]);
        s.arrivals.per_second = Some(crowd_seconds.clone());
        p.decide(&s)
    };
    let (mut p, t, fleet) = settled_at_20();
    let mut bursty = p.clone();
    assert!(calm(&mut bursty, t, fleet).has_reason(ReasonKind::Burst));
    let mut s = signals(t, 100.0, 1000, &[(H100, CapacityType::OnDemand, fleet, 0)]);
    s.arrivals.short_requests_per_s = 100.0;
    assert_eq!(p.decide(&s).mode, Mode::Panic);
    let after = calm(&mut p, t + 180.0, fleet);
    assert_eq!(after.mode, Mode::Stable);
    assert!(!after.has_reason(ReasonKind::Burst), "{:?}", after.reasons);
    assert!(calm(&mut p, t + 421.0, fleet).has_reason(ReasonKind::Burst));
}

/// The policy on H100s alone, at TTFT ≤ 2 s and TPOT ≤ 100 ms.
fn h100_only() -> Sluice {
    Sluice::new(profile(), config_h100())
}

/// [`h100_only`]'s configuration.
fn config_h100() -> SluiceConfig {
    let slo = Slo {
        ttft_p99_s: 2.0,
        tpot_p99_s: 0.1,
    };
    SluiceConfig::new(slo, vec![VariantLimits::new(H100, 100)])
}

/// [`h100_only`] after ten minutes at a steady 20 req/s: the policy, the time then and the
/// H100s it holds.
fn settled_at_20() -> (Sluice, f64, u32) {
    let mut p = h100_only();
    let mut fleet = 0;
    let (t, _) = run_h100(&mut p, 0.0, 40, 20.0, &mut fleet, 0);
    (p, t, fleet)
}

/// One tick at `t` and `rate` of an H100-only policy whose `fleet` is ready; the fleet
/// becomes the decision's, as if replicas were ready at once.
fn tick_h100(p: &mut Sluice, t: f64, rate: f64, fleet: &mut u32) -> Decision {
    let d = p.decide(&signals(
        t,
        rate,
        0,
        &[(H100, CapacityType::OnDemand, *fleet, 0)],
    ));
    *fleet = d.replicas_of(H100);
    d
}

/// Runs `ticks` ticks at `rate` from `t`, applying each decision as if replicas were ready at
/// once; returns the time after them and the first tick whose fleet is below `below`.
fn run_h100(
    p: &mut Sluice,
    t: f64,
    ticks: u32,
    rate: f64,
    fleet: &mut u32,
    below: u32,
) -> (f64, Option<u32>) {
    let mut first_cut = None;
    for i in 0..ticks {
        tick_h100(p, t + f64::from(i) * 15.0, rate, fleet);
        if *fleet < below && first_cut.is_none() {
            first_cut = Some(i);
        }
    }
    (t + f64::from(ticks) * 15.0, first_cut)
}

#[test]
fn a_cut_bought_back_within_a_start_up_holds_the_next_lull_for_a_start_up() {
    let mut p = h100_only();
    let mut fleet = 0;
    let (t, _) = run_h100(&mut p, 0.0, 40, 40.0, &mut fleet, 0);
    let high = fleet;
    // A lull: the fleet is cut once the five-minute window has passed...
    let (t, cut) = run_h100(&mut p, t, 24, 10.0, &mut fleet, high);
    let first = cut.unwrap();
    assert!((19..=21).contains(&first), "cut at tick {first}");
    // ...and the traffic is back two minutes later, well within an H100's 420 s start-up.
    let (t, _) = run_h100(&mut p, t + 120.0, 40, 40.0, &mut fleet, 0);
    assert!(fleet >= high, "{high} → {fleet}");
    // The next lull is held for the start-up lead instead.
    let (_, cut) = run_h100(&mut p, t, 40, 10.0, &mut fleet, high);
    let second = cut.unwrap();
    assert!(second >= 27, "cut at tick {second}, first at {first}");
}

#[test]
fn no_scale_down_while_the_load_is_rising() {
    // Taking over four H100s at a flat 5 req/s: cut once the window has passed.
    let (mut p, mut fleet) = (h100_only(), 4);
    let (_, cut) = run_h100(&mut p, 0.0, 40, 5.0, &mut fleet, 4);
    assert!(cut.is_some_and(|c| c <= 26), "flat load cut at {cut:?}");
    // The same fleet while the load climbs slowly (still needing fewer replicas): held.
    let (mut p, mut fleet) = (h100_only(), 4);
    let mut rising = 0;
    for i in 0..60 {
        let rate = 5.0 + 0.05 * f64::from(i);
        let d = tick_h100(&mut p, f64::from(i) * 15.0, rate, &mut fleet);
        assert_eq!(fleet, 4, "tick {i}: {:?}", d.reasons);
        rising += usize::from(d.reasons.iter().any(|r| r.detail.contains("load rising")));
        assert!(d.demand.planned_requests_per_s < 16.0, "{:?}", d.demand);
    }
    assert!(rising > 20, "{rising} ticks held for the rise");
    // Once the rate stops climbing and the trend decays, the window applies again.
    let (_, cut) = run_h100(&mut p, 900.0, 80, 8.0, &mut fleet, 4);
    assert!(cut.is_some(), "never cut after the rise");
}

#[test]
fn a_cut_held_back_by_a_rise_and_needed_again_holds_the_next_lull_for_a_start_up() {
    let mut p = h100_only();
    // Four H100s taken over while a slow rise holds them (see above)...
    let mut fleet = 4;
    for i in 0..60 {
        let rate = 5.0 + 0.05 * f64::from(i);
        tick_h100(&mut p, f64::from(i) * 15.0, rate, &mut fleet);
    }
    assert_eq!(fleet, 4);
    // ...then the demand is back above what three serve, within a start-up of the last
    // held tick: the held cut would have been bought back.
    let mut judged = false;
    for i in 0..40 {
        let d = tick_h100(&mut p, 900.0 + f64::from(i) * 15.0, 55.0, &mut fleet);
        judged |= d
            .reasons
            .iter()
            .any(|r| r.detail.contains("would have been bought again"));
    }
    assert!(judged, "the held cut was not judged");
    // The next lull is held for the H100's 420 s start-up, not the 300 s base window.
    let mut windows = Vec::new();
    for i in 0..10 {
        let d = tick_h100(&mut p, 1500.0 + f64::from(i) * 15.0, 10.0, &mut fleet);
        windows.extend(
            d.reasons
                .iter()
                .filter(|r| r.detail.contains("scale-down window"))
                .map(|r| r.detail.clone()),
        );
    }
    assert!(
        !windows.is_empty()
            && windows
                .iter()
                .all(|w| w.contains("the 420s scale-down window")),
        "{windows:?}"
    );
}

#[test]
fn an_idle_pool_does_not_keep_paying_for_replicas_still_starting() {
    // A steady 20 req/s on the H100s it needs, a rise orders more, then traffic stops.
    let (mut p, t, ready) = settled_at_20();
    let d = p.decide(&signals(
        t,
        40.0,
        0,
        &[(H100, CapacityType::OnDemand, ready, 0)],
    ));
    let ordered = d.replicas_of(H100);
    assert!(ordered > ready, "the rise orders more: {ready} → {ordered}");
    let starting = ordered - ready;
    // While the traffic still comes, what is on its way is held for the window...
    let on_way = [(H100, CapacityType::OnDemand, ready, starting)];
    let d = p.decide(&signals(t + 15.0, 5.0, 0, &on_way));
    assert_eq!(d.replicas_of(H100), ordered, "held while traffic comes");
    // ...once nothing arrives, nothing is queued and nothing runs, it is not: the ready fleet
    // is what the window may hold (what a return needs is kept warm apart).
    let d = p.decide(&signals(t + 75.0, 0.0, 0, &on_way));
    assert_eq!(d.replicas_of(H100), ready, "{d:?}");
    // Running requests are traffic: nothing is cut under them.
    let mut busy = signals(t + 90.0, 0.0, 0, &on_way);
    busy.queue.running = 3;
    let mut p2 = p.clone();
    assert_eq!(p2.decide(&busy).replicas_of(H100), ordered);
}

/// The forecast smooths per 15 s (the simulator's tick), not per tick: the Kubernetes
/// controller's 10 s period and local mode's 2 s ticks plan as the simulator measured.
#[test]
fn the_forecast_does_not_depend_on_the_tick_length() {
    let forecast_at_900 = |every: f64| {
        let mut p = h100_only();
        let mut fleet = 1;
        let (mut t, mut d) = (0.0, Decision::default());
        while t <= 900.0 + 1e-9 {
            d = tick_h100(&mut p, t, 5.0 + 0.01 * t + (t / 45.0).sin(), &mut fleet);
            t += every;
        }
        d.demand.forecast_requests_per_s
    };
    let at_15 = forecast_at_900(15.0);
    assert!(at_15 > 14.0 + 1.0, "{at_15}");
    for every in [2.0, 5.0, 10.0, 30.0] {
        let f = forecast_at_900(every);
        assert!(
            (f - at_15).abs() < 0.02 * at_15,
            "every {every} s: {f} vs {at_15}"
        );
    }
}

/// A climb back to a level the traffic held over a start-up lead ago is planned at most 1.4×
/// that level (the `ceiling` module); a climb past it is new ground and gets the forecast and
/// headroom in full. Without the ceiling the same climb is planned past it.
#[test]
fn a_climb_within_an_old_peak_is_planned_to_a_ceiling_over_it() {
    let held = |d: &Decision| d.reasons.iter().any(|r| r.detail.contains("held to"));
    let (mut p, t, mut fleet) = after_a_peak_and_a_lull(config_h100());
    let (t, within) = climb(&mut p, t, &[16.0, 22.0, 28.0], &mut fleet);
    assert!(held(&within), "{:?}", within.reasons);
    let planned = within.demand.planned_requests_per_s;
    assert!((planned - 1.4 * 30.0).abs() < 1e-6, "{:?}", within.demand);
    let (_, past) = climb(&mut p, t, &[36.0, 44.0], &mut fleet);
    assert!(!held(&past), "{:?}", past.reasons);
    assert!(past.demand.planned_requests_per_s >= 1.2 * 44.0);

    let mut free = config_h100();
    free.seen_peak_ratio = None;
    let (mut p, t, mut fleet) = after_a_peak_and_a_lull(free);
    let (_, d) = climb(&mut p, t, &[16.0, 22.0, 28.0], &mut fleet);
    assert!(
        d.demand.planned_requests_per_s > 1.4 * 30.0,
        "{:?}",
        d.demand
    );
}

/// Ten minutes at 30 req/s, then fifteen at 10 (the fleet cut back): the policy, the time and
/// the H100s it holds.
fn after_a_peak_and_a_lull(config: SluiceConfig) -> (Sluice, f64, u32) {
    let mut p = Sluice::new(profile(), config);
    let mut fleet = 0;
    let (t, _) = run_h100(&mut p, 0.0, 40, 30.0, &mut fleet, 0);
    let (t, _) = run_h100(&mut p, t, 60, 10.0, &mut fleet, 0);
    (p, t, fleet)
}

/// One tick at each of `rates` from `t`: the time after them and the last decision.
fn climb(p: &mut Sluice, mut t: f64, rates: &[f64], fleet: &mut u32) -> (f64, Decision) {
    let mut d = Decision::default();
    for &r in rates {
        d = tick_h100(p, t, r, fleet);
        t += 15.0;
    }
    (t, d)
}
