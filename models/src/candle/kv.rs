//! The candle backend's block pool: per layer, one f16 tensor of keys and one of values on the
//! device, `[num_blocks · block_size, kv_heads · head_dim]`, a row per slot (slot
//! `block · block_size + pos % block_size`), and the op that writes a step's keys and values
//! into it.
//!
//! The write is one in-place op per pool ([`KvWrite`]): it reads the step's K (or V) columns
//! straight out of the fused QKV product, applies RoPE to keys, rounds to f16 and stores each
//! token's row in its slot. As separate candle ops that was seven launches per layer (two
//! copies out of the product, RoPE, two conversions, two scatters); on a GPU a decode step is
//! launch-bound, so it is two. The CPU implementation computes exactly what those ops did, and
//! is what the tests run; the CUDA one is `kv.cu` (PTX from `build.rs` under `cuda`).

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{CpuStorage, DType, Device, InplaceOp2, Layout, Tensor};
use half::f16;

use super::fused::rotated_pairs;
#[cfg(any(feature = "cuda", test))]
use super::operands::Grid;
use super::operands::{cpu_slice, held_on_cpu};
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::kv::pool_elements;

/// Per-layer K and V rows in half floats, on the model's device.
#[derive(Debug)]
pub struct DeviceKv {
    layers: Vec<(Tensor, Tensor)>,
    /// Which pool this is, for what remembers its addresses (captured steps, [`super::replay`]).
    id: u64,
    /// The block past the `num_blocks` the store hands out: where padding rows of a replayed
    /// step write, never read by a sequence.
    scratch_block: u32,
}

/// Pools made so far in this process: each pool's [`DeviceKv::id`].
static POOLS: AtomicU64 = AtomicU64::new(0);

/// Where a step's keys and values come from and go to, shared by every layer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepRows<'a> {
    /// `[n]` u32: each token's pool slot.
    pub slots: &'a Tensor,
    /// `[n, head_dim / 2]` f32 each: each token's RoPE rotation.
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
}

impl DeviceKv {
    /// Allocates the pool, zeroed, with one scratch block past `num_blocks`. A device that
    /// cannot hold it gives an error naming the size, never an abort later.
    pub(crate) fn new(
        config: &LlamaConfig,
        num_blocks: usize,
        block_size: usize,
        device: &Device,
    ) -> Result<Self> {
        let blocks = num_blocks + 1;
        pool_elements(config, blocks, block_size)?;
        let shape = (blocks * block_size, config.kv_width());
        let alloc = || {
            Tensor::zeros(shape, DType::F16, device).map_err(|e| {
                ModelError::Device(format!(
                    "cannot allocate a KV pool of {num_blocks} blocks ({} MiB) on {:?}: {e}",
                    (blocks * crate::kv::KvStore::bytes_per_block(config, block_size)) >> 20,
                    device.location()
                ))
            })
        };
        let layers = (0..config.block_count)
            .map(|_| Ok((alloc()?, alloc()?)))
            .collect::<Result<_>>()?;
        let scratch_block = u32::try_from(num_blocks)
            .map_err(|_| ModelError::Device(format!("{num_blocks} KV blocks overflow u32")))?;
        Ok(Self {
            layers,
            id: POOLS.fetch_add(1, Ordering::Relaxed),
            scratch_block,
        })
    }

    /// Which pool this is: distinct for every pool this process makes.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The block no sequence is given: padding rows write and read it.
    pub(crate) fn scratch_block(&self) -> u32 {
        self.scratch_block
    }

    /// Writes the step's keys (RoPE applied) and values into their slots, reading them from
    /// `qkv` (`[n, (heads + 2·kv_heads) · head_dim]` f32: queries, keys, values).
    pub(crate) fn write(
        &self,
        layer: usize,
        qkv: &Tensor,
        rows: StepRows<'_>,
        config: &LlamaConfig,
    ) -> Result<()> {
        let (kp, vp) = &self.layers[layer];
        let keys = config.head_count * config.head_dim;
        let op = |column: usize, rope: bool| KvWrite {
            rows,
            column,
            rope,
            head_dim: config.head_dim,
        };
        kp.inplace_op2(qkv, &op(keys, true))?;
        vp.inplace_op2(qkv, &op(keys + config.kv_width(), false))?;
        Ok(())
    }

    /// A layer's key and value pools.
    pub(crate) fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }
}

/// The op: `pool.inplace_op2(qkv, op)` stores `qkv[:, column .. column + kv_width]` (rotated
/// when `rope`) as f16 in each token's slot of `pool` (`[slots, kv_width]`).
#[derive(Debug, Clone, Copy)]
struct KvWrite<'a> {
    rows: StepRows<'a>,
    column: usize,
    rope: bool,
    head_dim: usize,
}

/// What the op checked: the step's tokens, the pool's slots and widths.
#[derive(Debug, Clone, Copy)]
struct Dims {
    n: usize,
    slots: usize,
    kv_width: usize,
    /// Elements per row of `qkv`.
    stride: usize,
}

impl KvWrite<'_> {
    fn check(&self, pool: &Layout, src: &Layout) -> candle_core::Result<Dims> {
        let (slots, kv_width) = pool.shape().dims2()?;
        let (n, stride) = src.shape().dims2()?;
        let hd = self.head_dim;
        let half = hd / 2;
        let ok = pool.is_contiguous()
            && pool.start_offset() == 0
            && src.is_contiguous()
            && hd.is_multiple_of(2)
            && kv_width.is_multiple_of(hd)
            && self.column + kv_width <= stride
            && self.rows.slots.dims() == [n]
            && self.rows.cos.dims() == [n, half]
            && self.rows.sin.dims() == [n, half];
        if !ok {
            candle_core::bail!(
                "kv write: pool {:?}, qkv {:?} from column {}, slots {:?}, rope {:?}: shapes \
                 do not match (head_dim {hd})",
                pool.dims(),
                src.dims(),
                self.column,
                self.rows.slots.dims(),
                self.rows.cos.dims()
            );
        }
        Ok(Dims {
            n,
            slots,
            kv_width,
            stride,
        })
    }
}

impl InplaceOp2 for KvWrite<'_> {
    fn name(&self) -> &'static str {
        "kv-write"
    }

    fn cpu_fwd(
        &self,
        pool: &mut CpuStorage,
        pl: &Layout,
        src: &CpuStorage,
        sl: &Layout,
    ) -> candle_core::Result<()> {
        let d = self.check(pl, sl)?;
        let CpuStorage::F16(pool) = pool else {
            candle_core::bail!("kv write: the pool is not f16");
        };
        let name = self.name();
        let src = cpu_slice::<f32>(src, sl, name)?;
        held_on_cpu::<u32, _>(self.rows.slots, name, |slots| {
            held_on_cpu::<f32, _>(self.rows.cos, name, |cos| {
                held_on_cpu::<f32, _>(self.rows.sin, name, |sin| {
                    for (r, &slot) in slots.iter().take(d.n).enumerate() {
                        let slot = slot as usize;
                        if slot >= d.slots {
                            candle_core::bail!("kv write: slot {slot} is out of the pool");
                        }
                        let from = &src[r * d.stride + self.column..][..d.kv_width];
                        let to = &mut pool[slot * d.kv_width..][..d.kv_width];
                        let half = self.head_dim / 2;
                        let rot = (&cos[r * half..][..half], &sin[r * half..][..half]);
                        self.row(from, to, rot);
                    }
                    Ok(())
                })
            })
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        pool: &mut candle_core::CudaStorage,
        pl: &Layout,
        src: &candle_core::CudaStorage,
        sl: &Layout,
    ) -> candle_core::Result<()> {
        let d = self.check(pl, sl)?;
        cuda::write(self, d, pool, (src, sl))
    }
}

#[cfg(any(feature = "cuda", test))]
impl KvWrite<'_> {
    /// The CUDA kernel's grid: a thread per (token, pair of columns).
    fn grid(d: Dims) -> Grid {
        Grid::per_item(d.n * d.kv_width / 2)
    }

    /// The kernel's scalar arguments after its pointers: tokens, `qkv`'s row stride, the
    /// first column written, the pool's width, the head dimension, whether to rotate.
    fn kernel_ints(&self, d: Dims) -> [i32; 6] {
        [
            d.n as i32,
            d.stride as i32,
            self.column as i32,
            d.kv_width as i32,
            self.head_dim as i32,
            i32::from(self.rope),
        ]
    }
}

impl KvWrite<'_> {
    /// One token: `from` (f32, `kv_width`) rotated pairwise by `(cos, sin)` when `rope`, as
    /// GGUF's interleaved RoPE does, into `to` (f16).
    fn row(&self, from: &[f32], to: &mut [f16], angles: (&[f32], &[f32])) {
        if !self.rope {
            to.iter_mut()
                .zip(from)
                .for_each(|(t, &x)| *t = f16::from_f32(x));
            return;
        }
        let pairs = rotated_pairs(from, self.head_dim, angles);
        for (y, (y0, y1)) in to.chunks_exact_mut(2).zip(pairs) {
            (y[0], y[1]) = (f16::from_f32(y0), f16::from_f32(y1));
        }
    }
}

// Launching a kernel is an FFI call (the crate's other unsafe code is the CPU kernels').
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod cuda {
    //! The CUDA launch: one thread per (token, pair of columns).

    use candle_core::cuda::cudarc::driver::PushKernelArg;
    use candle_core::cuda::WrapErr;
    use candle_core::{CudaStorage, Layout};
    use half::f16;

    use candle_core::cuda::cudarc::driver::LaunchConfig;

    use super::{Dims, KvWrite};
    use crate::candle::operands::{held, view};

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kv.ptx"));

    pub(super) fn write(
        op: &KvWrite<'_>,
        d: Dims,
        pool: &mut CudaStorage,
        (src, sl): (&CudaStorage, &Layout),
    ) -> candle_core::Result<()> {
        let pairs = d.n * d.kv_width / 2;
        if pairs == 0 {
            return Ok(());
        }
        let dev = pool.device.clone();
        let func = dev.get_or_load_custom_func("kv_write_f16", "sluice_kv", PTX)?;
        let srcv = view::<f32>(src, sl)?;
        let ints = op.kernel_ints(d);
        let name = "kv write";
        held::<u32, _>(op.rows.slots, name, |slots| {
            held::<f32, _>(op.rows.cos, name, |cos| {
                held::<f32, _>(op.rows.sin, name, |sin| {
                    let mut b = func.builder();
                    b.arg(pool.as_cuda_slice_mut::<f16>()?);
                    b.arg(&srcv);
                    b.arg(&cos);
                    b.arg(&sin);
                    b.arg(&slots);
                    for i in &ints {
                        b.arg(i);
                    }
                    // SAFETY: the arguments match kv.cu's signature; `check` matched every
                    // shape, and the slots come from block tables the KV store validated.
                    unsafe { b.launch(LaunchConfig::from(KvWrite::grid(d))) }.w()?;
                    Ok(())
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::{DeviceKv, StepRows};
    use crate::candle::paged_tests::config;

    /// The fused write stores what RoPE, the f16 conversion and a scatter stored.
    #[test]
    fn the_write_stores_rotated_keys_and_values_in_their_slots() {
        let dev = Device::Cpu;
        let config = config(4, 2, 8);
        let (heads, kv_w, hd) = (4, config.kv_width(), 8);
        let kv = DeviceKv::new(&config, 4, 4, &dev).unwrap();
        let n = 3;
        let qkv = Tensor::randn(0f32, 1.0, (n, heads * hd + 2 * kv_w), &dev).unwrap();
        let angles = Tensor::randn(0f32, 1.0, (n, hd / 2), &dev).unwrap();
        let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
        let slots = Tensor::new(&[5u32, 0, 13], &dev).unwrap();
        let rows = StepRows {
            slots: &slots,
            cos: &cos,
            sin: &sin,
        };
        kv.write(0, &qkv, rows, &config).unwrap();

        let k = qkv
            .narrow(1, heads * hd, kv_w)
            .unwrap()
            .contiguous()
            .unwrap();
        let k = k.reshape((n, kv_w / hd, 1, hd)).unwrap();
        let (c3, s3) = (
            cos.reshape((n, 1, ())).unwrap(),
            sin.reshape((n, 1, ())).unwrap(),
        );
        let k = candle_nn::rotary_emb::rope_i(&k, &c3, &s3).unwrap();
        let k = k.reshape((n, kv_w)).unwrap().to_dtype(DType::F16).unwrap();
        let v = qkv.narrow(1, heads * hd + kv_w, kv_w).unwrap();
        let v = v.to_dtype(DType::F16).unwrap();
        let (kp, vp) = kv.layer(0);
        let as_f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
        let (kp, vp, k, v) = (as_f32(kp), as_f32(vp), as_f32(&k), as_f32(&v));
        for (r, slot) in [5usize, 0, 13].into_iter().enumerate() {
            assert_eq!(kp[slot], k[r], "key row {r}");
            assert_eq!(vp[slot], v[r], "value row {r}");
        }
        let untouched = kp[1].iter().chain(&vp[1]).all(|&x| x == 0.0);
        assert!(untouched, "other slots stay as they were");

        // Four blocks of four and the scratch block: slot 20 is past the pool.
        let far = Tensor::new(&[5u32, 0, 20], &dev).unwrap();
        let rows = StepRows {
            slots: &far,
            ..rows
        };
        assert!(
            kv.write(0, &qkv, rows, &config).is_err(),
            "a slot past the pool is refused"
        );
    }

    /// kv.cu, compiled for the host and run under the emulation of CUDA's execution model
    /// (`emulator.rs`: no GPU here), with the grid and arguments its CUDA launch takes from the
    /// op, stores what the CPU op stores: keys rotated, values as they are, each token in its
    /// slot, from a QKV product wider than the pool; more pairs than one block has threads.
    #[test]
    fn the_cuda_kernel_agrees_with_the_cpu_op_under_emulation() {
        use super::KvWrite;
        use crate::candle::emulator::{self, as_f16s, Arg};

        let dev = Device::Cpu;
        let (heads, kv_heads, hd) = (9, 3, 64);
        let kv_w = kv_heads * hd;
        let n = 5;
        let qkv = Tensor::randn(0f32, 1.0, (n, heads * hd + 2 * kv_w), &dev).unwrap();
        let angles = Tensor::randn(0f32, 2.0, (n, hd / 2), &dev).unwrap();
        let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
        let slots = Tensor::new(&[5u32, 0, 13, 31, 2], &dev).unwrap();
        let rows = StepRows {
            slots: &slots,
            cos: &cos,
            sin: &sin,
        };
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for (column, rope) in [(heads * hd, true), (heads * hd + kv_w, false)] {
            let op = KvWrite {
                rows,
                column,
                rope,
                head_dim: hd,
            };
            let pool = Tensor::zeros((32, kv_w), DType::F16, &dev).unwrap();
            let d = op.check(pool.layout(), qkv.layout()).unwrap();
            pool.inplace_op2(&qkv, &op).unwrap();
            let want = pool.flatten_all().unwrap().to_vec1::<half::f16>().unwrap();
            let mut args = vec![
                Arg::f16s(&vec![half::f16::ZERO; 32 * kv_w]),
                Arg::f32s(&flat(&qkv)),
                Arg::f32s(&flat(&cos)),
                Arg::f32s(&flat(&sin)),
                Arg::u32s(&slots.to_vec1::<u32>().unwrap()),
            ];
            args.extend(Arg::ints(&op.kernel_ints(d)));
            let out = emulator::launch("kv_write_f16", KvWrite::grid(d), args)
                .unwrap_or_else(|e| panic!("{e}"));
            let got = as_f16s(&out[0]);
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let (g, w) = (g.to_f32(), w.to_f32());
                // Within one rounding of an f16 (the rotation's products may round apart).
                assert!(
                    (g - w).abs() <= 1e-3 * w.abs().max(1.0),
                    "element {i}: {g} vs {w} (rope {rope})"
                );
            }
        }
    }
}
