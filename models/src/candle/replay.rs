//! Decode steps run from inputs that stay put, and on a GPU replayed as CUDA graphs.
//!
//! A decode step on a GPU is launch-bound: about fifteen launches a layer at ~15–30 µs of host
//! time each (README, "On a GPU"), where the kernels themselves take a few. A CUDA graph records
//! a step's launches once and replays them with one call. A graph replays the same kernels on
//! the same addresses, so the steps it records read their inputs from tensors that do not move:
//! per batch-size bucket ([`BUCKETS`]), the token ids, positions, KV slots and the paged op's
//! metadata are written into fixed tensors before each step ([`Upload`]), and the logits come
//! out of a fixed one. A batch is padded to its bucket with rows that write the pool's scratch
//! block ([`DeviceKv::scratch_block`]) and attend to it alone; their logits are dropped.
//!
//! Only steps whose every sequence feeds one decode token take this path: prefill chunks change
//! shape every step. On a GPU a bucket's first step runs eagerly (which loads every kernel and
//! sizes candle's scratch buffers), and is then captured; its later steps replay the graph.
//! On the CPU there is nothing to capture and every step of the path runs eagerly on the fixed
//! tensors: that is how the inputs, the padding and the outputs are tested here.
//!
//! candle's quantized products keep grow-only scratch buffers per device, and a graph holds the
//! address it was captured with: an eager step with more token rows than any before may move
//! them, so it drops every graph (they are captured again when next used).
//!
//! Off unless `SLUICE_CUDA_GRAPHS=1` (a switch for every binary, like `SLUICE_ATTENTION`) until
//! a device run measures it: `make check-gpu` times decode with and without it.

use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Tensor};

use super::attention::{slot_of, StepPlan};
use super::kv::DeviceKv;
use super::paged::{PagedAttention, PagedMeta};
use crate::batch::{Logits, StepBatch};
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};

/// Batch sizes a decode step is padded to; larger decode steps run eagerly.
pub(crate) const BUCKETS: [usize; 13] = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256];

/// Whether `SLUICE_CUDA_GRAPHS` asks for replayed decode steps (`1`, `on` or `true`).
pub fn from_env() -> bool {
    super::env_switch("SLUICE_CUDA_GRAPHS", false)
}

/// One step's model run over a plan: the logits of the plan's rows, f32, on the device.
pub(crate) type Run<'a> = dyn Fn(&StepPlan) -> Result<Tensor> + 'a;

/// What the path has done: for gpucheck's report and the tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphStatus {
    /// Whether decode steps take the path.
    pub on: bool,
    /// Steps that took it (eagerly or replayed).
    pub steps: u64,
    /// Steps replayed from a captured graph.
    pub replayed: u64,
    /// Graphs captured (again after a growth of candle's scratch buffers, or a new pool).
    pub captured: u64,
    /// Why capturing failed, once it has: steps then run eagerly on the fixed inputs.
    pub capture_failed: Option<String>,
}

/// The fixed inputs and captured steps of one model over one pool.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    status: GraphStatus,
    /// The pool the buckets were made for ([`DeviceKv::id`]): a graph writes and reads its
    /// addresses.
    pool: Option<u64>,
    buckets: Vec<Bucket>,
    /// Most token rows a step has run eagerly (see the module's notes on scratch buffers).
    high_water: usize,
}

/// One bucket's fixed tensors, and its graph once captured.
#[derive(Debug)]
struct Bucket {
    size: usize,
    /// `[size]` u32 each.
    tokens: Tensor,
    positions: Tensor,
    slots: Tensor,
    /// `[size]` u32: `0..size`, every row's logits.
    logit_rows: Tensor,
    /// The paged op's metadata ([`PagedMeta`]), room for every row's whole block table.
    meta: Tensor,
    /// `[size, vocab]` f32: the step's logits, padding rows included.
    logits: Tensor,
    #[cfg(feature = "cuda")]
    graph: Option<cuda::Captured>,
}

/// A decode step's host-side inputs, padded to its bucket.
#[derive(Debug, Default)]
struct HostStep {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    slots: Vec<u32>,
    meta: PagedMeta,
}

impl Replay {
    pub(crate) fn new(on: bool) -> Self {
        let mut r = Self::default();
        r.status.on = on;
        r
    }

    /// Turns the path on or off; off drops what was captured.
    pub(crate) fn set(&mut self, on: bool) {
        if !on {
            self.buckets.clear();
        }
        self.status.on = on;
    }

    pub(crate) fn status(&self) -> GraphStatus {
        self.status.clone()
    }

    /// Runs `batch` on this path and returns its logits (f32, on the device, a view the next
    /// step overwrites), or `None` when the step is not for it (the caller then runs it
    /// eagerly and tells [`Self::ran_eagerly`]).
    pub(crate) fn step(
        &mut self,
        batch: &StepBatch,
        (pool, block_size): (&DeviceKv, usize),
        (config, device): (&LlamaConfig, &Device),
        run: &Run<'_>,
    ) -> Result<Option<Tensor>> {
        let Some(size) = self.bucket_size(batch) else {
            return Ok(None);
        };
        if self.pool != Some(pool.id()) {
            self.buckets.clear();
            self.pool = Some(pool.id());
        }
        let at = match self.buckets.iter().position(|b| b.size == size) {
            Some(at) => at,
            None => match Bucket::new(size, config, block_size, device) {
                Ok(b) => {
                    self.buckets.push(b);
                    self.buckets.len() - 1
                }
                // Memory the KV pool left is short: steps run eagerly from now on.
                Err(e) => {
                    tracing::warn!(error = %e, size, "cannot allocate a replayed step's inputs; running decode steps eagerly");
                    self.set(false);
                    return Ok(None);
                }
            },
        };
        self.buckets[at].upload(HostStep::new(batch, size, block_size, pool.scratch_block()))?;
        self.status.steps += 1;
        if self.buckets[at].has_graph() {
            self.buckets[at].launch()?;
            self.status.replayed += 1;
        } else {
            self.ran_eagerly(size);
            let plan = self.buckets[at].plan(config, block_size);
            self.first_run(at, &plan, run)?;
        }
        // A view of the fixed tensor, which the next step overwrites: the caller copies it
        // out before letting another step run.
        let rows = batch.seqs.len();
        Ok(Some(self.buckets[at].logits.narrow(0, 0, rows)?))
    }

    /// Notes an eager step of `rows` token rows: more than any before drops every graph.
    pub(crate) fn ran_eagerly(&mut self, rows: usize) {
        if rows > self.high_water {
            self.high_water = rows;
            self.drop_graphs();
        }
    }

    /// The bucket a decode-only step pads to; `None` for any other step.
    fn bucket_size(&self, batch: &StepBatch) -> Option<usize> {
        let decodes = batch
            .seqs
            .iter()
            .all(|s| s.tokens.len() == 1 && s.logits != Logits::None);
        if !self.status.on || !decodes || batch.seqs.is_empty() {
            return None;
        }
        BUCKETS.iter().copied().find(|&b| b >= batch.seqs.len())
    }

    fn drop_graphs(&mut self) {
        #[cfg(feature = "cuda")]
        for b in &mut self.buckets {
            b.graph = None;
        }
    }

    /// Runs bucket `at`'s step eagerly into its logits, and on a GPU then captures it. candle
    /// uploads some kernel parameters from the host, which a capture cannot: under its cache
    /// the eager run stores them on the device and the capture reads them there. A failed
    /// capture is logged once and leaves the path eager.
    fn first_run(&mut self, at: usize, plan: &StepPlan, run: &Run<'_>) -> Result<()> {
        let logits = self.buckets[at].logits.clone();
        let step = || -> Result<()> { Ok(logits.slice_set(&run(plan)?, 0, 0)?) };
        #[cfg(feature = "cuda")]
        if let (Device::Cuda(dev), None) = (logits.device(), &self.status.capture_failed) {
            let _cached = dev.enable_cuda_graph_htod_cache();
            step()?;
            match cuda::capture(dev, step) {
                Ok(graph) => {
                    let size = self.buckets[at].size;
                    tracing::info!(
                        bucket = size,
                        "decode steps of this batch size replay a CUDA graph"
                    );
                    self.buckets[at].graph = Some(graph);
                    self.status.captured += 1;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot capture decode steps as CUDA graphs; running them eagerly");
                    self.status.capture_failed = Some(e.to_string());
                }
            }
            return Ok(());
        }
        step()
    }
}

impl HostStep {
    /// `batch`'s decode rows, then padding up to `size` rows: token 0 at position 0 in the
    /// scratch block, each seeing that one position.
    fn new(batch: &StepBatch, size: usize, block_size: usize, scratch: u32) -> Self {
        let mut h = Self::default();
        let pad = [scratch];
        for row in 0..size {
            let (token, pos, table) = match batch.seqs.get(row) {
                Some(s) => (s.tokens[0], s.start_pos, &s.block_table[..]),
                None => (0, 0, &pad[..]),
            };
            h.tokens.push(token);
            h.positions.push(pos as u32);
            h.slots.push(slot_of(table, pos, block_size));
            h.meta.push_chunk(row, pos, 1, table, block_size);
        }
        h
    }
}

impl Bucket {
    fn new(size: usize, config: &LlamaConfig, block_size: usize, device: &Device) -> Result<Self> {
        let rows = |n: usize| Tensor::zeros(n, DType::U32, device);
        let max_blocks = config.context_length.div_ceil(block_size);
        let ids: Vec<u32> = (0..size as u32).collect();
        Ok(Self {
            size,
            tokens: rows(size)?,
            positions: rows(size)?,
            slots: rows(size)?,
            logit_rows: Tensor::from_vec(ids, size, device)?,
            meta: rows(size * (3 + max_blocks))?,
            logits: Tensor::zeros((size, config.vocab_size), DType::F32, device)?,
            #[cfg(feature = "cuda")]
            graph: None,
        })
    }

    /// Writes `host` into the fixed tensors.
    fn upload(&self, host: HostStep) -> Result<()> {
        debug_assert_eq!(host.meta.rows(), self.size);
        let words = host.meta.into_words();
        for (t, v) in [
            (&self.tokens, &host.tokens[..]),
            (&self.positions, &host.positions[..]),
            (&self.slots, &host.slots[..]),
            (&self.meta, &words[..]),
        ] {
            t.inplace_op1(&Upload(v))?;
        }
        Ok(())
    }

    /// The plan over the fixed tensors: every row paged.
    fn plan(&self, config: &LlamaConfig, block_size: usize) -> StepPlan {
        let paged = PagedAttention {
            meta: self.meta.clone(),
            rows: self.size,
            heads: config.head_count,
            kv_heads: config.head_count_kv,
            head_dim: config.head_dim,
            block_size,
            splits: super::paged::splits_for(self.size, config.head_count_kv),
        };
        StepPlan::decodes(
            (&self.tokens, &self.positions, &self.slots),
            &self.logit_rows,
            paged,
        )
    }

    #[cfg(feature = "cuda")]
    fn has_graph(&self) -> bool {
        self.graph.is_some()
    }

    #[cfg(not(feature = "cuda"))]
    fn has_graph(&self) -> bool {
        false
    }

    #[cfg(feature = "cuda")]
    fn launch(&self) -> Result<()> {
        match &self.graph {
            Some(g) => cuda::launch(g),
            None => Err(ModelError::Device("no captured step to replay".into())),
        }
    }

    #[cfg(not(feature = "cuda"))]
    fn launch(&self) -> Result<()> {
        Err(ModelError::Device(
            "CUDA graphs need a build with the `cuda` feature".into(),
        ))
    }
}

/// The op: `t.inplace_op1(&Upload(values))` writes `values` (u32) over the start of `t`.
#[derive(Debug)]
struct Upload<'a>(&'a [u32]);

impl Upload<'_> {
    fn check(&self, layout: &Layout) -> candle_core::Result<usize> {
        let start = layout.start_offset();
        if !layout.is_contiguous() || self.0.len() > layout.shape().elem_count() {
            candle_core::bail!(
                "upload: {} values do not fit a contiguous {:?}",
                self.0.len(),
                layout.dims()
            );
        }
        Ok(start)
    }
}

impl InplaceOp1 for Upload<'_> {
    fn name(&self) -> &'static str {
        "upload"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let start = self.check(layout)?;
        let CpuStorage::U32(v) = s else {
            candle_core::bail!("upload: the tensor is not u32");
        };
        v[start..start + self.0.len()].copy_from_slice(self.0);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &mut candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<()> {
        let start = self.check(layout)?;
        cuda::upload(s, start, self.0)
    }
}

// Capturing and replaying graphs and copying to the device are FFI calls (the crate's other
// unsafe code is the CPU kernels').
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod cuda {
    //! Capture, replay and upload on candle's CUDA stream.

    use candle_core::cuda::cudarc::driver::safe::CudaGraph;
    use candle_core::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    use candle_core::{CudaDevice, CudaStorage};

    use crate::error::{ModelError, Result};

    /// A captured step.
    pub(super) struct Captured(CudaGraph);

    // SAFETY: CUDA graph objects may be used from any thread if calls on one are serialised
    // (cudarc's `CudaGraph` notes); a `Captured` lives in a `Replay`, which the model keeps
    // behind a mutex, so one thread at a time replays or drops it.
    unsafe impl Send for Captured {}

    impl std::fmt::Debug for Captured {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Captured")
        }
    }

    /// Records what `record` launches on `dev`'s stream, without running it (the caller holds
    /// candle's parameter cache, see [`super::Replay::first_run`]).
    pub(super) fn capture(
        dev: &CudaDevice,
        record: impl FnOnce() -> Result<()>,
    ) -> Result<Captured> {
        let stream = dev.cuda_stream();
        let device_err = |e: candle_core::cuda::cudarc::driver::DriverError| {
            ModelError::Device(format!("CUDA graph capture: {e}"))
        };
        stream.synchronize().map_err(device_err)?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(device_err)?;
        let recorded = record();
        // Ends the capture whatever happened, so the stream leaves capture mode.
        let graph = stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        recorded?;
        let graph = graph
            .map_err(device_err)?
            .ok_or_else(|| ModelError::Device("CUDA graph capture recorded nothing".into()))?;
        graph.upload().map_err(device_err)?;
        Ok(Captured(graph))
    }

    /// Replays a captured step on its stream.
    pub(super) fn launch(c: &Captured) -> Result<()> {
        c.0.launch()
            .map_err(|e| ModelError::Device(format!("CUDA graph launch: {e}")))
    }

    /// Copies `values` into `s` from element `start`.
    pub(super) fn upload(
        s: &mut CudaStorage,
        start: usize,
        values: &[u32],
    ) -> candle_core::Result<()> {
        let dev = s.device.clone();
        let slice = s.as_cuda_slice_mut::<u32>()?;
        let mut to = slice.slice_mut(start..start + values.len());
        dev.memcpy_htod(values, &mut to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::SeqChunk;

    fn decode(token: u32, pos: usize, table: Vec<u32>) -> SeqChunk {
        SeqChunk {
            tokens: vec![token],
            start_pos: pos,
            block_table: table,
            logits: Logits::Last,
        }
    }

    #[test]
    fn a_step_pads_to_its_bucket_with_scratch_rows() {
        let mut batch = StepBatch::new();
        batch.push(decode(7, 5, vec![3, 9]));
        batch.push(decode(8, 0, vec![2]));
        batch.push(decode(9, 4, vec![1, 6]));
        let replay = Replay::new(true);
        assert_eq!(replay.bucket_size(&batch), Some(4));
        let h = HostStep::new(&batch, 4, 4, 11);
        assert_eq!(h.tokens, [7, 8, 9, 0]);
        assert_eq!(h.positions, [5, 0, 4, 0]);
        // Position 5 with blocks of 4 is block 9's second slot; padding writes block 11.
        assert_eq!(h.slots, [9 * 4 + 1, 2 * 4, 6 * 4, 11 * 4]);
        assert_eq!(h.meta.rows(), 4);
        assert_eq!(h.meta.q_rows().collect::<Vec<_>>(), [0, 1, 2, 3]);
    }

    #[test]
    fn only_decode_steps_take_the_path() {
        let mut replay = Replay::new(true);
        let mut batch = StepBatch::new();
        assert_eq!(replay.bucket_size(&batch), None, "an empty step");
        batch.push(decode(1, 3, vec![0]));
        assert_eq!(replay.bucket_size(&batch), Some(1));
        let mut prefill = batch.clone();
        prefill.push(SeqChunk {
            tokens: vec![1, 2],
            start_pos: 0,
            block_table: vec![1],
            logits: Logits::Last,
        });
        assert_eq!(replay.bucket_size(&prefill), None, "a prefill chunk");
        let mut quiet = batch.clone();
        quiet.seqs[0].logits = Logits::None;
        assert_eq!(replay.bucket_size(&quiet), None, "a row without logits");
        let mut wide = StepBatch::new();
        for i in 0..=BUCKETS[BUCKETS.len() - 1] {
            wide.push(decode(1, i, vec![0]));
        }
        assert_eq!(replay.bucket_size(&wide), None, "past the largest bucket");
        replay.set(false);
        assert_eq!(replay.bucket_size(&batch), None, "off");
    }

    #[test]
    fn upload_writes_the_start_of_a_tensor_and_refuses_overflow() {
        let t = Tensor::zeros(5, DType::U32, &Device::Cpu).unwrap();
        t.inplace_op1(&Upload(&[4, 5])).unwrap();
        assert_eq!(t.to_vec1::<u32>().unwrap(), [4, 5, 0, 0, 0]);
        assert!(t.inplace_op1(&Upload(&[1; 6])).is_err());
    }
}
