//! The Llama forward pass on candle tensors: the backend that runs on a GPU (`--device cuda:N`)
//! and, for testing, on the CPU (`--backend candle`).
//!
//! Same contract as [`crate::Llama::forward`]: a ragged [`StepBatch`] in, logits for the
//! requested rows out as f32 `[rows, vocab]` on the host ([`HostLogits`], on a GPU copied into
//! a page-locked buffer, see [`pinned`]); K and V live in a block pool on the
//! device ([`DeviceKv`]). GGUF's quantized weights stay quantized on the device (candle's
//! `QMatMul`), f16/bf16/f32 stay dense. The ops are candle-core's and candle-nn's: RMS norm,
//! interleaved RoPE (GGUF's layout), SiLU, softmax. Attention reads the pool through each
//! sequence's block table with a paged-attention op ([`paged`], a CUDA kernel on a GPU), or
//! gathers each sequence's keys and values by slot into batched ops (see [`attention`] for
//! which rows take which path).

mod attention;
#[cfg(test)]
mod emulator;
mod fused;
mod kv;
mod linear;
mod operands;
mod paged;
#[cfg(test)]
mod paged_tests;
mod picks;
pub(crate) mod pinned;
mod profile;
mod replay;

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Device, Tensor};
use candle_nn::ops::rms_norm;

pub use attention::{AttentionPath, PAGED_MAX_CHUNK};
pub use kv::DeviceKv;
use kv::StepRows;
pub use replay::{from_env as cuda_graphs_from_env, GraphStatus};

use crate::adjust::Adjust;
use crate::batch::{Pick, StepBatch};
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::host_logits::HostLogits;
use crate::kernels::rope::RopeTable;
use crate::kv::KvStore;
use crate::weights::WeightSource;
use attention::StepPlan;
use fused::{add_rms_norm, rotate_queries, swiglu};
use linear::{read_matrix, Linear, Place, Weight};
use pinned::PinnedLogits;
use profile::{Clock, Phase, Profiler};
use replay::Replay;

/// The token embeddings: kept in their stored type (quantized rows are dequantized as they are
/// looked up), so a quantized table costs its file size, not four bytes per weight.
#[derive(Debug)]
enum Embedding {
    Quant(Arc<QTensor>),
    Dense(Tensor),
}

#[derive(Debug)]
struct Layer {
    attn_norm: Tensor,
    /// `[q; k; v]` stacked.
    wqkv: Linear,
    wo: Linear,
    ffn_norm: Tensor,
    /// `[gate; up]` stacked.
    wgate_up: Linear,
    wdown: Linear,
}

/// A step's RoPE rotations: each token's row of the tables, `[n, head_dim / 2]`.
#[derive(Debug)]
struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    fn at(cos: &Tensor, sin: &Tensor, positions: &Tensor) -> Result<Self> {
        Ok(Self {
            cos: cos.index_select(positions, 0)?,
            sin: sin.index_select(positions, 0)?,
        })
    }

    /// The queries of `qkv` rotated, as `[n, heads, head_dim]`. (Keys are rotated as the pool
    /// stores them, see [`DeviceKv::write`].)
    fn queries(&self, qkv: &Tensor, c: &LlamaConfig) -> Result<Tensor> {
        let tables = (&self.cos, &self.sin);
        Ok(rotate_queries(qkv, tables, c.head_count, c.head_dim)?)
    }
}

/// A Llama network on a candle device. Immutable: per-step state lives in the caller's
/// [`KvStore`].
#[derive(Debug)]
pub struct CandleLlama {
    config: LlamaConfig,
    device: Device,
    embed: Embedding,
    /// The output projection, or the embeddings when they are tied.
    head: Weight,
    /// Whether `head` shares the embeddings' memory.
    tied: bool,
    output_norm: Tensor,
    layers: Vec<Layer>,
    /// `[context, head_dim / 2]` f32.
    cos: Tensor,
    sin: Tensor,
    /// CPU only: the threads candle's CPU ops run on (`--threads`).
    threads: Option<Arc<rayon::ThreadPool>>,
    /// Per-phase step time, when [`CandleLlama::set_profiling`] turned it on.
    profiler: Profiler,
    /// The [`AttentionPath`] steps take ([`CandleLlama::set_attention`]), as its index.
    attention: AtomicU8,
    /// Decode steps from fixed inputs, captured as CUDA graphs on a GPU ([`replay`]).
    replay: Mutex<Replay>,
    /// How the logits reach the host ([`pinned`]).
    pinned: PinnedLogits,
    /// Whether greedy ids are picked on the device ([`picks`]).
    device_argmax: AtomicBool,
    /// Whether draws at a temperature are made on the device ([`picks`]).
    device_draws: AtomicBool,
}

impl CandleLlama {
    /// Loads every tensor onto `device`, checking each shape against the config.
    pub fn load(
        source: &mut dyn WeightSource,
        config: LlamaConfig,
        device: &Device,
        threads: usize,
    ) -> Result<Self> {
        source.check_tensor_types()?;
        let place = Place {
            device: device.clone(),
            pool: match device {
                Device::Cpu => Some(Arc::new(cpu_threads(threads)?)),
                _ => None,
            },
        };
        let d = config.embedding_length;
        let table = read_matrix(source, "token_embd.weight", config.vocab_size, d)?;
        let tied = !source.has_tensor("output.weight");
        let (embed, head) = if tied {
            tie(table, &place)?
        } else {
            let out = read_matrix(source, "output.weight", config.vocab_size, d)?;
            (
                embedding(table, &place)?,
                Weight::from_qtensor(out, &place)?,
            )
        };
        let output_norm = read_vector(source, "output_norm.weight", d, device)?;
        let layers = (0..config.block_count)
            .map(|i| load_layer(source, &config, i, &place))
            .collect::<Result<_>>()?;
        let rope = RopeTable::new(
            config.head_dim,
            config.rope_freq_base,
            config.context_length,
        );
        let (cos, sin) = rope.tables();
        let half = config.head_dim / 2;
        let shape = (config.context_length, half);
        let threads = place.pool;
        let from_env = attention_from_env()?;
        let attention = ATTENTION_PATHS
            .iter()
            .position(|&p| p == from_env)
            .unwrap_or(0);
        Ok(Self {
            cos: Tensor::from_slice(cos, shape, device)?,
            sin: Tensor::from_slice(sin, shape, device)?,
            config,
            device: device.clone(),
            embed,
            head,
            tied,
            output_norm,
            layers,
            threads,
            profiler: Profiler::default(),
            attention: AtomicU8::new(attention as u8),
            replay: Mutex::new(Replay::new(replay::from_env())),
            pinned: PinnedLogits::new(pinned::from_env()),
            device_argmax: AtomicBool::new(picks::argmax_from_env()),
            device_draws: AtomicBool::new(picks::draws_from_env()),
        })
    }

    /// Turns per-phase timing of each step on or off (clearing it). While on, the device is
    /// synchronised at every phase boundary: steps get slower, and for measurement only.
    pub fn set_profiling(&self, on: bool) {
        self.profiler.set(on);
    }

    /// Seconds spent in each phase of the steps since profiling was turned on (or last
    /// taken), by phase name in step order; clears them.
    pub fn take_profile(&self) -> Vec<(&'static str, f64)> {
        self.profiler.take()
    }

    /// Chooses the attention path of the following steps (default [`AttentionPath::Auto`]):
    /// how gpucheck and the tests compare the paged op with the gather path.
    pub fn set_attention(&self, path: AttentionPath) {
        let i = ATTENTION_PATHS.iter().position(|&p| p == path).unwrap_or(0);
        self.attention.store(i as u8, Ordering::Relaxed);
    }

    /// The attention path steps take.
    pub fn attention(&self) -> AttentionPath {
        ATTENTION_PATHS[usize::from(self.attention.load(Ordering::Relaxed))]
    }

    /// Turns replayed decode steps on or off (default: `SLUICE_CUDA_GRAPHS`, see [`replay`]):
    /// how gpucheck and the tests compare them with eager steps.
    pub fn set_cuda_graphs(&self, on: bool) {
        self.replay().set(on);
    }

    /// Whether decode steps are replayed, how many were, and why capturing failed if it did.
    pub fn cuda_graphs(&self) -> GraphStatus {
        self.replay().status()
    }

    /// Turns the page-locked logits buffers on or off (default: `SLUICE_PINNED_LOGITS`, see
    /// [`pinned`]): how gpucheck compares them with copies through pageable memory.
    pub fn set_pinned_logits(&self, on: bool) {
        self.pinned.set(on);
    }

    /// Whether a GPU step copies its logits into a page-locked buffer (it stops after an
    /// allocation failed).
    pub fn pinned_logits(&self) -> bool {
        self.pinned.is_on()
    }

    /// Turns picking greedy ids on the device on or off (default: `SLUICE_DEVICE_ARGMAX`, see
    /// [`picks`]): off, rows that ask for their greedy id alone come back whole.
    pub fn set_device_argmax(&self, on: bool) {
        self.device_argmax.store(on, Ordering::Relaxed);
    }

    /// Turns draws at a temperature on the device on or off (default: `SLUICE_DEVICE_DRAWS`,
    /// see [`picks`]): off, rows that ask for a draw or a top list alone come back whole.
    pub fn set_device_draws(&self, on: bool) {
        self.device_draws.store(on, Ordering::Relaxed);
    }

    /// Whether this model picks `pick`'s token on its device rather than returning the row.
    fn picks_on_device(&self, pick: &Pick) -> bool {
        match pick {
            Pick::Argmax { .. } => self.device_argmax.load(Ordering::Relaxed),
            Pick::Draw { .. } | Pick::Top { .. } => self.device_draws.load(Ordering::Relaxed),
        }
    }

    fn replay(&self) -> MutexGuard<'_, Replay> {
        self.replay.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes the weights take on the device (embeddings and every matrix).
    pub fn weight_bytes(&self) -> usize {
        let embed = match &self.embed {
            Embedding::Quant(q) => q.storage_size_in_bytes(),
            Embedding::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
        };
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.wqkv.bytes() + l.wo.bytes() + l.wgate_up.bytes() + l.wdown.bytes())
            .sum();
        layers + embed + if self.tied { 0 } else { self.head.bytes() }
    }

    /// Compute threads on the CPU; 0 on a GPU.
    pub fn threads(&self) -> usize {
        self.threads.as_ref().map_or(0, |t| t.current_num_threads())
    }

    /// A block pool on this model's device.
    pub fn new_kv_store(&self, num_blocks: usize, block_size: usize) -> Result<KvStore> {
        let pool = DeviceKv::new(&self.config, num_blocks, block_size, &self.device)?;
        Ok(KvStore::on_device(pool, num_blocks, block_size))
    }

    /// Runs one step over a ragged batch and returns logits `[rows, vocab]` (f32, on the CPU)
    /// for the rows the batch asks for, in sequence order: [`CandleLlama::forward_host`] as a
    /// tensor, for callers that compute on them with candle.
    pub fn forward(&self, batch: &StepBatch, kv: &mut KvStore) -> Result<Tensor> {
        self.forward_host(batch, kv)?.into_tensor()
    }

    /// Runs one step over a ragged batch and returns the logits of the rows the batch asks
    /// for, in sequence order, on the host.
    pub fn forward_host(&self, batch: &StepBatch, kv: &mut KvStore) -> Result<HostLogits> {
        self.forward_host_adjusted(batch, kv, &[])
    }

    /// [`CandleLlama::forward_host`], with the changes `adjust[s]` (one per sequence of the
    /// batch, or none at all) applied on the device to the rows of sequences that ask for a
    /// picked token ([`crate::Logits::Pick`]) before it is picked. A row that comes back whole
    /// comes back as the model computed it: the caller applies its changes itself.
    pub fn forward_host_adjusted(
        &self,
        batch: &StepBatch,
        kv: &mut KvStore,
        adjust: &[Option<Adjust>],
    ) -> Result<HostLogits> {
        kv.validate(batch, &self.config)?;
        let block_size = kv.block_size();
        let pool = kv.device_pool()?;
        // Steps of one model run one at a time (captured steps share its fixed inputs and
        // candle's scratch buffers). The lock is taken here, on the caller's thread: inside
        // the CPU pool a thread waiting for its parallel work runs other queued jobs, and one
        // of those taking the lock again would wait on itself.
        let mut replay = self.replay();
        let replay = &mut *replay;
        let step = (batch, adjust);
        match &self.threads {
            Some(t) => t.install(|| self.forward_validated(step, (block_size, pool), replay)),
            None => self.forward_validated(step, (block_size, pool), replay),
        }
    }

    /// The step's logits on the host, copied while the replay lock is held (a replayed step's
    /// logits are a view of a fixed tensor the next step overwrites).
    fn forward_validated(
        &self,
        (batch, adjust): (&StepBatch, &[Option<Adjust>]),
        (block_size, pool): (usize, &DeviceKv),
        replay: &mut Replay,
    ) -> Result<HostLogits> {
        let c = &self.config;
        if batch.seqs.is_empty() {
            return Ok(HostLogits::new(Vec::new(), c.vocab_size));
        }
        if let Some(logits) = self.replayed(batch, (block_size, pool), replay)? {
            return self.to_host(&logits, batch, adjust);
        }
        let mut clock = self.profiler.clock(&self.device)?;
        let plan = StepPlan::new(batch, c, (block_size, self.attention()), &self.device)?;
        clock.mark(Phase::Plan)?;
        let logits = self.run(&plan, pool, &mut clock)?;
        let logits = self.to_host(&logits, batch, adjust)?;
        clock.mark(Phase::Logits)?;
        Ok(logits)
    }

    /// `logits` (the step's rows, on the device) on the host: the rows whose sequence asks
    /// for a picked token alone reduced to it on the device ([`picks`], after its sequence's
    /// changes in `adjust`), the others copied whole ([`pinned`]).
    fn to_host(
        &self,
        logits: &Tensor,
        batch: &StepBatch,
        adjust: &[Option<Adjust>],
    ) -> Result<HostLogits> {
        let picks: Vec<Option<Pick>> = batch
            .picks()
            .into_iter()
            .map(|p| p.filter(|p| self.picks_on_device(p)))
            .collect();
        if picks.iter().all(Option::is_none) {
            return self.pinned.to_host(logits);
        }
        let adjust: Vec<Option<&Adjust>> = batch
            .logit_row_seqs()
            .into_iter()
            .map(|s| adjust.get(s).and_then(Option::as_ref))
            .collect();
        let answers = picks::answers(logits, &picks, &adjust)?;
        // The rest (no pick, or a nucleus past its top list) go whole, in one copy.
        let picked: Vec<bool> = answers.iter().map(Option::is_some).collect();
        let whole: Vec<u32> = (0..picked.len() as u32)
            .filter(|&i| !picked[i as usize])
            .collect();
        let whole = if whole.is_empty() {
            HostLogits::new(Vec::new(), self.config.vocab_size)
        } else {
            let at = Tensor::new(whole.as_slice(), logits.device())?;
            self.pinned.to_host(&logits.index_select(&at, 0)?)?
        };
        Ok(whole.with_picked(&picked, answers.into_iter().flatten().collect()))
    }

    /// `batch` as a replayed decode step, when it is one and the path is on (and the step is
    /// not profiled, which synchronises between phases); `None` after noting an eager step.
    fn replayed(
        &self,
        batch: &StepBatch,
        (block_size, pool): (usize, &DeviceKv),
        replay: &mut Replay,
    ) -> Result<Option<Tensor>> {
        let path = self.attention().for_model(&self.device, &self.config);
        if path.pages(1) && !self.profiler.is_on() {
            let run = |plan: &StepPlan| {
                let mut clock = self.profiler.clock(&self.device)?;
                self.run(plan, pool, &mut clock)
            };
            let at = (pool, block_size);
            let on = (&self.config, &self.device);
            if let Some(logits) = replay.step(batch, at, on, &run)? {
                return Ok(Some(logits));
            }
        }
        replay.ran_eagerly(batch.num_tokens());
        Ok(None)
    }

    /// The layers over `plan`: the logits of its logit rows, f32, on the device.
    fn run(&self, plan: &StepPlan, pool: &DeviceKv, clock: &mut Clock<'_>) -> Result<Tensor> {
        let c = &self.config;
        let mut x = match &self.embed {
            Embedding::Quant(q) => q.embedding(&plan.tokens)?,
            Embedding::Dense(t) => t.index_select(&plan.tokens, 0)?.to_dtype(DType::F32)?,
        };
        let rope = Rope::at(&self.cos, &self.sin, &plan.positions)?;
        // Each layer hands the next its residual stream and that stream normed with the next
        // norm's weights (the last layer's: the output norm), fused with the residual add.
        let mut h = rms_norm(&x, self.attn_norm(0), c.rms_norm_eps)?;
        clock.mark(Phase::Embed)?;
        for (li, layer) in self.layers.iter().enumerate() {
            (x, h) = self.layer((li, layer), (&x, &h), (plan, pool), &rope, clock)?;
        }
        if plan.num_logit_rows == 0 {
            return Ok(Tensor::zeros((0, c.vocab_size), DType::F32, &Device::Cpu)?);
        }
        // Only the rows that need logits go through the vocabulary product.
        let normed = h.index_select(&plan.logit_rows, 0)?;
        Ok(self.head.forward(&normed)?.to_dtype(DType::F32)?)
    }

    /// The norm before layer `li`'s attention; past the last layer, the output norm.
    fn attn_norm(&self, li: usize) -> &Tensor {
        self.layers
            .get(li)
            .map_or(&self.output_norm, |l| &l.attn_norm)
    }

    /// One transformer block: the residual stream `x` `[n, d]` and `h`, `x` normed for this
    /// block's attention, in; the next stream and it normed for what follows out.
    fn layer(
        &self,
        (li, layer): (usize, &Layer),
        (x, h): (&Tensor, &Tensor),
        (plan, pool): (&StepPlan, &DeviceKv),
        rope: &Rope,
        clock: &mut Clock<'_>,
    ) -> Result<(Tensor, Tensor)> {
        let c = &self.config;
        let eps = c.rms_norm_eps;
        let qkv = layer.wqkv.forward(h)?;
        clock.mark(Phase::Qkv)?;
        let q = rope.queries(&qkv, c)?;
        clock.mark(Phase::Rope)?;
        let rows = StepRows {
            slots: &plan.slots,
            cos: &rope.cos,
            sin: &rope.sin,
        };
        pool.write(li, &qkv, rows, c)?;
        clock.mark(Phase::KvWrite)?;
        let attn = attention::attend(&q, pool.layer(li), plan, c)?;
        clock.mark(Phase::Attention)?;
        let out = layer.wo.forward(&attn)?;
        clock.mark(Phase::Wo)?;
        let (x, h) = add_rms_norm(x, &out, &layer.ffn_norm, eps)?;
        clock.mark(Phase::Norm)?;
        let gate_up = layer.wgate_up.forward(&h)?;
        clock.mark(Phase::GateUp)?;
        let act = swiglu(&gate_up)?;
        clock.mark(Phase::Act)?;
        let down = layer.wdown.forward(&act)?;
        clock.mark(Phase::Down)?;
        let next = add_rms_norm(&x, &down, self.attn_norm(li + 1), eps)?;
        clock.mark(Phase::Norm)?;
        Ok(next)
    }
}

/// [`CandleLlama::attention`]'s values, by index.
const ATTENTION_PATHS: [AttentionPath; 4] = [
    AttentionPath::Auto,
    AttentionPath::Gather,
    AttentionPath::Paged,
    AttentionPath::Split,
];

/// An on/off switch read from the environment, for measuring one way of running against
/// another in any binary: `1`, `on` or `true` turn it on, `0`, `off` or `false` off; unset or
/// anything else leaves `default`.
fn env_switch(name: &str, default: bool) -> bool {
    match std::env::var(name).as_deref().map(str::trim) {
        Ok("1" | "on" | "true") => true,
        Ok("0" | "off" | "false") => false,
        _ => default,
    }
}

/// The attention path a model starts with: `SLUICE_ATTENTION` (auto, gather, paged or split) when
/// set, else [`AttentionPath::Auto`]. A switch for every binary, for measuring one path
/// against the other.
fn attention_from_env() -> Result<AttentionPath> {
    match std::env::var("SLUICE_ATTENTION") {
        Ok(s) => s
            .parse()
            .map_err(|e| ModelError::Device(format!("SLUICE_ATTENTION: {e}"))),
        Err(_) => Ok(AttentionPath::default()),
    }
}

/// The threads candle's CPU ops and the kernels' products run on (`--threads`).
fn cpu_threads(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("sluice-candle-{i}"))
        .build()
        .map_err(|e| ModelError::Device(format!("cannot start threads: {e}")))
}

/// A separate embedding table.
fn embedding(table: QTensor, place: &Place) -> Result<Embedding> {
    if Weight::runs_on_kernels(&table, place) {
        return Ok(Embedding::Quant(Arc::new(table)));
    }
    Ok(match Weight::from_qtensor(table, place)? {
        Weight::Quant(QMatMul::QTensor(q)) => Embedding::Quant(q),
        Weight::Quant(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) | Weight::Dense(t) => {
            Embedding::Dense(t)
        }
        Weight::Kernel(_) => unreachable!("handled above"),
    })
}

/// Embeddings tied to the output projection: one copy on the device serves both (on the CPU
/// with Q4_1, the kernels' product keeps its own copy of the blocks).
fn tie(table: QTensor, place: &Place) -> Result<(Embedding, Weight)> {
    if Weight::runs_on_kernels(&table, place) {
        let head = Weight::kernel_product(&table, place)?;
        return Ok((Embedding::Quant(Arc::new(table)), head));
    }
    Ok(match Weight::from_qtensor(table, place)? {
        Weight::Quant(QMatMul::QTensor(q)) => (
            Embedding::Quant(q.clone()),
            Weight::Quant(QMatMul::QTensor(q)),
        ),
        Weight::Quant(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) | Weight::Dense(t) => {
            (Embedding::Dense(t.clone()), Weight::Dense(t))
        }
        Weight::Kernel(_) => unreachable!("handled above"),
    })
}

fn load_layer(
    source: &mut dyn WeightSource,
    config: &LlamaConfig,
    i: usize,
    place: &Place,
) -> Result<Layer> {
    let device = &place.device;
    let (d, ff, hd) = (
        config.embedding_length,
        config.feed_forward_length,
        config.head_dim,
    );
    let kv = config.kv_width();
    let name = |t: &str| format!("blk.{i}.{t}.weight");
    let mut m = |t: &str, rows, cols| read_matrix(source, &name(t), rows, cols);
    let q = m("attn_q", config.head_count * hd, d)?;
    let k = m("attn_k", kv, d)?;
    let v = m("attn_v", kv, d)?;
    let wo = m("attn_output", d, config.head_count * hd)?;
    let gate = m("ffn_gate", ff, d)?;
    let up = m("ffn_up", ff, d)?;
    let down = m("ffn_down", d, ff)?;
    Ok(Layer {
        attn_norm: read_vector(source, &name("attn_norm"), d, device)?,
        wqkv: Linear::stack(vec![q, k, v], place)?,
        wo: Linear::stack(vec![wo], place)?,
        ffn_norm: read_vector(source, &name("ffn_norm"), d, device)?,
        wgate_up: Linear::stack(vec![gate, up], place)?,
        wdown: Linear::stack(vec![down], place)?,
    })
}

/// A norm weight as f32 on the device, checking its length.
fn read_vector(
    source: &mut dyn WeightSource,
    name: &str,
    len: usize,
    device: &Device,
) -> Result<Tensor> {
    let t = source.read_qtensor(name)?.dequantize(&Device::Cpu)?;
    if t.dims() != [len] {
        return Err(ModelError::Unsupported(format!(
            "tensor {name} in {} has shape {:?}, expected [{len}]",
            source.describe(),
            t.dims()
        )));
    }
    Ok(t.to_device(device)?)
}

/// `(free, total)` bytes of a GPU's memory, read after its queued work finished; `None` on the
/// CPU.
pub(crate) fn device_memory(device: &Device) -> Result<Option<(usize, usize)>> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            device.synchronize()?;
            let info = d.cuda_stream().context().mem_get_info();
            info.map(Some).map_err(|e| {
                ModelError::Device(format!("cannot read the GPU's free memory: {e:?}"))
            })
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::env_switch;

    /// Each case its own variable: tests run on threads of one process.
    #[test]
    fn switches_read_on_and_off_words_and_keep_their_default_otherwise() {
        let cases = [
            (None, false, false),
            (None, true, true),
            (Some(" on "), false, true),
            (Some("1"), false, true),
            (Some("true"), false, true),
            (Some("0"), true, false),
            (Some("off"), true, false),
            (Some("false"), true, false),
            (Some("yes"), false, false),
            (Some("yes"), true, true),
        ];
        for (i, (value, default, want)) in cases.into_iter().enumerate() {
            let name = format!("SLUICE_TEST_SWITCH_{i}");
            if let Some(v) = value {
                std::env::set_var(&name, v);
            }
            assert_eq!(env_switch(&name, default), want, "{name}={value:?}");
        }
    }
}
