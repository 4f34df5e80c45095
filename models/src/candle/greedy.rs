//! Greedy ids picked on the model's device, for rows whose sequence asked for nothing else
//! ([`Logits::Greedy`](crate::Logits::Greedy)): on a GPU, 4 bytes a row cross to the host
//! instead of the row (196 kB for the default model, 513 kB for Llama-3), and the host does
//! not scan it.
//!
//! candle's `argmax` keeps the first maximum it meets, which on a GPU is not always the
//! lowest id among exact ties (threads take strided columns); any of them is a greedy choice.
//! The CPU's and the sampler's pick the lowest.

use candle_core::{DType, Device, Tensor, D};

use crate::error::Result;

/// Whether `SLUICE_DEVICE_ARGMAX` leaves greedy ids to the device (anything but `0`, `off` or
/// `false`; on by default): a switch for every binary, for measuring one way against the
/// other.
pub fn from_env() -> bool {
    super::env_switch("SLUICE_DEVICE_ARGMAX", true)
}

/// The greedy id of each row of `logits` (`[rows, vocab]`, on the model's device) that
/// `greedy` bounds (`Some(below)`: the most likely id below `below`), in row order.
pub(crate) fn ids(logits: &Tensor, greedy: &[Option<u32>]) -> Result<Vec<u32>> {
    let (rows, vocab) = logits.dims2()?;
    assert_eq!(rows, greedy.len(), "a bound or none per row");
    let mut ids = vec![0u32; rows];
    let mut bounds: Vec<u32> = greedy.iter().flatten().copied().collect();
    bounds.sort_unstable();
    bounds.dedup();
    // One reduction per bound: every row of a model has the same one.
    for below in bounds {
        let at: Vec<u32> = (0..rows as u32)
            .filter(|&i| greedy[i as usize] == Some(below))
            .collect();
        let width = (below as usize).clamp(1, vocab);
        let picked = logits
            .index_select(&Tensor::new(at.as_slice(), logits.device())?, 0)?
            .narrow(1, 0, width)?
            .argmax(D::Minus1)?
            .to_dtype(DType::U32)?
            .to_device(&Device::Cpu)?
            .to_vec1::<u32>()?;
        for (&i, id) in at.iter().zip(picked) {
            ids[i as usize] = id;
        }
    }
    Ok(greedy
        .iter()
        .zip(ids)
        .filter_map(|(g, id)| g.map(|_| id))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logits::argmax;

    #[test]
    fn each_bounded_row_gets_the_sampler_s_greedy_id_below_its_bound() {
        let vocab = 1000;
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|r| {
                (0..vocab)
                    .map(|i| ((i * 7919 + r * 104_729) % 997) as f32 * 0.01 - (r as f32))
                    .collect()
            })
            .collect();
        let t = Tensor::new(rows.concat(), &Device::Cpu)
            .unwrap()
            .reshape((6, vocab))
            .unwrap();
        let greedy = [Some(1000), None, Some(300), Some(1000), None, Some(5000)];
        let got = ids(&t, &greedy).unwrap();
        let want: Vec<u32> = greedy
            .iter()
            .zip(&rows)
            .filter_map(|(g, r)| g.map(|b| argmax(&r[..(b as usize).min(vocab)])))
            .collect();
        assert_eq!(got, want);
        assert_eq!(got.len(), 4);
    }
}
