//! CPU kernels for the forward pass: the only place in the crate that uses `unsafe`.
//!
//! Every kernel here is **batch invariant**: the value computed for one output element depends
//! only on that element's inputs, never on how many other rows share the call or on which thread
//! runs it. The reduction order of each dot product is fixed (eight lanes, chunks in order, one
//! fixed horizontal sum), so a sequence's logits are bit-identical alone or in a batch, prefilled
//! whole or in chunks. Changing a kernel must keep that property (the model tests check it).
//!
//! SIMD paths are chosen at run time (`is_x86_feature_detected!`), never by compile-time
//! `target-cpu`, and each has a scalar reference that it is tested against bit for bit.
//!
//! - [`dot`]: the fixed-order dot product and its SIMD variants.
//! - [`matmul`]: `activations × weightsᵀ` over a whole ragged batch, split by output columns.
//! - [`qmatmul`] and [`quant`]: 8-bit activations against Q4_1 / Q4_0 / Q8_0 weights; on AVX2,
//!   calls with several rows go to `qbatch`, which expands each weight column once for them.
//! - `f16c`: widening half floats (weight scales, the KV cache) inside the x86 kernels.
//! - [`kquant`] and [`kqmatmul`]: llama.cpp's k-quants (Q4_K, Q6_K) repacked, and their product.
//! - [`norm`]: RMS normalisation.
//! - [`rope`]: rotary position embeddings from a precomputed table.
//! - [`attention`]: causal grouped-query attention reading KV blocks in place (on AVX2 the query
//!   heads sharing a KV head run together, each half float widened once).
//! - [`activation`]: SiLU-gated linear unit.
//! - [`exp`]: a vectorisable exponential for softmax and SiLU.
//! - [`testdata`]: random quantized blocks for the tests and the kernel benchmark.

pub mod activation;
pub mod attention;
pub mod dot;
pub mod exp;
#[cfg(target_arch = "x86_64")]
mod f16c;
pub mod kqmatmul;
pub mod kquant;
pub mod matmul;
pub mod norm;
#[cfg(target_arch = "x86_64")]
mod qbatch;
pub mod qmatmul;
pub mod quant;
pub mod rope;
pub mod testdata;
