//! The warm-up before a run's cut. A trace is a window cut from a running service, so a
//! policy that acts on what it observes (sluice, HPA, KPA) meets the window's first request
//! in the state that service left it in: a fleet sized by its own rules (its prompt floors,
//! its held peaks, not only the rate), its windows full. Started cold from a fleet sized for
//! the rate alone, it spends the first start-up lead of every trace catching up with itself:
//! `long-prompts` seed 8 lost 0.43 points there (one H100 where the prompt-tail floor holds
//! two), `batches` 0.4–4.1 points.
//!
//! What came before the window is not in the trace. Its opening is the best evidence of it,
//! so the warm-up replays the opening forward and then mirrored in time: a request `x`
//! seconds after the cut also arrives `x` seconds before it, so the rate is continuous at the
//! cut (a rising opening is met by the same rise) and bursts and lulls keep their shape. The
//! forward pass comes first so that the mirrored one meets a policy that has seen such
//! traffic: started on the mirror alone, a policy at a minimum of zero met the idle stretch
//! that ends `idle-gaps`' opening before any traffic, went to zero, and was still starting
//! replicas at the cut (85 % in SLO where 100 % had been). The warm-up's requests,
//! decisions, samples and bill are left out of the run.
//!
//! Policies that plan from the trace itself (static peak, the oracle) hold their fleet from
//! the cut without one.

use sluice_policy::profile::Profile;
use sluice_policy::timeline::Request;

use super::{Run, SimConfig};

/// The opening a closed-loop policy's warm-up replays (twice): the slowest start-up (what it
/// buys on the mirrored pass is ready by the cut) plus the request shape's window (what the
/// prompt floors read is full), in whole ticks.
pub fn opening_s(profile: &Profile, cfg: &SimConfig) -> f64 {
    let lead = profile
        .variants
        .iter()
        .map(|v| v.startup_s(true))
        .fold(0.0, f64::max);
    let tick = cfg.tick_s.max(1e-9);
    ((lead + cfg.shape_window_s) / tick).ceil() * tick
}

/// The requests of a run whose warm-up replays the trace's first `opening_s` seconds (as
/// much of it as there is, in whole ticks so that ticks fall on the cut) forward and then
/// mirrored; the cut (where the trace follows, shifted); and how many requests are warm-up.
/// `None`, copying nothing, when not a whole tick of opening is asked for or there.
pub fn with_mirrored_opening(
    requests: &[Request],
    opening_s: f64,
    tick_s: f64,
) -> Option<(Vec<Request>, f64, usize)> {
    let span_s = requests.last().map_or(0.0, |r| r.arrival_s);
    let tick_s = tick_s.max(1e-9);
    let opening_s = (opening_s.min(span_s) / tick_s).floor() * tick_s;
    if opening_s <= 0.0 {
        return None;
    }
    let opening = || requests.iter().filter(|r| r.arrival_s < opening_s);
    let cut_s = 2.0 * opening_s;
    // The trace's first request (at 0) would mirror onto the cut itself: it is the trace's.
    let mirrored = opening()
        .rev()
        .filter(|r| r.arrival_s > 0.0)
        .map(|r| Request {
            arrival_s: cut_s - r.arrival_s,
            ..*r
        });
    let warm: Vec<Request> = opening().copied().chain(mirrored).collect();
    let n = warm.len();
    let shifted = requests.iter().map(|r| Request {
        arrival_s: r.arrival_s + cut_s,
        ..*r
    });
    Some((warm.into_iter().chain(shifted).collect(), cut_s, n))
}

/// `run` as if it had started at the cut: the warm-up's outcomes left out and every time
/// told from the cut.
pub fn from_cut(mut run: Run, cut_s: f64, warm: usize) -> Run {
    run.outcomes.drain(..warm.min(run.outcomes.len()));
    for o in &mut run.outcomes {
        o.arrival_s -= cut_s;
    }
    for s in &mut run.samples {
        s.time_s -= cut_s;
    }
    for d in &mut run.decisions {
        d.time_s -= cut_s;
    }
    run.end_s -= cut_s;
    run
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(t: f64, p: u32) -> Request {
        Request {
            arrival_s: t,
            prompt_tokens: p,
            output_tokens: 1,
        }
    }

    /// The opening comes forward, then mirrored up to the cut (as far before it as after;
    /// the first request, which would land on the cut, only once); the trace follows shifted
    /// by the cut. A trace shorter than the opening is replayed whole (to its last whole
    /// tick), with no idle stretch added.
    #[test]
    fn the_opening_comes_forward_then_mirrored_before_the_cut() {
        let trace = [req(0.0, 1), req(2.0, 2), req(5.0, 3), req(20.0, 4)];
        let (all, cut, warm) = with_mirrored_opening(&trace, 10.0, 5.0).unwrap();
        let got: Vec<(f64, u32)> = all.iter().map(|r| (r.arrival_s, r.prompt_tokens)).collect();
        assert_eq!((cut, warm), (20.0, 5));
        let forward = [(0.0, 1), (2.0, 2), (5.0, 3)];
        let mirrored = [(15.0, 3), (18.0, 2)];
        let shifted = [(20.0, 1), (22.0, 2), (25.0, 3), (40.0, 4)];
        assert_eq!(got, [&forward[..], &mirrored, &shifted].concat());
        let (all, cut, warm) = with_mirrored_opening(&trace_of(&[0.0, 3.5]), 10.0, 1.0).unwrap();
        let times: Vec<f64> = all.iter().map(|r| r.arrival_s).collect();
        assert_eq!((cut, warm), (6.0, 1));
        assert_eq!(times, [0.0, 6.0, 9.5]);
        let short = with_mirrored_opening(&trace_of(&[0.0, 3.5]), 10.0, 15.0);
        assert!(short.is_none(), "shorter than a tick: no warm-up");
        assert!(
            with_mirrored_opening(&trace, 0.0, 5.0).is_none(),
            "none asked for"
        );
    }

    fn trace_of(times: &[f64]) -> Vec<Request> {
        times.iter().map(|&t| req(t, 1)).collect()
    }
}
