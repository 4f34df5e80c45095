//! Hugging Face model directories: a safetensors copy of the default model (written by
//! `hf_export`, as the `to_safetensors` example does) loads to the same network, tokenizer and
//! chat template as the GGUF; unsupported architectures and dtypes are refused by name.
//!
//! What agrees with what:
//! - The copy against the GGUF with every tensor dequantized to the copy's dtype at load (the
//!   same dense weights through the same f32 kernels): equal bit for bit, in f32 and in f16.
//!   This checks names, shapes, the RoPE row permutation and the dtype handling exactly.
//! - The copy against the GGUF as the kernels run it (Q4_1 blocks on 8-bit activations): the
//!   dense f32 product skips the activation rounding, so logprobs differ by that rounding; the
//!   figures are printed and held to the golden tests' thresholds.

mod common;

use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use sluice_models::chat_template::ChatMessage;
use sluice_models::gguf::GgufFile;
use sluice_models::hf_export::write_hf_dir;
use sluice_models::logits::log_softmax;
use sluice_models::{
    Backend, KvStore, Llama, LlamaConfig, Logits, Model, ModelOptions, ModelSource, Result,
    SeqChunk, StepBatch, WeightSource,
};

/// A GGUF read with every tensor dequantized to one dense type: the reference a Hugging Face
/// copy in that type must reproduce exactly.
#[derive(Debug)]
struct DenseGguf {
    file: GgufFile,
    dtype: GgmlDType,
}

impl WeightSource for DenseGguf {
    fn describe(&self) -> String {
        self.file.describe()
    }
    fn has_tensor(&self, name: &str) -> bool {
        self.file.has_tensor(name)
    }
    fn tensor_dims(&self, name: &str) -> Result<Vec<usize>> {
        self.file.tensor_dims(name)
    }
    fn read_qtensor(&mut self, name: &str) -> Result<QTensor> {
        let t = self.file.read_qtensor(name)?.dequantize(&Device::Cpu)?;
        Ok(QTensor::quantize(&t, self.dtype)?)
    }
    fn check_tensor_types(&self) -> Result<()> {
        self.file.check_tensor_types()
    }
}

fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-hf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A forward pass with its own KV pool: the kernels' network alone, or a loaded model on
/// either backend.
trait Forward {
    fn pool(&self, blocks: usize) -> KvStore;
    fn logits(&self, batch: &StepBatch, kv: &mut KvStore) -> Tensor;
}

impl Forward for Llama {
    fn pool(&self, blocks: usize) -> KvStore {
        KvStore::new(self.config(), blocks, 16).unwrap()
    }
    fn logits(&self, batch: &StepBatch, kv: &mut KvStore) -> Tensor {
        self.forward(batch, kv).unwrap()
    }
}

impl Forward for Model {
    fn pool(&self, blocks: usize) -> KvStore {
        self.new_kv_store(blocks, 16).unwrap()
    }
    fn logits(&self, batch: &StepBatch, kv: &mut KvStore) -> Tensor {
        self.forward(batch, kv).unwrap()
    }
}

/// Teacher-forced logprob rows of the golden greedy paths (the first `n` lines).
fn golden_logprobs(net: &dyn Forward, n: usize) -> Vec<Vec<f32>> {
    let mut rows = Vec::new();
    for line in common::golden_lines("greedy.jsonl").iter().take(n) {
        let mut tokens = common::ids(&line["prompt_ids"]);
        tokens.extend(common::ids(&line["greedy_ids"]));
        let mut kv = net.pool(tokens.len().div_ceil(16) + 1);
        let table = (0..kv.num_blocks() as u32).collect();
        let batch = StepBatch {
            seqs: vec![SeqChunk {
                tokens,
                start_pos: 0,
                block_table: table,
                logits: Logits::All,
            }],
        };
        let out = net.logits(&batch, &mut kv);
        for row in out.to_vec2::<f32>().unwrap() {
            rows.push(log_softmax(&row));
        }
    }
    rows
}

/// (max |Δ| over whole rows, mean |Δ| over each row of `b`'s 10 most likely tokens (the golden
/// tests' measure), share of rows with the same argmax).
fn compare(a: &[Vec<f32>], b: &[Vec<f32>]) -> (f32, f64, f64) {
    assert_eq!(a.len(), b.len());
    let (mut max, mut sum, mut n, mut same) = (0f32, 0f64, 0usize, 0usize);
    for (ra, rb) in a.iter().zip(b) {
        let mut order: Vec<usize> = (0..rb.len()).collect();
        order.sort_by(|&x, &y| rb[y].total_cmp(&rb[x]));
        let top_a = (0..ra.len()).fold(0, |m, i| if ra[i] > ra[m] { i } else { m });
        same += usize::from(top_a == order[0]);
        for &i in &order[..10] {
            sum += f64::from((ra[i] - rb[i]).abs());
            n += 1;
        }
        for (x, y) in ra.iter().zip(rb) {
            max = max.max((x - y).abs());
        }
    }
    (max, sum / n as f64, same as f64 / a.len() as f64)
}

const GOLDEN_LINES: usize = 3;

fn dense_reference(dtype: GgmlDType) -> Vec<Vec<f32>> {
    let file = GgufFile::open(&common::model_path()).unwrap();
    let config = LlamaConfig::from_gguf(&file).unwrap();
    let mut source = DenseGguf { file, dtype };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let llama = Llama::load(&mut source, config, threads).unwrap();
    golden_logprobs(&llama, GOLDEN_LINES)
}

fn hf_logprobs(dir: &Path, backend: Backend) -> Vec<Vec<f32>> {
    let options = ModelOptions {
        backend,
        ..Default::default()
    };
    let model = Model::load(dir, &options).unwrap();
    golden_logprobs(&model, GOLDEN_LINES)
}

#[test]
fn a_safetensors_copy_gives_the_ggufs_logprobs() {
    let quantized = golden_logprobs(common::model(), GOLDEN_LINES);
    for (dtype, ggml) in [(DType::F32, GgmlDType::F32), (DType::F16, GgmlDType::F16)] {
        let dir = scratch_dir(&format!("{dtype:?}"));
        write_hf_dir(&common::model_path(), &dir, dtype).unwrap();
        let copy = hf_logprobs(&dir, Backend::Kernels);
        let reference = dense_reference(ggml);
        let (max, mean, top1) = compare(&copy, &reference);
        eprintln!("{dtype:?} copy vs GGUF dequantized to {dtype:?}: max |Δ| {max:e}, mean {mean:e}, top-1 {top1}");
        assert_eq!(
            max, 0.0,
            "the {dtype:?} copy should equal the dense GGUF bit for bit"
        );
        let (max, mean, top1) = compare(&copy, &quantized);
        eprintln!("{dtype:?} copy vs GGUF Q4_1 kernels: max |Δ| {max:.4}, mean over top 10 {mean:.5}, top-1 {top1:.4}");
        assert!(
            mean <= 0.15 && top1 >= 0.95,
            "{dtype:?} copy: mean {mean}, top-1 {top1}"
        );
        // The same directory on the candle backend: the same dense weights, another forward
        // pass (candle's own matrix products and attention), so only rounding differs.
        let on_candle = hf_logprobs(&dir, Backend::Candle);
        let (max, mean, top1) = compare(&on_candle, &copy);
        eprintln!("{dtype:?} copy, candle vs kernels: max |Δ| {max:.5}, mean over top 10 {mean:.6}, top-1 {top1:.4}");
        assert!(
            mean <= 1e-2 && top1 >= 0.99,
            "{dtype:?} copy on candle: mean {mean}, top-1 {top1}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_safetensors_copy_has_the_ggufs_tokenizer_and_template() {
    let dir = scratch_dir("tok");
    write_hf_dir(&common::model_path(), &dir, DType::F16).unwrap();
    let hf = ModelSource::open(&dir).unwrap();
    let gguf = ModelSource::open(&common::model_path()).unwrap();
    assert_eq!(hf.config.block_count, gguf.config.block_count);
    assert_eq!(hf.config.rope_freq_base, gguf.config.rope_freq_base);
    assert_eq!(hf.config.vocab_size, gguf.config.vocab_size);
    let (a, b) = (&hf.tokenizer, &gguf.tokenizer);
    assert_eq!(
        (a.bos_id(), a.eos_id(), a.add_bos(), a.eos_ids()),
        (b.bos_id(), b.eos_id(), b.add_bos(), b.eos_ids())
    );
    let lines = common::golden_lines("tokenize.jsonl");
    assert!(lines.len() >= 10);
    for line in lines {
        let text = line["text"].as_str().unwrap();
        assert_eq!(
            a.encode(text, false).unwrap(),
            common::ids(&line["ids"]),
            "{text:?}"
        );
        assert_eq!(
            a.encode(text, true).unwrap(),
            common::ids(&line["ids_parse_special"]),
            "{text:?}"
        );
    }
    let chat = [
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "Hi <|im_end|> there"),
        ChatMessage::new("assistant", "Hello."),
        ChatMessage::new("user", "Again?"),
    ];
    let (ta, tb) = (hf.chat_template.unwrap(), gguf.chat_template.unwrap());
    for generation_prompt in [false, true] {
        assert_eq!(
            ta.render(&chat, generation_prompt).unwrap(),
            tb.render(&chat, generation_prompt).unwrap()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A minimal directory: a config.json edited by `edit` and one safetensors file with `tensors`
/// (the refusals come before the tokenizer is read).
fn tiny_dir(
    tag: &str,
    edit: impl Fn(&mut serde_json::Value),
    tensors: &[(&str, Tensor)],
) -> PathBuf {
    let dir = scratch_dir(tag);
    std::fs::create_dir_all(&dir).unwrap();
    let mut config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": 49152,
        "tie_word_embeddings": true, "torch_dtype": "float16",
    });
    edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let map: std::collections::HashMap<String, Tensor> = tensors
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
    dir
}

fn load_error(dir: &Path) -> String {
    let err = ModelSource::open(dir).unwrap_err().to_string();
    std::fs::remove_dir_all(dir).unwrap();
    err
}

#[test]
fn unsupported_architectures_and_dtypes_are_refused_by_name() {
    let norm = Tensor::ones(64, DType::F16, &Device::Cpu).unwrap();
    let ok = [("model.norm.weight", norm.clone())];
    let err = load_error(&tiny_dir(
        "arch",
        |c| c["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]),
        &ok,
    ));
    assert!(err.contains("Qwen2ForCausalLM"), "{err}");
    let err = load_error(&tiny_dir(
        "torch",
        |c| c["torch_dtype"] = serde_json::json!("float8_e4m3fn"),
        &ok,
    ));
    assert!(err.contains("float8_e4m3fn"), "{err}");
    let ints = Tensor::zeros(64, DType::I64, &Device::Cpu).unwrap();
    let err = load_error(&tiny_dir("dtype", |_| {}, &[("model.norm.weight", ints)]));
    assert!(
        err.contains("I64") && err.contains("model.norm.weight"),
        "{err}"
    );
    let err = load_error(&tiny_dir(
        "scaling",
        |c| c["rope_scaling"] = serde_json::json!({"rope_type": "llama3"}),
        &ok,
    ));
    assert!(
        err.contains("rope_scaling") && err.contains("llama3"),
        "{err}"
    );
}
