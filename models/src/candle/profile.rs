//! Where a step's time goes on candle's backend, phase by phase (`gpucheck profile` reads it).
//!
//! Off by default, and then free: a phase boundary costs one branch on an `Option`. When on,
//! the device is synchronised at the end of each phase, so a phase's time is its own kernels
//! plus the launches that queued them. That serialises the step: a profiled step is slower
//! than a plain one, and the profile says where the time goes, not how fast a step runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::Device;

use crate::error::Result;

/// The phases of a step, in the order a layer runs them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
    /// The step's plan: positions, slots and gather indices uploaded to the device.
    Plan,
    /// Embedding lookup, the step's RoPE rows and the first layer's norm.
    Embed,
    /// Both residual adds of each layer, each fused with the RMS norm after it.
    Norm,
    /// The fused Q/K/V product.
    Qkv,
    /// The queries rotated out of the product.
    Rope,
    /// New keys (rotated) and values written into their pool slots.
    KvWrite,
    /// Each row's attention over its context in the pool (paged or gathered).
    Attention,
    /// The output projection.
    Wo,
    /// The fused gate/up product.
    GateUp,
    /// SiLU(gate) × up.
    Act,
    /// The down projection.
    Down,
    /// The logit rows picked, the vocabulary product and the copy to the host.
    Logits,
}

const PHASES: usize = 12;
const NAMES: [&str; PHASES] = [
    "plan",
    "embed",
    "norm",
    "qkv",
    "rope",
    "kv_write",
    "attention",
    "wo",
    "gate_up",
    "act",
    "down",
    "logits",
];

/// Accumulated time per phase while profiling is on.
#[derive(Debug, Default)]
pub(crate) struct Profiler {
    on: AtomicBool,
    totals: Mutex<[Duration; PHASES]>,
}

impl Profiler {
    /// Turns profiling on or off, clearing what was accumulated.
    pub fn set(&self, on: bool) {
        *self.totals.lock().unwrap_or_else(|e| e.into_inner()) = Default::default();
        self.on.store(on, Ordering::Relaxed);
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Each phase's accumulated seconds, by name, and clears them.
    pub fn take(&self) -> Vec<(&'static str, f64)> {
        let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        let out = NAMES
            .iter()
            .zip(totals.iter())
            .map(|(&n, d)| (n, d.as_secs_f64()))
            .collect();
        *totals = Default::default();
        out
    }

    /// A step's clock, started after the device finished earlier work.
    pub fn clock<'a>(&'a self, device: &'a Device) -> Result<Clock<'a>> {
        let last = if self.on.load(Ordering::Relaxed) {
            device.synchronize()?;
            Some(Instant::now())
        } else {
            None
        };
        Ok(Clock {
            profiler: self,
            device,
            last,
        })
    }
}

/// Marks the ends of one step's phases.
pub(crate) struct Clock<'a> {
    profiler: &'a Profiler,
    device: &'a Device,
    /// When the last phase ended; `None` while profiling is off.
    last: Option<Instant>,
}

impl Clock<'_> {
    /// Ends `phase`: waits for the device, then adds the time since the last mark to it.
    pub fn mark(&mut self, phase: Phase) -> Result<()> {
        let Some(last) = self.last else {
            return Ok(());
        };
        self.device.synchronize()?;
        let now = Instant::now();
        self.profiler
            .totals
            .lock()
            .unwrap_or_else(|e| e.into_inner())[phase as usize] += now - last;
        self.last = Some(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_accumulate_only_while_on() {
        let p = Profiler::default();
        let mut off = p.clock(&Device::Cpu).unwrap();
        off.mark(Phase::Qkv).unwrap();
        assert!(p.take().iter().all(|&(_, s)| s == 0.0));
        p.set(true);
        let mut on = p.clock(&Device::Cpu).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        on.mark(Phase::Attention).unwrap();
        let taken = p.take();
        assert_eq!(taken.len(), PHASES);
        let attention = taken.iter().find(|(n, _)| *n == "attention").unwrap().1;
        assert!(attention > 0.0, "{taken:?}");
        assert!(p.take().iter().all(|&(_, s)| s == 0.0), "take clears");
    }
}
