//! A layer's element-wise steps fused into one op each: the residual add with the RMS norm that
//! follows it ([`AddRmsNorm`]), SwiGLU over the stacked gate and up products ([`SwiGlu`]) and
//! RoPE on the queries read straight out of the QKV product ([`RotateQueries`]; the keys are
//! rotated as the pool stores them, see `kv.rs`).
//!
//! As separate candle ops these were two launches each; on a GPU a decode step is
//! launch-bound, so every launch a layer saves is saved thirty-odd times a token. The CPU
//! implementations compute exactly what candle's ops computed (same operations, same order),
//! and are what the tests run; the CUDA ones are `fused.cu` (PTX from `build.rs` under `cuda`).

use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::operands::{cpu_slice, held_on_cpu};
#[cfg(any(feature = "cuda", test))]
use super::operands::{Grid, ITEM_THREADS};

/// `x + delta` and its RMS norm scaled by `weight`: `apply_op3(x, delta, weight)` gives
/// `[2, n, d]`, the sum then the normed sum (see [`add_rms_norm`]).
#[derive(Debug, Clone, Copy)]
struct AddRmsNorm {
    eps: f32,
}

/// SwiGLU: `apply_op1(gate_up)` (`[n, 2·ff]`, gate columns then up columns) gives
/// `silu(gate) · up`, `[n, ff]`.
#[derive(Debug, Clone, Copy)]
struct SwiGlu;

/// GGUF's interleaved RoPE: `apply_op1(qkv)` rotates each head's pairs `(2i, 2i + 1)` of the
/// first `heads · head_dim` columns of `qkv` (`[n, ≥ heads · head_dim]`) by the token's angle
/// (`cos`, `sin`: `[n, head_dim / 2]`), giving `[n, heads, head_dim]`.
#[derive(Debug, Clone, Copy)]
struct RotateQueries<'a> {
    cos: &'a Tensor,
    sin: &'a Tensor,
    heads: usize,
    head_dim: usize,
}

/// One token's `row` (whole heads of `head_dim`) as GGUF's interleaved RoPE rotates it: each
/// head's pairs `(2i, 2i + 1)` turned by the angle whose cosine and sine are `cos[i]`, `sin[i]`,
/// in the order of operations candle's `rope_i` uses. The one owner of the rule: the queries'
/// op and the KV write both take their rotated pairs from here.
pub(crate) fn rotated_pairs<'a>(
    row: &'a [f32],
    head_dim: usize,
    (cos, sin): (&'a [f32], &'a [f32]),
) -> impl Iterator<Item = (f32, f32)> + 'a {
    row.chunks_exact(head_dim).flat_map(move |head| {
        head.chunks_exact(2)
            .zip(cos.iter().zip(sin))
            .map(|(x, (&c, &s))| (x[0] * c - x[1] * s, x[0] * s + x[1] * c))
    })
}

/// The queries of `qkv` (`[n, ≥ heads · head_dim]` f32, queries first) rotated by each token's
/// angle, as `[n, heads, head_dim]`.
pub(crate) fn rotate_queries(
    qkv: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    heads: usize,
    head_dim: usize,
) -> candle_core::Result<Tensor> {
    qkv.apply_op1_no_bwd(&RotateQueries {
        cos,
        sin,
        heads,
        head_dim,
    })
}

/// The residual stream after adding `delta` to `x` (`[n, d]` f32 each), and that stream RMS
/// normed with `weight` (`[d]`): the next block's input and the stream it adds to.
pub(crate) fn add_rms_norm(
    x: &Tensor,
    delta: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> candle_core::Result<(Tensor, Tensor)> {
    let both = x.apply_op3_no_bwd(delta, weight, &AddRmsNorm { eps })?;
    Ok((both.get(0)?, both.get(1)?))
}

/// `silu(gate) · up` over `gate_up` (`[n, 2·ff]` f32).
pub(crate) fn swiglu(gate_up: &Tensor) -> candle_core::Result<Tensor> {
    gate_up.apply_op1_no_bwd(&SwiGlu)
}

impl AddRmsNorm {
    /// `(n, d)` from the three layouts, which must agree.
    fn dims(x: &Layout, delta: &Layout, w: &Layout) -> candle_core::Result<(usize, usize)> {
        let (n, d) = x.shape().dims2()?;
        if delta.dims() != [n, d] || w.dims() != [d] {
            candle_core::bail!(
                "add-rms-norm: x {:?}, delta {:?}, weight {:?} do not match",
                x.dims(),
                delta.dims(),
                w.dims()
            );
        }
        Ok((n, d))
    }

    /// One row: `sum = x + delta`, `normed = sum / rms(sum) · w`, as candle's `rms_norm` does.
    fn row(&self, (x, delta, w): (&[f32], &[f32], &[f32]), sum: &mut [f32], normed: &mut [f32]) {
        for ((s, &a), &b) in sum.iter_mut().zip(x).zip(delta) {
            *s = a + b;
        }
        let sum2 = sum.iter().map(|&v| v * v).sum::<f32>();
        let m = (sum2 / sum.len() as f32 + self.eps).sqrt();
        for ((o, &s), &a) in normed.iter_mut().zip(sum.iter()).zip(w) {
            *o = s / m * a;
        }
    }
}

impl CustomOp3 for AddRmsNorm {
    fn name(&self) -> &'static str {
        "add-rms-norm"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        xl: &Layout,
        delta: &CpuStorage,
        dl: &Layout,
        w: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (n, d) = Self::dims(xl, dl, wl)?;
        let name = self.name();
        let (x, delta, w) = (
            cpu_slice::<f32>(x, xl, name)?,
            cpu_slice::<f32>(delta, dl, name)?,
            cpu_slice::<f32>(w, wl, name)?,
        );
        let mut out = vec![0f32; 2 * n * d];
        let (sums, normed) = out.split_at_mut(n * d);
        sums.par_chunks_mut(d.max(1))
            .zip(normed.par_chunks_mut(d.max(1)))
            .enumerate()
            .for_each(|(r, (s, o))| {
                let rows = (&x[r * d..][..d], &delta[r * d..][..d], w);
                self.row(rows, s, o);
            });
        Ok((CpuStorage::F32(out), Shape::from((2, n, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        xl: &Layout,
        delta: &candle_core::CudaStorage,
        dl: &Layout,
        w: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (n, d) = Self::dims(xl, dl, wl)?;
        let out = cuda::add_rms_norm(self.eps, (n, d), [(x, xl), (delta, dl), (w, wl)])?;
        Ok((out, Shape::from((2, n, d))))
    }
}

impl SwiGlu {
    fn dims(l: &Layout) -> candle_core::Result<(usize, usize)> {
        let (n, two_ff) = l.shape().dims2()?;
        if !two_ff.is_multiple_of(2) {
            candle_core::bail!("swiglu: {} columns are not gate and up halves", two_ff);
        }
        Ok((n, two_ff / 2))
    }
}

impl CustomOp1 for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (n, ff) = Self::dims(l)?;
        let x = cpu_slice::<f32>(s, l, self.name())?;
        let mut out = vec![0f32; n * ff];
        out.par_chunks_mut(ff.max(1))
            .zip(x.par_chunks(2 * ff.max(1)))
            .for_each(|(o, row)| {
                let (gate, up) = row.split_at(ff);
                for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
                    // candle's silu, then the product.
                    *o = g / ((-g).exp() + 1.0) * u;
                }
            });
        Ok((CpuStorage::F32(out), Shape::from((n, ff))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (n, ff) = Self::dims(l)?;
        let out = cuda::swiglu((n, ff), (s, l))?;
        Ok((out, Shape::from((n, ff))))
    }
}

impl RotateQueries<'_> {
    /// `(n, columns per row)` of `qkv`, checked against the rotation tables.
    fn dims(&self, l: &Layout) -> candle_core::Result<(usize, usize)> {
        let (n, stride) = l.shape().dims2()?;
        let half = self.head_dim / 2;
        let ok = self.head_dim.is_multiple_of(2)
            && self.heads * self.head_dim <= stride
            && self.cos.dims() == [n, half]
            && self.sin.dims() == [n, half];
        if !ok {
            candle_core::bail!(
                "rotate-queries: qkv {:?}, tables {:?}, {} heads of {}: shapes do not match",
                l.dims(),
                self.cos.dims(),
                self.heads,
                self.head_dim
            );
        }
        Ok((n, stride))
    }

    fn out_shape(&self, n: usize) -> Shape {
        Shape::from((n, self.heads, self.head_dim))
    }
}

impl CustomOp1 for RotateQueries<'_> {
    fn name(&self) -> &'static str {
        "rotate-queries"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (n, stride) = self.dims(l)?;
        let qkv = cpu_slice::<f32>(s, l, self.name())?;
        let (width, half) = (self.heads * self.head_dim, self.head_dim / 2);
        let mut out = vec![0f32; n * width];
        let name = self.name();
        held_on_cpu::<f32, _>(self.cos, name, |cos| {
            held_on_cpu::<f32, _>(self.sin, name, |sin| {
                for (r, o) in out.chunks_exact_mut(width).enumerate() {
                    let angles = (&cos[r * half..][..half], &sin[r * half..][..half]);
                    let row = &qkv[r * stride..][..width];
                    let pairs = rotated_pairs(row, self.head_dim, angles);
                    for (y, (y0, y1)) in o.chunks_exact_mut(2).zip(pairs) {
                        (y[0], y[1]) = (y0, y1);
                    }
                }
                Ok(())
            })
        })?;
        Ok((CpuStorage::F32(out), self.out_shape(n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (n, stride) = self.dims(l)?;
        let out = cuda::rotate_queries(self, (n, stride), (s, l))?;
        Ok((out, self.out_shape(n)))
    }
}

/// The CUDA kernels' grids and scalar arguments (after their pointers), for the launches
/// and for the tests that run the kernels under the host emulation.
#[cfg(any(feature = "cuda", test))]
impl AddRmsNorm {
    /// A block per row; fused.cu reduces over exactly `THREADS` (= [`ITEM_THREADS`]) threads.
    fn grid(n: usize) -> Grid {
        Grid {
            blocks: (n as u32, 1, 1),
            threads: ITEM_THREADS,
            shared_bytes: 0,
        }
    }

    /// Rows and columns.
    fn kernel_ints((n, d): (usize, usize)) -> [i32; 2] {
        [n as i32, d as i32]
    }
}

#[cfg(any(feature = "cuda", test))]
impl SwiGlu {
    /// A thread per output.
    fn grid((n, ff): (usize, usize)) -> Grid {
        Grid::per_item(n * ff)
    }

    /// Rows and outputs per row.
    fn kernel_ints((n, ff): (usize, usize)) -> [i32; 2] {
        [n as i32, ff as i32]
    }
}

#[cfg(any(feature = "cuda", test))]
impl RotateQueries<'_> {
    /// A thread per rotated pair.
    fn grid(&self, n: usize) -> Grid {
        Grid::per_item(n * self.heads * self.head_dim / 2)
    }

    /// Rows, `qkv`'s row stride, heads, head dimension.
    fn kernel_ints(&self, (n, stride): (usize, usize)) -> [i32; 4] {
        [
            n as i32,
            stride as i32,
            self.heads as i32,
            self.head_dim as i32,
        ]
    }
}

// Launching a kernel is an FFI call (the crate's other unsafe code is the CPU kernels').
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod cuda {
    //! The CUDA launches: a thread block per row for the norm, a thread per pair for the
    //! rotation, a thread per output for SwiGLU.

    use candle_core::cuda::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
    use candle_core::cuda::WrapErr;
    use candle_core::{CudaDevice, CudaStorage, Layout};

    use super::{AddRmsNorm, SwiGlu};
    use crate::candle::operands::{held, view};

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/fused.ptx"));

    /// An uninitialised output of `len` f32s, for a kernel that writes all of it.
    fn output(dev: &CudaDevice, len: usize) -> candle_core::Result<CudaSlice<f32>> {
        // SAFETY: every caller launches a kernel that writes each of the `len` elements.
        Ok(unsafe { dev.alloc::<f32>(len) }?)
    }

    pub(super) fn add_rms_norm(
        eps: f32,
        (n, d): (usize, usize),
        [(x, xl), (delta, dl), (w, wl)]: [(&CudaStorage, &Layout); 3],
    ) -> candle_core::Result<CudaStorage> {
        let dev = x.device.clone();
        // Each row's block writes its sum and normed columns.
        let mut out = output(&dev, 2 * n * d)?;
        let func = dev.get_or_load_custom_func("add_rms_norm_f32", "sluice_fused", PTX)?;
        if n > 0 {
            let cfg = LaunchConfig::from(AddRmsNorm::grid(n));
            let (xv, dv, wv) = (
                view::<f32>(x, xl)?,
                view::<f32>(delta, dl)?,
                view::<f32>(w, wl)?,
            );
            let ints = AddRmsNorm::kernel_ints((n, d));
            let mut b = func.builder();
            b.arg(&mut out);
            b.arg(&xv);
            b.arg(&dv);
            b.arg(&wv);
            for i in &ints {
                b.arg(i);
            }
            b.arg(&eps);
            // SAFETY: the arguments match fused.cu's signature; the shapes were checked.
            unsafe { b.launch(cfg) }.w()?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    }

    pub(super) fn rotate_queries(
        op: &super::RotateQueries<'_>,
        (n, stride): (usize, usize),
        (s, l): (&CudaStorage, &Layout),
    ) -> candle_core::Result<CudaStorage> {
        let dev = s.device.clone();
        let pairs = n * op.heads * op.head_dim / 2;
        // A thread per pair.
        let mut out = output(&dev, 2 * pairs)?;
        let func = dev.get_or_load_custom_func("rotate_queries_f32", "sluice_fused", PTX)?;
        if pairs > 0 {
            let sv = view::<f32>(s, l)?;
            let (cfg, ints) = (LaunchConfig::from(op.grid(n)), op.kernel_ints((n, stride)));
            held::<f32, _>(op.cos, "rotate-queries", |cos| {
                held::<f32, _>(op.sin, "rotate-queries", |sin| {
                    let mut b = func.builder();
                    b.arg(&mut out);
                    b.arg(&sv);
                    b.arg(&cos);
                    b.arg(&sin);
                    for i in &ints {
                        b.arg(i);
                    }
                    // SAFETY: the arguments match fused.cu's signature; the shapes were checked.
                    unsafe { b.launch(cfg) }.w()?;
                    Ok(())
                })
            })?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    }

    pub(super) fn swiglu(
        (n, ff): (usize, usize),
        (s, l): (&CudaStorage, &Layout),
    ) -> candle_core::Result<CudaStorage> {
        let dev = s.device.clone();
        let total = n * ff;
        // A thread per output.
        let mut out = output(&dev, total)?;
        let func = dev.get_or_load_custom_func("swiglu_f32", "sluice_fused", PTX)?;
        if total > 0 {
            let sv = view::<f32>(s, l)?;
            let ints = SwiGlu::kernel_ints((n, ff));
            let mut b = func.builder();
            b.arg(&mut out);
            b.arg(&sv);
            for i in &ints {
                b.arg(i);
            }
            // SAFETY: the arguments match fused.cu's signature; the shape was checked.
            unsafe { b.launch(LaunchConfig::from(SwiGlu::grid((n, ff)))) }.w()?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::{add_rms_norm, rotate_queries, swiglu};

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    #[test]
    fn add_rms_norm_is_the_add_then_candles_norm() {
        let dev = Device::Cpu;
        // More than 32 rows takes candle's parallel path, fewer its serial one.
        for n in [1, 5, 40] {
            let x = Tensor::randn(0f32, 1.0, (n, 96), &dev).unwrap();
            let delta = Tensor::randn(0f32, 0.5, (n, 96), &dev).unwrap();
            let w = Tensor::randn(1f32, 0.1, 96, &dev).unwrap();
            let (sum, normed) = add_rms_norm(&x, &delta, &w, 1e-5).unwrap();
            let want = (&x + &delta).unwrap();
            assert_eq!(max_diff(&sum, &want), 0.0);
            let want = candle_nn::ops::rms_norm(&want, &w, 1e-5).unwrap();
            assert!(max_diff(&normed, &want) <= 1e-6, "{n} rows");
            assert_eq!(normed.dims(), [n, 96]);
        }
        let bad = Tensor::zeros((2, 8), candle_core::DType::F32, &dev).unwrap();
        let w = Tensor::ones(7, candle_core::DType::F32, &dev).unwrap();
        assert!(add_rms_norm(&bad, &bad, &w, 1e-5).is_err());
    }

    #[test]
    fn rotated_queries_are_candles_rope_of_the_query_columns() {
        let dev = Device::Cpu;
        let (n, heads, hd) = (3, 4, 8);
        let qkv = Tensor::randn(0f32, 1.0, (n, heads * hd + 2 * 2 * hd), &dev).unwrap();
        let angles = Tensor::randn(0f32, 1.0, (n, hd / 2), &dev).unwrap();
        let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
        let got = rotate_queries(&qkv, (&cos, &sin), heads, hd).unwrap();
        let q = qkv.narrow(1, 0, heads * hd).unwrap().contiguous().unwrap();
        let q = q.reshape((n, heads, 1, hd)).unwrap();
        let (c3, s3) = (
            cos.reshape((n, 1, ())).unwrap(),
            sin.reshape((n, 1, ())).unwrap(),
        );
        let want = candle_nn::rotary_emb::rope_i(&q, &c3, &s3).unwrap();
        assert_eq!(got.dims(), [n, heads, hd]);
        assert_eq!(max_diff(&got, &want.reshape((n, heads, hd)).unwrap()), 0.0);
        let short = angles.narrow(0, 0, 2).unwrap();
        assert!(rotate_queries(&qkv, (&short, &short), heads, hd).is_err());
    }

    #[test]
    fn swiglu_is_silu_of_the_gate_times_up() {
        let dev = Device::Cpu;
        let gate_up = Tensor::randn(0f32, 2.0, (3, 2 * 48), &dev).unwrap();
        let want = (candle_nn::ops::silu(&gate_up.narrow(1, 0, 48).unwrap()).unwrap()
            * gate_up.narrow(1, 48, 48).unwrap())
        .unwrap();
        let got = swiglu(&gate_up).unwrap();
        assert_eq!(got.dims(), [3, 48]);
        assert!(max_diff(&got, &want) <= 1e-6);
        let odd = Tensor::zeros((2, 7), candle_core::DType::F32, &dev).unwrap();
        assert!(swiglu(&odd).is_err());
    }

    /// fused.cu's three kernels, compiled for the host and run under the emulation of CUDA's
    /// execution model (`emulator.rs`: no GPU here), with the grids and arguments their CUDA
    /// launches take from the ops, compute what the CPU ops compute: rows narrower and wider
    /// than the norm's block, outputs over several blocks.
    #[test]
    fn the_cuda_kernels_agree_with_the_cpu_ops_under_emulation() {
        use super::{AddRmsNorm, RotateQueries, SwiGlu};
        use crate::candle::emulator::{self, as_f32s, Arg};

        let dev = Device::Cpu;
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let close = |got: &[f32], want: &[f32], what: &str| {
            assert_eq!(got.len(), want.len(), "{what}");
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{what} {i}: {g} vs {w}"
                );
            }
        };
        let run = |kernel: &str, grid, args| {
            emulator::launch(kernel, grid, args).unwrap_or_else(|e| panic!("{e}"))
        };

        for (n, d) in [(3, 96), (2, 576)] {
            let x = Tensor::randn(0f32, 1.0, (n, d), &dev).unwrap();
            let delta = Tensor::randn(0f32, 0.5, (n, d), &dev).unwrap();
            let w = Tensor::randn(1f32, 0.1, d, &dev).unwrap();
            let (sum, normed) = add_rms_norm(&x, &delta, &w, 1e-5).unwrap();
            let mut args = vec![
                Arg::f32s(&vec![0.0; 2 * n * d]),
                Arg::f32s(&flat(&x)),
                Arg::f32s(&flat(&delta)),
                Arg::f32s(&flat(&w)),
            ];
            args.extend(Arg::ints(&AddRmsNorm::kernel_ints((n, d))));
            args.push(Arg::F32(1e-5));
            let out = as_f32s(&run("add_rms_norm_f32", AddRmsNorm::grid(n), args)[0]);
            close(&out[..n * d], &flat(&sum), "sum");
            close(&out[n * d..], &flat(&normed), "normed");
        }

        let (n, ff) = (3, 300);
        let gate_up = Tensor::randn(0f32, 2.0, (n, 2 * ff), &dev).unwrap();
        let mut args = vec![Arg::f32s(&vec![0.0; n * ff]), Arg::f32s(&flat(&gate_up))];
        args.extend(Arg::ints(&SwiGlu::kernel_ints((n, ff))));
        let out = as_f32s(&run("swiglu_f32", SwiGlu::grid((n, ff)), args)[0]);
        close(&out, &flat(&swiglu(&gate_up).unwrap()), "swiglu");

        let (n, heads, hd) = (3, 9, 64);
        let stride = heads * hd + 2 * 3 * hd;
        let qkv = Tensor::randn(0f32, 1.0, (n, stride), &dev).unwrap();
        let angles = Tensor::randn(0f32, 2.0, (n, hd / 2), &dev).unwrap();
        let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
        let op = RotateQueries {
            cos: &cos,
            sin: &sin,
            heads,
            head_dim: hd,
        };
        let mut args = vec![
            Arg::f32s(&vec![0.0; n * heads * hd]),
            Arg::f32s(&flat(&qkv)),
            Arg::f32s(&flat(&cos)),
            Arg::f32s(&flat(&sin)),
        ];
        args.extend(Arg::ints(&op.kernel_ints((n, stride))));
        let out = as_f32s(&run("rotate_queries_f32", op.grid(n), args)[0]);
        let want = rotate_queries(&qkv, (&cos, &sin), heads, hd).unwrap();
        close(&out, &flat(&want), "rotated queries");
    }
}
