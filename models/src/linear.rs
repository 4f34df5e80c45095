//! A weight matrix in the form its kernel runs on: Q4_1 (and Q4_0), Q8_0, Q4_K or Q6_K blocks
//! multiplied directly with 8-bit activations, anything else dequantized to f32 at load.

use candle_core::quantized::GgmlDType;
use candle_core::Device;

use crate::error::Result;
use crate::gguf::Matrix;
use crate::kernels::kqmatmul::{kqmatmul, KWeights};
use crate::kernels::kquant::{Q4KMatrix, Q6KMatrix};
use crate::kernels::matmul::matmul_t;
use crate::kernels::qmatmul::{qmatmul, QPath, QWeights};
use crate::kernels::quant::{Q4_1Matrix, Q8_0Matrix, QuantActs};
use crate::weights::{expect_dims, WeightSource};

/// `rows` outputs × `cols` inputs, applied as `x · Wᵀ`.
#[derive(Debug, Clone)]
pub enum Linear {
    F32(Matrix),
    Q4_1(Q4_1Matrix),
    Q8_0(Q8_0Matrix),
    Q4K(Q4KMatrix),
    Q6K(Q6KMatrix),
}

impl Linear {
    /// Loads a matrix of the expected shape, keeping quantized blocks where a kernel runs them;
    /// dense (F32, F16, BF16) and other quantized types are widened to f32.
    pub fn load(
        source: &mut dyn WeightSource,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        expect_dims(name, &source.tensor_dims(name)?, &[rows, cols])?;
        let q = source.read_qtensor(name)?;
        let raw = || -> Result<Vec<u8>> { Ok(q.data()?.into_owned()) };
        Ok(match q.dtype() {
            GgmlDType::Q4_1 => Self::Q4_1(Q4_1Matrix::from_q4_1(&raw()?, rows, cols)?),
            GgmlDType::Q4_0 => Self::Q4_1(Q4_1Matrix::from_q4_0(&raw()?, rows, cols)?),
            GgmlDType::Q8_0 => Self::Q8_0(Q8_0Matrix::from_q8_0(&raw()?, rows, cols)?),
            GgmlDType::Q4K => Self::Q4K(Q4KMatrix::from_q4_k(&raw()?, rows, cols)?),
            GgmlDType::Q6K => Self::Q6K(Q6KMatrix::from_q6_k(&raw()?, rows, cols)?),
            _ => {
                let data = q
                    .dequantize(&Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                Self::F32(Matrix { rows, cols, data })
            }
        })
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        match self {
            Self::F32(m) => m.rows,
            Self::Q4_1(m) => m.n,
            Self::Q8_0(m) => m.n,
            Self::Q4K(m) => m.n,
            Self::Q6K(m) => m.n,
        }
    }

    /// Input width.
    pub fn cols(&self) -> usize {
        match self {
            Self::F32(m) => m.cols,
            Self::Q4_1(m) => m.k,
            Self::Q8_0(m) => m.k,
            Self::Q4K(m) => m.k,
            Self::Q6K(m) => m.k,
        }
    }

    /// Bytes of weights one full product streams.
    pub fn bytes(&self) -> usize {
        match self {
            Self::F32(m) => m.data.len() * 4,
            Self::Q4_1(m) => m.bytes(),
            Self::Q8_0(m) => m.bytes(),
            Self::Q4K(m) => m.bytes(),
            Self::Q6K(m) => m.bytes(),
        }
    }

    /// One row of the matrix in f32 (embedding look-up).
    pub fn row(&self, r: usize, out: &mut [f32]) {
        match self {
            Self::F32(m) => out.copy_from_slice(&m.data[r * m.cols..(r + 1) * m.cols]),
            Self::Q4_1(m) => m.dequantize_row(r, out),
            Self::Q8_0(m) => m.dequantize_row(r, out),
            Self::Q4K(m) => m.dequantize_row(r, out),
            Self::Q6K(m) => m.dequantize_row(r, out),
        }
    }

    /// The matrix in f32.
    fn to_f32(&self) -> Matrix {
        let (rows, cols) = (self.rows(), self.cols());
        let mut data = vec![0.0; rows * cols];
        for (r, row) in data.chunks_exact_mut(cols).enumerate() {
            self.row(r, row);
        }
        Matrix { rows, cols, data }
    }

    /// Stacks matrices over the same input into one (fused Q/K/V, gate/up). Parts of one
    /// quantized type stay quantized; mixed types fall back to f32.
    pub fn stack(parts: Vec<Linear>) -> Result<Linear> {
        if parts.iter().all(|p| matches!(p, Self::Q4_1(_))) {
            let ms: Vec<Q4_1Matrix> = parts
                .into_iter()
                .map(|p| {
                    if let Self::Q4_1(m) = p {
                        m
                    } else {
                        unreachable!()
                    }
                })
                .collect();
            return Ok(Self::Q4_1(Q4_1Matrix::stack(&ms)));
        }
        if parts.iter().all(|p| matches!(p, Self::Q8_0(_))) {
            let ms: Vec<Q8_0Matrix> = parts
                .into_iter()
                .map(|p| {
                    if let Self::Q8_0(m) = p {
                        m
                    } else {
                        unreachable!()
                    }
                })
                .collect();
            return Ok(Self::Q8_0(Q8_0Matrix::stack(&ms)));
        }
        if parts.iter().all(|p| matches!(p, Self::Q4K(_))) {
            let ms: Vec<Q4KMatrix> = parts
                .into_iter()
                .map(|p| {
                    if let Self::Q4K(m) = p {
                        m
                    } else {
                        unreachable!()
                    }
                })
                .collect();
            return Ok(Self::Q4K(Q4KMatrix::stack(&ms)));
        }
        if parts.iter().all(|p| matches!(p, Self::Q6K(_))) {
            let ms: Vec<Q6KMatrix> = parts
                .into_iter()
                .map(|p| {
                    if let Self::Q6K(m) = p {
                        m
                    } else {
                        unreachable!()
                    }
                })
                .collect();
            return Ok(Self::Q6K(Q6KMatrix::stack(&ms)));
        }
        let ms = parts
            .into_iter()
            .map(|p| match p {
                Self::F32(m) => m,
                other => other.to_f32(),
            })
            .collect();
        Ok(Self::F32(Matrix::stack(ms)?))
    }

    /// `out = x · Wᵀ` for `rows` rows of `x`; `scratch` holds the rounded activations.
    pub fn apply(
        &self,
        pool: &rayon::ThreadPool,
        x: &[f32],
        rows: usize,
        scratch: &mut QuantActs,
        out: &mut [f32],
    ) {
        let w = match self {
            Self::F32(m) => return matmul_t(pool, x, rows, &m.data, m.rows, out),
            Self::Q4_1(m) => QWeights::Q4_1(m),
            Self::Q8_0(m) => QWeights::Q8_0(m),
            Self::Q4K(m) => return kquant(pool, x, rows, scratch, KWeights::Q4K(m), out),
            Self::Q6K(m) => return kquant(pool, x, rows, scratch, KWeights::Q6K(m), out),
        };
        QuantActs::quantize(x, rows, self.cols(), scratch);
        qmatmul(pool, QPath::best(), scratch, w, out);
    }
}

/// `out = x · Wᵀ` on k-quant weights, rounding `x` into `scratch` first.
fn kquant(
    pool: &rayon::ThreadPool,
    x: &[f32],
    rows: usize,
    scratch: &mut QuantActs,
    w: KWeights<'_>,
    out: &mut [f32],
) {
    QuantActs::quantize(x, rows, w.k(), scratch);
    kqmatmul(pool, QPath::best(), scratch, w, out);
}
