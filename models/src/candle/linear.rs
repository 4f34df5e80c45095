//! Weight matrices on the candle device: GGUF's quantized blocks stay quantized (`QMatMul`),
//! f32, f16 and bf16 stay dense.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Module, Shape, Tensor};

use crate::error::{ModelError, Result};
use crate::kernels::quant::{Q4_1Matrix, QuantActs};
use crate::weights::WeightSource;

/// Where the weights go: the device, and on the CPU the model's compute threads.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub device: Device,
    /// `--threads` on the CPU; `None` on a GPU.
    pub pool: Option<Arc<rayon::ThreadPool>>,
}

/// One matrix `[rows, cols]` (outputs first), multiplied as `x · Wᵀ`.
#[derive(Debug)]
pub(crate) enum Weight {
    /// Quantized blocks, multiplied by candle's quantized kernels.
    Quant(QMatMul),
    /// On the CPU, Q4_1 blocks multiplied by the kernels backend's product (see
    /// [`KernelProduct`]).
    Kernel(KernelProduct),
    /// Dense: f32 on the CPU (candle's CPU matmul is f32-fast), the stored dtype on a GPU.
    Dense(Tensor),
}

impl Weight {
    /// Moves a CPU `QTensor` to its place in the form it is multiplied in.
    pub(crate) fn from_qtensor(qt: QTensor, place: &Place) -> Result<Self> {
        if Self::runs_on_kernels(&qt, place) {
            return Self::kernel_product(&qt, place);
        }
        let device = &place.device;
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

    /// Whether this matrix is multiplied by the kernels backend's product (a candle custom op):
    /// Q4_1 on the CPU. candle-core multiplies Q4_1 on the CPU with scalar code on one thread
    /// (its SIMD dot products cover Q4_0, Q8_0 and the K-quants); the kernels' product keeps
    /// Q4_1's values, rounds each activation row on its own, so a row's result does not depend
    /// on its batch, and uses every `--threads` thread. On a GPU, and for every other type,
    /// candle's quantized kernels run.
    pub(crate) fn runs_on_kernels(qt: &QTensor, place: &Place) -> bool {
        place.pool.is_some() && qt.dtype() == GgmlDType::Q4_1
    }

    /// The [`Weight::Kernel`] of a matrix that [`Weight::runs_on_kernels`].
    pub(crate) fn kernel_product(qt: &QTensor, place: &Place) -> Result<Self> {
        let pool = place.pool.clone().ok_or_else(|| {
            ModelError::Device("the kernels' product runs on the CPU only".into())
        })?;
        let (rows, cols) = qt.shape().dims2()?;
        let w = Q4_1Matrix::from_q4_1(&qt.data()?, rows, cols)?;
        Ok(Self::Kernel(KernelProduct {
            w: crate::linear::Linear::Q4_1(w),
            pool,
        }))
    }

    /// `x · Wᵀ` for `x` `[n, cols]` f32; the result is `[n, rows]` f32.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Quant(q) => q.forward(x)?,
            Self::Kernel(k) => x.contiguous()?.apply_op1_no_bwd(k)?,
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
            Self::Kernel(k) => k.w.bytes(),
            Self::Quant(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) | Self::Dense(t) => {
                t.elem_count() * t.dtype().size_in_bytes()
            }
        }
    }
}

/// `x · Wᵀ` on the CPU by the kernels backend's quantized product ([`crate::linear::Linear`]):
/// `x` `[n, cols]` f32 in, `[n, rows]` f32 out.
#[derive(Debug)]
pub(crate) struct KernelProduct {
    w: crate::linear::Linear,
    pool: Arc<rayon::ThreadPool>,
}

impl CustomOp1 for KernelProduct {
    fn name(&self) -> &'static str {
        "sluice-kernel-product"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (n, cols) = layout.shape().dims2()?;
        let x = match (storage, layout.contiguous_offsets()) {
            (CpuStorage::F32(v), Some((start, end))) if cols == self.w.cols() => &v[start..end],
            _ => candle_core::bail!(
                "{}: wants contiguous f32 [n, {}], got {:?}",
                self.name(),
                self.w.cols(),
                layout.shape()
            ),
        };
        let mut out = vec![0f32; n * self.w.rows()];
        let mut scratch = QuantActs::default();
        self.w.apply(&self.pool, x, n, &mut scratch, &mut out);
        Ok((CpuStorage::F32(out), Shape::from((n, self.w.rows()))))
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
    pub(crate) fn stack(parts: Vec<QTensor>, place: &Place) -> Result<Self> {
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
                parts: vec![Weight::from_qtensor(qt, place)?],
            });
        }
        let parts = parts
            .into_iter()
            .map(|p| Weight::from_qtensor(p, place))
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
