//! [`Model`]: a model file loaded into everything a replica needs to serve it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::chat_template::ChatTemplate;
use crate::config::LlamaConfig;
use crate::device::DeviceSpec;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::hf::{self, HfDir};
use crate::llama::Llama;
use crate::tokenizer::{SpecialIds, Tokenizer};
use crate::weights::WeightSource;

/// How to load a model.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    pub device: DeviceSpec,
    /// Compute threads; 0 means one per available core.
    pub threads: usize,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            device: DeviceSpec::Cpu,
            threads: 0,
        }
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
    llama: Llama,
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    load_time: Duration,
}

impl Model {
    /// Loads a GGUF file or a Hugging Face model directory (see [`ModelSource::open`]).
    pub fn load(path: &Path, options: &ModelOptions) -> Result<Self> {
        let started = Instant::now();
        if options.device != DeviceSpec::Cpu {
            // Opening the device first turns "no such GPU" into a clear error; the forward pass
            // itself has only the CPU kernels so far.
            options.device.open()?;
            return Err(ModelError::Device(format!(
                "{}: the forward pass runs on the CPU only in this version; use --device cpu",
                options.device
            )));
        }
        let mut source = ModelSource::open(path)?;
        let threads = match options.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let llama = Llama::load(source.weights.as_mut(), source.config, threads)?;
        Ok(Self {
            path: path.to_owned(),
            llama,
            tokenizer: source.tokenizer,
            chat_template: source.chat_template,
            load_time: started.elapsed(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn config(&self) -> &LlamaConfig {
        self.llama.config()
    }

    pub fn llama(&self) -> &Llama {
        &self.llama
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The model's chat template, if its file has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// How long [`Model::load`] took.
    pub fn load_time(&self) -> Duration {
        self.load_time
    }
}
