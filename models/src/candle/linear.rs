//! Weight matrices on the candle device: GGUF's quantized blocks stay quantized (`QMatMul`),
//! f32, f16 and bf16 stay dense.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use crate::error::{ModelError, Result};
use crate::weights::WeightSource;

/// One matrix `[rows, cols]` (outputs first), multiplied as `x · Wᵀ`.
#[derive(Debug)]
pub(crate) enum Weight {
    /// Quantized blocks, multiplied by candle's quantized kernels.
    Quant(QMatMul),
    /// Dense: f32 on the CPU (candle's CPU matmul is f32-fast), the stored dtype on a GPU.
    Dense(Tensor),
}

impl Weight {
    /// Moves a CPU `QTensor` to `device` in the form it is multiplied in.
    pub(crate) fn from_qtensor(qt: QTensor, device: &Device) -> Result<Self> {
        Ok(match qt.dtype() {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                let dense = qt.dequantize(&Device::Cpu)?;
                let dtype = match (device, qt.dtype()) {
                    (Device::Cpu, _) | (_, GgmlDType::F32) => DType::F32,
                    (_, GgmlDType::F16) => DType::F16,
                    _ => DType::BF16,
                };
                Self::Dense(dense.to_dtype(dtype)?.to_device(device)?)
            }
            _ => Self::Quant(QMatMul::from_arc(Arc::new(to_device(qt, device)?))?),
        })
    }

    /// `x · Wᵀ` for `x` `[n, cols]` f32; the result is `[n, rows]` f32.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Quant(q) => q.forward(x)?,
            Self::Dense(w) => x
                .to_dtype(w.dtype())?
                .matmul(&w.t()?)?
                .to_dtype(DType::F32)?,
        })
    }

    /// Bytes the matrix takes on its device.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Self::Quant(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            Self::Quant(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) | Self::Dense(t) => {
                t.elem_count() * t.dtype().size_in_bytes()
            }
        }
    }
}

/// Copies a CPU `QTensor`'s blocks to `device` unchanged.
pub(crate) fn to_device(qt: QTensor, device: &Device) -> Result<QTensor> {
    if device.is_cpu() {
        return Ok(qt);
    }
    let storage = QStorage::from_data(qt.data()?, device, qt.dtype())?;
    Ok(QTensor::new(storage, qt.shape().clone())?)
}

/// Reads a matrix, checking its shape against what the config implies.
pub(crate) fn read_matrix(
    source: &mut dyn WeightSource,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<QTensor> {
    let qt = source.read_qtensor(name)?;
    if qt.shape().dims() != [rows, cols] {
        return Err(ModelError::Unsupported(format!(
            "tensor {name} in {} has shape {:?}, expected [{rows}, {cols}]",
            source.describe(),
            qt.shape().dims()
        )));
    }
    Ok(qt)
}

/// Several matrices with the same input, multiplied as one where they share a type: their
/// rows are stacked (`[q; k; v]`, `[gate; up]`) so a step runs one product instead of several.
#[derive(Debug)]
pub(crate) struct Linear {
    parts: Vec<Weight>,
}

impl Linear {
    /// Stacks the matrices' rows; matrices of one GGUF type become one (their blocks are rows,
    /// so the stacked bytes are the stacked matrix), mixed types stay apart.
    pub(crate) fn stack(parts: Vec<QTensor>, device: &Device) -> Result<Self> {
        let same = parts.windows(2).all(|w| w[0].dtype() == w[1].dtype());
        if parts.len() > 1 && same {
            let cols = parts[0].shape().dims()[1];
            let rows: usize = parts.iter().map(|p| p.shape().dims()[0]).sum();
            let mut bytes = Vec::new();
            for p in &parts {
                bytes.extend_from_slice(&p.data()?);
            }
            let dtype = parts[0].dtype();
            drop(parts);
            let storage = QStorage::from_data(bytes.into(), &Device::Cpu, dtype)?;
            let qt = QTensor::new(storage, (rows, cols))?;
            return Ok(Self {
                parts: vec![Weight::from_qtensor(qt, device)?],
            });
        }
        let parts = parts
            .into_iter()
            .map(|p| Weight::from_qtensor(p, device))
            .collect::<Result<_>>()?;
        Ok(Self { parts })
    }

    /// `x · Wᵀ` over the stacked rows: `[n, Σ rows]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let [one] = self.parts.as_slice() {
            return one.forward(x);
        }
        let outs = self
            .parts
            .iter()
            .map(|p| p.forward(x))
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::cat(&outs, 1)?)
    }

    pub(crate) fn bytes(&self) -> usize {
        self.parts.iter().map(Weight::bytes).sum()
    }
}
