//! Sparse attention's choice of keys on a device, for DeepSeek Sparse Attention (V3.2, GLM-5)
//! and DeepSeek-V4's indexer (`device_v4`): every sparse row's index scores over its sequence's
//! keys in a device pool (`deltafin_dsa_scores`, each family's order) and their top-k
//! (`deltafin_dsa_topk`), a bounded group of rows at a time; only the chosen positions come
//! down. The queries, head weights and keys are the host's (each family's own code).

use super::dsa;
use crate::backend::abi::{self, LayerLaunch};
use crate::backend::device::DeviceOps;
use crate::error::Result;

/// Whose order the scores follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreOrder {
    /// DeepSeek Sparse Attention (`dsa::index_scores_reference`).
    Dsa,
    /// DeepSeek-V4's indexer (`compressed::index_scores`).
    V4,
}

/// Rows to score: each of `rows` (indices into `q` and `w`, which hold every row of the pass:
/// `heads · d` queries and `heads` head weights a row) scores the `len` keys of `keys` from row
/// `first` (`spans[j] = (first, len)` for `rows[j]`).
#[derive(Debug)]
pub struct ScoredRows<'a> {
    pub rows: &'a [usize],
    pub spans: &'a [(usize, usize)],
    pub q: &'a [f32],
    pub w: &'a [f32],
}

/// Each row's `k` highest-scoring keys (ascending positions from its first key), on the device,
/// [`dsa::ROW_GROUP`] rows a launch so a long prefill never holds more scores than that.
pub fn top_keys<D: DeviceOps>(
    dev: &D,
    keys: &D::Buf,
    (heads, d, k): (usize, usize, usize),
    rows: ScoredRows<'_>,
    order: ScoreOrder,
) -> Result<Vec<Vec<u32>>> {
    let mut chosen = Vec::with_capacity(rows.spans.len());
    for (ids, spans) in rows
        .rows
        .chunks(dsa::ROW_GROUP)
        .zip(rows.spans.chunks(dsa::ROW_GROUP))
    {
        let qs: Vec<f32> = ids
            .iter()
            .flat_map(|&i| rows.q[i * heads * d..][..heads * d].iter().copied())
            .collect();
        let ws: Vec<f32> = ids
            .iter()
            .flat_map(|&i| rows.w[i * heads..][..heads].iter().copied())
            .collect();
        let stride = spans.iter().map(|&(_, len)| len).max().unwrap_or(0);
        let info: Vec<i32> = spans
            .iter()
            .flat_map(|&(s, len)| [s as i32, len as i32])
            .collect();
        let info = dev.upload_i32(&info)?;
        let scores = dev.zeros_f32(spans.len() * stride)?;
        let (qs, ws) = (dev.upload_f32(&qs)?, dev.upload_f32(&ws)?);
        let scale = (d as f32).powf(-0.5);
        let launch: LayerLaunch = match order {
            ScoreOrder::Dsa => abi::dsa_scores(spans.len(), (heads, d), stride, scale),
            ScoreOrder::V4 => abi::v4_index_scores(spans.len(), (heads, d), stride, scale),
        };
        let bufs = [Some(&qs), Some(&ws), Some(keys), Some(&info), Some(&scores)];
        dev.layer(&launch, &bufs)?;
        let top = dev.zeros(4 * spans.len() * k)?;
        let launch = abi::dsa_topk(spans.len(), stride, k);
        dev.layer(&launch, &[Some(&scores), Some(&info), Some(&top)])?;
        let top = dev.download(&top)?;
        chosen.extend(top.chunks(4 * k.max(1)).take(spans.len()).map(|row| {
            row.chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().expect("four bytes")))
                .take_while(|&p| p >= 0)
                .map(|p| p as u32)
                .collect::<Vec<u32>>()
        }));
    }
    Ok(chosen)
}
