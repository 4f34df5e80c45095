//! [`Model`]: a model file loaded into everything a replica needs to serve it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};

use crate::adjust::Adjust;
use crate::batch::StepBatch;
use crate::candle::CandleLlama;
use crate::chat_template::ChatTemplate;
use crate::config::LlamaConfig;
use crate::device::{Backend, DeviceSpec};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::hf::{self, HfDir};
use crate::host_logits::HostLogits;
use crate::kv::KvStore;
use crate::llama::Llama;
use crate::tokenizer::{SpecialIds, Tokenizer};
use crate::weights::WeightSource;

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct ModelOptions {
    pub device: DeviceSpec,
    /// Which forward pass runs; [`Backend::resolve`] picks it from the command line.
    pub backend: Backend,
    /// Compute threads on the CPU; 0 means one per available core.
    pub threads: usize,
}

/// The network in the form one backend runs it.
// One per loaded model: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Network {
    Kernels(Llama),
    Candle(CandleLlama),
}

impl Network {
    /// Builds the network from its weights for the backend and device the options name.
    pub fn build(
        weights: &mut dyn WeightSource,
        config: LlamaConfig,
        options: &ModelOptions,
        device: &Device,
    ) -> Result<Self> {
        let threads = match options.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        Ok(match options.backend {
            Backend::Kernels => Self::Kernels(Llama::load(weights, config, threads)?),
            Backend::Candle => Self::Candle(CandleLlama::load(weights, config, device, threads)?),
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        match self {
            Self::Kernels(l) => l.config(),
            Self::Candle(c) => c.config(),
        }
    }

    /// Bytes of weights one forward step reads.
    pub fn weight_bytes(&self) -> usize {
        match self {
            Self::Kernels(l) => l.weight_bytes(),
            Self::Candle(c) => c.weight_bytes(),
        }
    }

    /// CPU compute threads (0 on a GPU).
    pub fn threads(&self) -> usize {
        match self {
            Self::Kernels(l) => l.threads(),
            Self::Candle(c) => c.threads(),
        }
    }

    /// Floating-point operations (multiply and add counted apart) one token costs at context
    /// `ctx`: every matrix product plus attention's `q·K` and `p·V`.
    pub fn flops_per_token(&self, ctx: usize) -> f64 {
        let c = self.config();
        let (d, hd, ff) = (c.embedding_length, c.head_dim, c.feed_forward_length);
        let q = c.head_count * hd;
        let per_layer = d * (q + 2 * c.kv_width()) + q * d + 3 * ff * d;
        let matrices = (c.block_count * per_layer + c.vocab_size * d) as f64;
        let attention = (c.block_count * q * ctx) as f64 * 2.0;
        2.0 * (matrices + attention)
    }
}

/// A model as read from disk, before its network is built for a backend: the weights (still
/// in the files, read tensor by tensor), the architecture, the tokenizer and the chat template.
#[derive(Debug)]
pub struct ModelSource {
    pub weights: Box<dyn WeightSource>,
    pub config: LlamaConfig,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
}

impl ModelSource {
    /// Opens a model in either format: a directory is a Hugging Face model (`config.json`,
    /// `tokenizer.json`, `*.safetensors`), a file is GGUF. Beside a GGUF file, a
    /// `tokenizer.json`, when present, replaces the tokenizer built from the GGUF metadata.
    pub fn open(path: &Path) -> Result<Self> {
        let source = if path.is_dir() {
            Self::open_hf(path)?
        } else {
            Self::open_gguf(path)?
        };
        if source.tokenizer.vocab_size() > source.config.vocab_size {
            return Err(ModelError::Unsupported(format!(
                "the tokenizer has {} tokens but the model's vocabulary is {}",
                source.tokenizer.vocab_size(),
                source.config.vocab_size
            )));
        }
        source.weights.check_tensor_types()?;
        Ok(source)
    }

    fn open_hf(path: &Path) -> Result<Self> {
        let weights = HfDir::open(path)?;
        let tokenizer = hf::tokenizer(path)?;
        let chat_template = hf::chat_template(path, &tokenizer)?;
        Ok(Self {
            config: weights.config().clone(),
            weights: Box::new(weights),
            tokenizer,
            chat_template,
        })
    }

    fn open_gguf(path: &Path) -> Result<Self> {
        let file = GgufFile::open(path)?;
        let config = LlamaConfig::from_gguf(&file)?;
        let json = path.with_file_name("tokenizer.json");
        let tokenizer = if json.is_file() {
            Tokenizer::from_json_file(&json, SpecialIds::from_gguf(file.content())?)?
        } else {
            Tokenizer::from_gguf(file.content())?
        };
        let chat_template = ChatTemplate::from_gguf(file.content(), &tokenizer)?;
        Ok(Self {
            weights: Box::new(file),
            config,
            tokenizer,
            chat_template,
        })
    }
}

/// A loaded model: network, tokenizer and chat template, read from one GGUF file or Hugging
/// Face directory.
#[derive(Debug)]
pub struct Model {
    path: PathBuf,
    network: Network,
    device: DeviceSpec,
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    load_time: Duration,
}

impl Model {
    /// Loads a GGUF file or a Hugging Face model directory (see [`ModelSource::open`]).
    pub fn load(path: &Path, options: &ModelOptions) -> Result<Self> {
        let started = Instant::now();
        // Opening the device first turns "no such GPU" into a clear error before any reading.
        let device = open_device(options)?;
        let mut source = ModelSource::open(path)?;
        let network = Network::build(source.weights.as_mut(), source.config, options, &device)?;
        Ok(Self {
            path: path.to_owned(),
            network,
            device: options.device,
            tokenizer: source.tokenizer,
            chat_template: source.chat_template,
            load_time: started.elapsed(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn config(&self) -> &LlamaConfig {
        self.network.config()
    }

    /// The network, for backend-specific figures (weight bytes, threads).
    pub fn network(&self) -> &Network {
        &self.network
    }

    /// The CPU kernels' network, when that is the backend this model runs on.
    pub fn llama(&self) -> Option<&Llama> {
        match &self.network {
            Network::Kernels(l) => Some(l),
            Network::Candle(_) => None,
        }
    }

    /// The device the forward pass runs on.
    pub fn device(&self) -> DeviceSpec {
        self.device
    }

    pub fn backend(&self) -> Backend {
        match self.network {
            Network::Kernels(_) => Backend::Kernels,
            Network::Candle(_) => Backend::Candle,
        }
    }

    /// A KV block pool where this model's forward pass reads it.
    pub fn new_kv_store(&self, num_blocks: usize, block_size: usize) -> Result<KvStore> {
        match &self.network {
            Network::Kernels(_) => KvStore::new(self.config(), num_blocks, block_size),
            Network::Candle(c) => c.new_kv_store(num_blocks, block_size),
        }
    }

    /// One step over a ragged batch: logits `[rows, vocab]` (f32, on the CPU) for the rows
    /// the batch asks for, in sequence order. `kv` must come from [`Model::new_kv_store`].
    pub fn forward(&self, batch: &StepBatch, kv: &mut KvStore) -> Result<Tensor> {
        self.forward_host(batch, kv)?.into_tensor()
    }

    /// [`Model::forward`]'s logits where the step left them on the host, copied once from
    /// the device (see [`crate::host_logits`]): what sampling reads.
    pub fn forward_host(&self, batch: &StepBatch, kv: &mut KvStore) -> Result<HostLogits> {
        self.forward_host_adjusted(batch, kv, &[])
    }

    /// Whether the model may answer a [`crate::Logits::Pick`] with the picked token instead
    /// of the row (the candle backend, whose switches may still send rows whole): only then
    /// is it worth handing it the changes of [`Model::forward_host_adjusted`].
    pub fn picks_on_device(&self) -> bool {
        matches!(self.network, Network::Candle(_))
    }

    /// [`Model::forward_host`], where sequence `s` of the batch changes its row as `adjust[s]`
    /// says before its picked token ([`crate::Logits::Pick`]) is chosen: a model that picks on
    /// its device makes the changes there. A row that comes back whole is as the model
    /// computed it (the CPU kernels return every row whole): the caller makes its changes.
    pub fn forward_host_adjusted(
        &self,
        batch: &StepBatch,
        kv: &mut KvStore,
        adjust: &[Option<Adjust>],
    ) -> Result<HostLogits> {
        match &self.network {
            Network::Kernels(l) => l.forward_host(batch, kv),
            Network::Candle(c) => c.forward_host_adjusted(batch, kv, adjust),
        }
    }

    /// `(free, total)` bytes of the model's GPU memory; `None` on the CPU, where the KV pool
    /// is sized by a fixed budget instead.
    pub fn device_memory(&self) -> Result<Option<(usize, usize)>> {
        match &self.network {
            Network::Candle(c) => crate::candle::device_memory(c.device()),
            Network::Kernels(_) => Ok(None),
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The model's chat template, if its file has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Replaces the model's chat template (the server's `--chat-template`).
    pub fn set_chat_template(&mut self, template: ChatTemplate) {
        self.chat_template = Some(template);
    }

    /// How long [`Model::load`] took.
    pub fn load_time(&self) -> Duration {
        self.load_time
    }
}

/// Checks the backend against the device and opens the device.
fn open_device(options: &ModelOptions) -> Result<Device> {
    if options.backend == Backend::Kernels && options.device != DeviceSpec::Cpu {
        return Err(ModelError::Device(format!(
            "the kernels backend runs on the CPU only; {} needs --backend candle",
            options.device
        )));
    }
    options.device.open()
}
