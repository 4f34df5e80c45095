//! [`Model`]: a model file loaded into everything a replica needs to serve it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::chat_template::ChatTemplate;
use crate::config::LlamaConfig;
use crate::device::DeviceSpec;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::llama::Llama;
use crate::tokenizer::Tokenizer;

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

/// A loaded model: network, tokenizer and chat template, read from one GGUF file.
#[derive(Debug)]
pub struct Model {
    path: PathBuf,
    llama: Llama,
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    load_time: Duration,
}

impl Model {
    /// Loads a GGUF file. A `tokenizer.json` beside it, when present, replaces the tokenizer
    /// built from the GGUF metadata.
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
        let mut file = GgufFile::open(path)?;
        let config = LlamaConfig::from_gguf(&file)?;
        let json = path.with_file_name("tokenizer.json");
        let tokenizer = if json.is_file() {
            Tokenizer::from_json_file(
                &json,
                crate::tokenizer::SpecialIds::from_gguf(file.content())?,
            )?
        } else {
            Tokenizer::from_gguf(file.content())?
        };
        if tokenizer.vocab_size() > config.vocab_size {
            return Err(ModelError::Unsupported(format!(
                "the tokenizer has {} tokens but the model's vocabulary is {}",
                tokenizer.vocab_size(),
                config.vocab_size
            )));
        }
        let chat_template = ChatTemplate::from_gguf(file.content(), &tokenizer)?;
        let threads = match options.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let llama = Llama::load(&mut file, config, threads)?;
        Ok(Self {
            path: path.to_owned(),
            llama,
            tokenizer,
            chat_template,
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
