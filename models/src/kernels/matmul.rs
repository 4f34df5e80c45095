//! `out = x · wᵀ` for a whole ragged batch: every weight row is loaded once per block of
//! activation rows and used for all of them, and threads split the work by output columns so
//! each streams its own part of the weights.

use rayon::prelude::*;

use super::dot::{best_path, tile, DotPath};

/// Activation rows handled against one tile of weight rows before moving on; sized so the rows
/// (up to 64 × 1536 floats = 384 KiB) stay in L2 while the weight tile sits in L1.
const ROW_BLOCK: usize = 64;
/// Output columns per parallel task: enough work to amortise scheduling, small enough that two
/// threads stay balanced on the narrowest projections (192 columns).
const COLS_PER_TASK: usize = 32;
const TILE_R: usize = 2;
const TILE_C: usize = 4;

/// A raw pointer to the output that tasks share; each task writes only its own columns.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: tasks write disjoint column ranges of the output, never the same element.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Computes `out[r][c] = Σ_k x[r][k] · w[c][k]` for `rows` rows of `x` (`rows × k`) and the
/// `n × k` row-major weight matrix `w`, writing `out` as `rows × n`.
pub fn matmul_t(
    pool: &rayon::ThreadPool,
    x: &[f32],
    rows: usize,
    w: &[f32],
    n: usize,
    out: &mut [f32],
) {
    if rows == 0 || n == 0 {
        return;
    }
    let k = x.len() / rows;
    assert_eq!(x.len(), rows * k, "activations are not rows × k");
    assert_eq!(w.len(), n * k, "weights are not n × k");
    assert_eq!(out.len(), rows * n, "output is not rows × n");
    let path = best_path();
    split_columns(pool, n, COLS_PER_TASK, out, |c0, c1, out_ptr| {
        // SAFETY: `x`, `w` and `out` have the checked shapes; this task writes only columns
        // c0..c1, which no other task touches.
        unsafe { columns(path, x, rows, k, w, n, c0, c1, out_ptr) };
    });
}

/// Runs `task(c0, c1, out)` over `n` output columns in ranges of `per_task`, on the pool's
/// threads when there is more than one range. Tasks must write only their own columns of `out`.
pub(crate) fn split_columns(
    pool: &rayon::ThreadPool,
    n: usize,
    per_task: usize,
    out: &mut [f32],
    task: impl Fn(usize, usize, OutPtr) + Sync + Send,
) {
    split_columns_with(
        pool,
        n,
        per_task,
        out,
        || (),
        |_, c0, c1, out| task(c0, c1, out),
    );
}

/// [`split_columns`] with working memory: `init` makes one `S` per piece of work a thread
/// takes (rayon hands out runs of ranges, not single ones), and the ranges of that run reuse
/// it, so a kernel that needs scratch space does not allocate and clear it per range.
pub(crate) fn split_columns_with<S>(
    pool: &rayon::ThreadPool,
    n: usize,
    per_task: usize,
    out: &mut [f32],
    init: impl Fn() -> S + Sync + Send,
    task: impl Fn(&mut S, usize, usize, OutPtr) + Sync + Send,
) {
    let tasks = n.div_ceil(per_task);
    let out_ptr = OutPtr(out.as_mut_ptr());
    let run = |s: &mut S, t: usize| task(s, t * per_task, ((t + 1) * per_task).min(n), out_ptr);
    if tasks == 1 || pool.current_num_threads() == 1 {
        let mut s = init();
        (0..tasks).for_each(|t| run(&mut s, t));
    } else {
        pool.install(|| (0..tasks).into_par_iter().for_each_init(&init, run));
    }
}

/// # Safety
/// Shapes as checked by `matmul_t`; only columns `c0..c1` of `out` are written.
#[allow(clippy::too_many_arguments)]
unsafe fn columns(
    path: DotPath,
    x: &[f32],
    rows: usize,
    k: usize,
    w: &[f32],
    n: usize,
    c0: usize,
    c1: usize,
    out: OutPtr,
) {
    let xr = |r: usize| x[r * k..].as_ptr();
    let wr = |c: usize| w[c * k..].as_ptr();
    let store = |r: usize, c: usize, v: f32| {
        // SAFETY: r < rows and c < n, within the output; the column belongs to this task.
        unsafe { *out.0.add(r * n + c) = v };
    };
    walk_tiles(
        rows,
        c0,
        c1,
        ROW_BLOCK,
        TILE_R,
        TILE_C,
        |r, height, c, width| {
            // Dispatch on the tile's shape; each element's value does not depend on it.
            macro_rules! run_tile {
                ($R:literal, $C:literal) => {{
                    let xs: [*const f32; $R] = std::array::from_fn(|i| xr(r + i));
                    let ws: [*const f32; $C] = std::array::from_fn(|j| wr(c + j));
                    // SAFETY: each pointer starts a full row of k floats.
                    let t = unsafe { tile::<$R, $C>(path, xs, ws, k) };
                    for (i, row) in t.iter().enumerate() {
                        for (j, v) in row.iter().enumerate() {
                            store(r + i, c + j, *v);
                        }
                    }
                }};
            }
            match (height, width) {
                (2, 4) => run_tile!(2, 4),
                (2, 3) => run_tile!(2, 3),
                (2, 2) => run_tile!(2, 2),
                (2, 1) => run_tile!(2, 1),
                (1, 4) => run_tile!(1, 4),
                (1, 3) => run_tile!(1, 3),
                (1, 2) => run_tile!(1, 2),
                _ => run_tile!(1, 1),
            }
        },
    );
}

/// Walks the `rows × (c0..c1)` part of an output in tiles of at most `max_r × max_c`: rows in
/// blocks of `row_block` (kept in cache), within a block every column tile, within that every
/// row tile, so one tile of weights is reused for all rows of the block. Calls
/// `tile(row, height, column, width)` for each.
pub(crate) fn walk_tiles(
    rows: usize,
    c0: usize,
    c1: usize,
    row_block: usize,
    max_r: usize,
    max_c: usize,
    mut tile: impl FnMut(usize, usize, usize, usize),
) {
    for rb in (0..rows).step_by(row_block) {
        let re = (rb + row_block).min(rows);
        let mut c = c0;
        while c < c1 {
            let width = (c1 - c).min(max_c);
            let mut r = rb;
            while r < re {
                let height = (re - r).min(max_r);
                tile(r, height, c, width);
                r += height;
            }
            c += width;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dot::dot;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    fn data(n: usize, salt: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(salt) % 1000) as f32 / 500.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn every_element_is_the_reference_dot_whatever_the_batch() {
        let path = best_path();
        for (rows, k, n) in [
            (1, 576, 192),
            (3, 576, 37),
            (67, 64, 9),
            (5, 1536, 576),
            (130, 8, 5),
        ] {
            let x = data(rows * k, 1);
            let w = data(n * k, 2);
            for threads in [1, 2, 3] {
                let mut out = vec![0.0; rows * n];
                matmul_t(&pool(threads), &x, rows, &w, n, &mut out);
                for r in 0..rows {
                    // Each row alone gives the same bits as in the batch.
                    let mut alone = vec![0.0; n];
                    matmul_t(&pool(threads), &x[r * k..(r + 1) * k], 1, &w, n, &mut alone);
                    for c in 0..n {
                        let expected = dot(path, &x[r * k..(r + 1) * k], &w[c * k..(c + 1) * k]);
                        assert_eq!(out[r * n + c].to_bits(), expected.to_bits());
                        assert_eq!(alone[c].to_bits(), expected.to_bits());
                    }
                }
            }
        }
    }

    #[test]
    fn empty_shapes_are_no_ops() {
        let mut out: Vec<f32> = vec![];
        matmul_t(&pool(2), &[], 0, &[1.0; 8], 1, &mut out);
        assert!(out.is_empty());
    }
}
