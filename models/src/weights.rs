//! [`WeightSource`]: where a network's tensors come from, named as GGUF names them.
//!
//! Both backends load through this seam, so a GGUF file and a Hugging Face safetensors
//! directory feed the same loading code. A source answers in GGUF's conventions whatever it
//! stores: names such as `blk.0.attn_q.weight`, matrices as `[rows, cols]` (outputs first), and
//! the Q and K projections' rows in the order llama.cpp's converter writes them (pairs of
//! adjacent dimensions rotate together under RoPE).

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

use crate::error::{ModelError, Result};
use crate::gguf::Matrix;

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

    /// A tensor's type and its raw bytes as stored (ggml blocks, or dense elements).
    fn read_raw(&mut self, name: &str) -> Result<(GgmlDType, Vec<u8>)> {
        let q = self.read_qtensor(name)?;
        Ok((q.dtype(), q.data()?.into_owned()))
    }

    /// Reads a tensor and dequantizes it to f32, flattened in row-major order.
    fn read_f32(&mut self, name: &str) -> Result<Vec<f32>> {
        let tensor = self.read_qtensor(name)?.dequantize(&Device::Cpu)?;
        Ok(tensor.flatten_all()?.to_vec1::<f32>()?)
    }

    /// Reads a 1-D tensor of the expected length.
    fn read_vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        expect_dims(name, &self.tensor_dims(name)?, &[len])?;
        self.read_f32(name)
    }

    /// Reads a matrix of the expected shape (`rows` outputs × `cols` inputs) in f32.
    fn read_matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        expect_dims(name, &self.tensor_dims(name)?, &[rows, cols])?;
        Ok(Matrix {
            rows,
            cols,
            data: self.read_f32(name)?,
        })
    }
}

/// Fails unless a tensor has the shape the config implies, naming both.
pub fn expect_dims(name: &str, dims: &[usize], want: &[usize]) -> Result<()> {
    if dims != want {
        return Err(ModelError::Unsupported(format!(
            "tensor '{name}' has shape {dims:?}, expected {want:?}"
        )));
    }
    Ok(())
}
