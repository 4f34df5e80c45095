//! [`WeightSource`]: where a network's tensors come from, named as GGUF names them.
//!
//! Both backends load through this seam, so a GGUF file and a Hugging Face safetensors
//! directory feed the same loading code. A source answers in GGUF's conventions whatever it
//! stores: names such as `blk.0.attn_q.weight`, matrices as `[rows, cols]` (outputs first), and
//! the Q and K projections' rows in the order llama.cpp's converter writes them (pairs of
//! adjacent dimensions rotate together under RoPE).

use candle_core::quantized::QTensor;

use crate::error::Result;

/// A readable set of named tensors in GGUF's layout.
pub trait WeightSource: std::fmt::Debug {
    /// What the tensors are read from (a path), for messages.
    fn describe(&self) -> String;

    /// Whether a tensor of this GGUF name exists.
    fn has_tensor(&self, name: &str) -> bool;

    /// A tensor's shape, outermost first (`[rows, cols]` for a matrix).
    fn tensor_dims(&self, name: &str) -> Result<Vec<usize>>;

    /// Reads a tensor on the CPU: quantized blocks as stored, dense data as an F32, F16 or BF16
    /// `QTensor` of the same shape.
    fn read_qtensor(&mut self, name: &str) -> Result<QTensor>;

    /// Checks every tensor's type before any is read, naming the first one no backend runs.
    fn check_tensor_types(&self) -> Result<()>;
}
