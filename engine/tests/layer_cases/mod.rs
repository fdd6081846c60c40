//! Layer-kernel cases shared by the emulator (`cuda_emulated_layers.rs`) and the GPU
//! (`cuda.rs`): each builds inputs, runs one launch of `backend::abi` through the given runner
//! and compares the result with the CPU function bit for bit.

#![allow(dead_code)]

use deltafin_engine::backend::abi::{self, LayerLaunch};
use deltafin_engine::kernels::{Format, Matrix, ops};
use deltafin_engine::model::layers::mlp::Activation;
use deltafin_engine::model::layers::moe::{self, Combine, Moe, RouterConfig, Scoring};
use deltafin_engine::weights::Blob;

use crate::kernel_support::{Rng, assert_same, bytes_of, floats, patterned};

mod hyper;
mod v4_attention;
pub use hyper::hyper_connections;
pub use v4_attention::v4_attention;

/// Runs one launch over buffers (each buffer's bytes, rewritten in place).
pub type Runner<'a> = &'a dyn Fn(&LayerLaunch, &mut [Vec<u8>]);

/// `len` values uniform in `[-scale, scale)`: unlike [`patterned`], no occasional large value
/// that would make a softmax one-hot and hide its order.
fn uniform(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..len).map(|_| rng.unit() * scale).collect()
}

fn run_on(run: Runner, l: &LayerLaunch, bufs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut bufs = bufs.to_vec();
    run(l, &mut bufs);
    bufs
}

/// RMSNorm (`deltafin_rms_norm`) against `ops::rms_norm`: widths below, at and past 16 lanes.
pub fn rms_norm(run: Runner) {
    for (i, &(rows, width)) in [(1, 1), (3, 15), (17, 16), (5, 300), (20, 7)].iter().enumerate() {
        let x = patterned(rows * width, 40 + i as u64);
        let w = patterned(width, 50 + i as u64);
        let eps = 1e-6;
        let mut want = vec![0.0; rows * width];
        for (o, r) in want.chunks_mut(width).zip(x.chunks(width)) {
            ops::rms_norm(r, &w, eps, o);
        }
        let l = abi::rms_norm(rows, width, eps);
        let out = run_on(run, &l, &[bytes_of(&x), bytes_of(&w), vec![0; 4 * rows * width]]);
        assert_same(&want, &floats(&out[2]), &format!("rms_norm {rows}x{width}"));
    }
}

/// SiLU, SiTU, SiTU with a capped up branch and gpt-oss's clamped SwiGLU (`deltafin_gated_act`) against
/// `Activation::apply`, and the residual add (`deltafin_add`).
pub fn gated_activations(run: Runner) {
    let n = 5000;
    let scale = |v: Vec<f32>, s: f32| v.into_iter().map(|x| x * s).collect::<Vec<_>>();
    let g = scale(patterned(n, 7), 12.0);
    let u = scale(patterned(n, 8), 9.0);
    for act in [
        Activation::Silu,
        Activation::Situ {
            beta: 10.0,
            linear_beta: None,
        },
        Activation::Situ {
            beta: 3.5,
            linear_beta: Some(7.0),
        },
        Activation::ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0,
        },
    ] {
        let want: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| act.apply(g, u)).collect();
        let out = run_on(
            run,
            &abi::gated_act(n, act).unwrap(),
            &[bytes_of(&g), bytes_of(&u), vec![0; 4 * n]],
        );
        assert_same(&want, &floats(&out[2]), &format!("{act:?}"));
    }
    let want: Vec<f32> = g.iter().zip(&u).map(|(a, b)| a + b).collect();
    let out = run_on(run, &abi::add(n), &[bytes_of(&g), bytes_of(&u), vec![0; 4 * n]]);
    assert_same(&want, &floats(&out[2]), "add");
}

fn moe_with(experts: usize, bias: Vec<f32>, router: RouterConfig) -> Moe {
    let gate = Matrix::new(
        Format::F32,
        experts,
        1,
        Blob::from_vec(vec![0; 4 * experts]),
        None,
    )
    .unwrap();
    Moe {
        gate,
        bias,
        logit_bias: Vec::new(),
        router,
        experts: Vec::new(),
        shared: None,
        shared_gate: None,
        latent: None,
        combine: Combine::RouteOrder,
        hash: None,
    }
}

/// Router logits with ties (repeated values) and either sign.
fn logits(rows: usize, experts: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..rows * experts)
        .map(|_| match rng.next() % 8 {
            0 => 0.25,
            1 => -1.5,
            _ => rng.unit() * 6.0,
        })
        .collect()
}

/// The router (`deltafin_route`) against `Moe::route`: sigmoid with bias and groups, softmax,
/// renormalised or not, gpt-oss's softmax over the chosen logits (scaled), ties in the logits.
pub fn routing(run: Runner) {
    let cases = [
        (16, true, Scoring::Sigmoid, 4, 2, 4, true, 2.5),
        (64, true, Scoring::Sigmoid, 8, 4, 8, true, 2.827),
        (12, false, Scoring::Softmax, 1, 1, 3, true, 1.0),
        (10, false, Scoring::Softmax, 1, 1, 4, false, 1.0),
        (9, true, Scoring::Sigmoid, 1, 1, 9, false, 1.5),
        (32, false, Scoring::TopKSoftmax, 1, 1, 4, false, 1.0),
        (8, false, Scoring::TopKSoftmax, 1, 1, 3, true, 2.0),
    ];
    for (c, &(e, biased, scoring, n_group, topk_group, top_k, norm, scaling)) in cases.iter().enumerate() {
        let rows = 37;
        let router = RouterConfig {
            scoring,
            top_k,
            n_group,
            topk_group,
            norm_topk_prob: norm,
            scaling,
        };
        let bias = if biased {
            patterned(e, 90 + c as u64)
        } else {
            Vec::new()
        };
        let moe = moe_with(e, bias.clone(), router.clone());
        let l = logits(rows, e, 70 + c as u64);
        let scratch = abi::route_scratch(rows, e, n_group);
        let bufs = [
            bytes_of(&l),
            bytes_of(&bias),
            vec![0; 4 * rows * top_k],
            vec![0; 4 * rows * top_k],
            vec![0; 4 * scratch],
        ];
        let out = run_on(run, &abi::route(rows, e, &router).unwrap(), &bufs);
        let ids: Vec<i32> = out[2]
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let weights = floats(&out[3]);
        for r in 0..rows {
            let want = moe.route(&l[r * e..(r + 1) * e]);
            let got_ids: Vec<usize> = ids[r * top_k..][..want.len()]
                .iter()
                .map(|&i| i as usize)
                .collect();
            let want_ids: Vec<usize> = want.iter().map(|w| w.0).collect();
            assert_eq!(got_ids, want_ids, "case {c} row {r}: experts");
            let want_w: Vec<f32> = want.iter().map(|w| w.1).collect();
            assert_same(
                &want_w,
                &weights[r * top_k..][..want.len()],
                &format!("case {c} row {r}: weights"),
            );
            assert!(
                ids[r * top_k + want.len()..(r + 1) * top_k]
                    .iter()
                    .all(|&i| i == -1)
            );
        }
    }
}

/// The weighted combine (`deltafin_combine`) against `moe::combine`, rows with 0 to 4 slots.
pub fn combine(run: Runner) {
    let (rows, width) = (9, 37);
    let mut rng = Rng(5);
    let mut offsets = vec![0usize];
    for _ in 0..rows {
        offsets.push(offsets.last().unwrap() + (rng.next() % 5) as usize);
    }
    let slots = *offsets.last().unwrap();
    let results = patterned(slots * width, 11);
    let weights = patterned(slots, 12);
    let want = moe::combine(&results, &weights, &offsets, width);
    let off32: Vec<u8> = offsets.iter().flat_map(|&o| (o as i32).to_le_bytes()).collect();
    let bufs = [
        bytes_of(&results),
        bytes_of(&weights),
        off32,
        vec![0; 4 * rows * width],
    ];
    let out = run_on(run, &abi::combine(rows, width), &bufs);
    assert_same(&want, &floats(&out[3]), "combine");
}

/// Absorbed MLA attention (`deltafin_mla_attend`) against `latent_attention::attend`: two
/// sequences' keys packed in one buffer, rows attending 1 position, a partial tile, a whole
/// tile, across a block boundary and across two; latent and rope widths off the lane count. In
/// one group per (row, head), and split over blocks then merged (`deltafin_mla_partials`,
/// `deltafin_mla_merge`).
pub fn mla_attention(run: Runner) {
    use deltafin_engine::model::layers::latent_attention::{LatentKeys, LatentShape};
    let s = LatentShape {
        heads: 4,
        latent: 37,
        rope: 5,
        scale: 0.21,
    };
    let (first, second) = (1100, 70);
    let mild = |len, seed| uniform(len, seed, 1.5);
    let mut lat = mild((first + second) * s.latent, 61);
    let mut rope = mild((first + second) * s.rope, 62);
    // Larger keys in the second block of the first run, so that its maximum often lies there
    // and the block merge rescales the first block's sums (not only by exp(0) = 1).
    lat[1024 * s.latent..first * s.latent]
        .iter_mut()
        .for_each(|v| *v *= 1.6);
    rope[1024 * s.rope..first * s.rope]
        .iter_mut()
        .for_each(|v| *v *= 1.6);
    let (a, b) = (
        LatentKeys::one(&lat[..first * s.latent], &rope[..first * s.rope], s),
        LatentKeys::one(&lat[first * s.latent..], &rope[first * s.rope..], s),
    );
    // (key run, its first position in the packed buffer, positions attended)
    let rows = [
        (a, 0, 1),
        (a, 0, 63),
        (b, first, 64),
        (b, first, 70),
        (a, 0, 1025),
        (a, 0, 1040),
        (a, 0, 1077),
        (a, 0, 1100),
    ];
    let q_abs = mild(rows.len() * s.heads * s.latent, 63);
    let q_rope = mild(rows.len() * s.heads * s.rope, 64);
    let keys: Vec<_> = rows.iter().map(|&(k, _, len)| (k, len)).collect();
    let want = mla_reference(s, &keys, (&q_abs, &q_rope));
    let info: Vec<u8> = rows
        .iter()
        .flat_map(|&(_, at, len)| [at as i32, len as i32])
        .flat_map(i32::to_le_bytes)
        .collect();
    let bufs = [
        bytes_of(&q_abs),
        bytes_of(&q_rope),
        bytes_of(&lat),
        bytes_of(&rope),
        info,
        vec![0; 4 * want.len()],
    ];
    mla_both_ways(run, s, rows.len(), &bufs, (&want, "mla attention"));
    mla_chosen_attention(run, s, (&lat, &rope), first);
}

/// The CPU's latent contexts (`latent_attention::attend`) of rows `(keys, keys attended)` with
/// absorbed and rotated queries `q_abs`, `q_rope` (`rows × heads` each).
fn mla_reference(
    s: deltafin_engine::model::layers::latent_attention::LatentShape,
    rows: &[(
        deltafin_engine::model::layers::latent_attention::LatentKeys<'_>,
        usize,
    )],
    (q_abs, q_rope): (&[f32], &[f32]),
) -> Vec<f32> {
    use deltafin_engine::model::layers::latent_attention::{LatentQuery, attend};
    let queries: Vec<LatentQuery<'_>> = rows
        .iter()
        .enumerate()
        .map(|(i, &(keys, len))| LatentQuery {
            q_abs: &q_abs[i * s.heads * s.latent..][..s.heads * s.latent],
            q_rope: &q_rope[i * s.heads * s.rope..][..s.heads * s.rope],
            keys,
            len,
        })
        .collect();
    let mut want = vec![0.0; rows.len() * s.heads * s.latent];
    attend(&queries, s, &mut want);
    want
}

/// The MLA kernels over `bufs` (as `deltafin_mla_attend` takes them) for `rows` rows: in one group
/// per (row, head), and split over two blocks then merged; both must give `want`.
fn mla_both_ways(
    run: Runner,
    s: deltafin_engine::model::layers::latent_attention::LatentShape,
    rows: usize,
    bufs: &[Vec<u8>],
    (want, what): (&[f32], &str),
) {
    let l = abi::mla_attend(rows, s.heads, s.latent, s.rope, s.scale).unwrap();
    let out = run_on(run, &l, bufs);
    assert_same(want, &floats(&out[5]), what);
    // Split over blocks (grid rows x heads x 2), then merged.
    let blocks = 2;
    let mut split = bufs.to_vec();
    split[5] = vec![0; 4 * rows * s.heads * blocks * (s.latent + 2)];
    let l = abi::mla_partials(rows, s.heads, (s.latent, s.rope), s.scale, blocks).unwrap();
    let parts = run_on(run, &l, &split).swap_remove(5);
    let merge = [parts, split[4].clone(), vec![0; 4 * want.len()]];
    let out = run_on(run, &abi::mla_merge(rows, s.heads, s.latent, blocks), &merge);
    assert_same(want, &floats(&out[2]), &format!("{what} split over blocks"));
}

/// DeepSeek Sparse Attention's form of the MLA kernels (optional buffers 6 and 7): rows that
/// attend chosen positions of their run (1060 of 1100, past a block; 12; 5) and a dense row
/// beside them (offset -1), against `attend` over `LatentKeys::chosen`; in one group per (row,
/// head), and split over blocks then merged.
fn mla_chosen_attention(
    run: Runner,
    s: deltafin_engine::model::layers::latent_attention::LatentShape,
    (lat, rope): (&[f32], &[f32]),
    first: usize,
) {
    use deltafin_engine::model::layers::latent_attention::LatentKeys;
    let long: Vec<u32> = (0..first as u32).filter(|p| p % 27 != 5).collect();
    let short: Vec<u32> = (0..70).filter(|p| p % 6 == 1).collect();
    let few: Vec<u32> = vec![0, 3, 400, 1050, 1099];
    let (a_lat, a_rope) = (&lat[..first * s.latent], &rope[..first * s.rope]);
    let (b_lat, b_rope) = (&lat[first * s.latent..], &rope[first * s.rope..]);
    // (keys, first position in the packed buffer, keys attended, chosen positions)
    let rows: [(LatentKeys<'_>, usize, usize, Option<&[u32]>); 4] = [
        (
            LatentKeys::chosen(a_lat, a_rope, &long, s),
            0,
            long.len(),
            Some(&long),
        ),
        (
            LatentKeys::chosen(b_lat, b_rope, &short, s),
            first,
            short.len(),
            Some(&short),
        ),
        (LatentKeys::one(a_lat, a_rope, s), 0, 1077, None),
        (
            LatentKeys::chosen(a_lat, a_rope, &few, s),
            0,
            few.len(),
            Some(&few),
        ),
    ];
    assert!(long.len() > 1024, "the long selection crosses a block");
    let mild = |len, seed| uniform(len, seed, 1.5);
    let q_abs = mild(rows.len() * s.heads * s.latent, 71);
    let q_rope = mild(rows.len() * s.heads * s.rope, 72);
    let keys: Vec<_> = rows.iter().map(|&(k, _, len, _)| (k, len)).collect();
    let want = mla_reference(s, &keys, (&q_abs, &q_rope));
    let ints = |v: &mut dyn Iterator<Item = i32>| -> Vec<u8> { v.flat_map(i32::to_le_bytes).collect() };
    let info = ints(&mut rows.iter().flat_map(|&(_, at, len, _)| [at as i32, len as i32]));
    let mut list = Vec::new();
    let offsets = ints(&mut rows.iter().map(|&(.., chosen)| match chosen {
        Some(c) => {
            list.extend(c.iter().map(|&p| p as i32));
            (list.len() - c.len()) as i32
        }
        None => -1,
    }));
    let list = ints(&mut list.into_iter());
    let bufs = [
        bytes_of(&q_abs),
        bytes_of(&q_rope),
        bytes_of(lat),
        bytes_of(rope),
        info,
        vec![0; 4 * want.len()],
        list,
        offsets,
    ];
    let what = "mla attention over chosen positions";
    mla_both_ways(run, s, rows.len(), &bufs, (&want, what));
}

/// One row's index scores on the CPU from its queries, head weights and keys.
type RowScores<'a> = &'a dyn Fn(&[f32], &[f32], &[f32]) -> Vec<f32>;

/// An index-scores launch (`launch(rows, (heads, d), stride, scale)`) against `cpu`'s scores of
/// one row (its queries, head weights and keys): rows over two sequences' keys packed in one
/// buffer, key counts below, at and past a block of 256 threads, values of both signs (the ReLU
/// cuts some heads) and one head of zero queries; seeds from `seed`.
fn index_scores_case(
    run: Runner,
    (heads, d, seed): (usize, usize, u64),
    launch: fn(usize, (usize, usize), usize, f32) -> LayerLaunch,
    cpu: RowScores<'_>,
    what: &str,
) {
    let first = 300;
    let keys = uniform((first + 40) * d, seed, 1.0);
    // (first key in the packed buffer, keys scored)
    let rows = [(0, 300), (0, 17), (first, 40), (0, 256), (0, 257)];
    let mut q = uniform(rows.len() * heads * d, seed + 1, 1.0);
    q[..d].fill(0.0);
    let w = uniform(rows.len() * heads, seed + 2, 1.0);
    let stride = 300;
    let mut want = vec![0.0; rows.len() * stride];
    for (r, &(at, len)) in rows.iter().enumerate() {
        let (qr, wr) = (&q[r * heads * d..][..heads * d], &w[r * heads..][..heads]);
        want[r * stride..][..len].copy_from_slice(&cpu(qr, wr, &keys[at * d..(at + len) * d]));
    }
    let info: Vec<u8> = rows
        .iter()
        .flat_map(|&(at, len)| [at as i32, len as i32])
        .flat_map(i32::to_le_bytes)
        .collect();
    let bufs = [
        bytes_of(&q),
        bytes_of(&w),
        bytes_of(&keys),
        info,
        vec![0; 4 * want.len()],
    ];
    let out = run_on(
        run,
        &launch(rows.len(), (heads, d), stride, (d as f32).powf(-0.5)),
        &bufs,
    );
    assert_same(&want, &floats(&out[4]), what);
}

/// DeepSeek Sparse Attention's index scores (`deltafin_dsa_scores`) against
/// `dsa::index_scores_reference` ([`index_scores_case`]).
pub fn dsa_scores(run: Runner) {
    use deltafin_engine::model::layers::dsa::index_scores_reference;
    let d = 19;
    let cpu = |q: &[f32], w: &[f32], keys: &[f32]| index_scores_reference(q, w, keys, d);
    index_scores_case(run, (5, d, 81), abi::dsa_scores, &cpu, "dsa index scores");
}

/// DeepSeek-V4's indexer scores (`deltafin_dsa_scores` in V4's order) against
/// `compressed::index_scores` ([`index_scores_case`]), head dimensions below and past 16 lanes
/// (not multiples of 16).
pub fn v4_index_scores(run: Runner) {
    use deltafin_engine::model::layers::compressed::index_scores;
    for (heads, d) in [(3, 19), (2, 40)] {
        let cpu = |q: &[f32], w: &[f32], keys: &[f32]| {
            index_scores((q, w), |s| &keys[s * d..][..d], keys.len() / d, d)
        };
        let what = format!("v4 index scores, {heads} heads of {d}");
        index_scores_case(run, (heads, d, 84), abi::v4_index_scores, &cpu, &what);
    }
}

/// DeepSeek Sparse Attention's top-k (`deltafin_dsa_topk`) against `dsa::top_positions`: scores
/// with many ties at the boundary (a few distinct values), +0 and -0, infinities and a NaN, rows
/// shorter than, equal to and far longer than k (past the 256 threads' shares), and k over a
/// row's one-thread share.
pub fn dsa_topk(run: Runner) {
    use deltafin_engine::model::layers::dsa::top_positions;
    let stride = 3000;
    let mut rng = Rng(91);
    let mut scores: Vec<f32> = (0..6 * stride)
        .map(|_| ((rng.unit() * 4.0).round() - 1.0) * 0.5)
        .collect();
    let row = |r: usize| r * stride;
    scores[row(1) + 3] = f32::INFINITY;
    scores[row(1) + 9] = -0.0;
    scores[row(1) + 11] = f32::NEG_INFINITY;
    scores[row(1) + 40] = f32::NAN;
    scores[row(2)..row(2) + 20].fill(0.0);
    scores[row(2) + 7] = -0.0;
    // (keys scored, k)
    for k in [1usize, 10, 37, 300] {
        let rows = [
            (3000, k),
            (2999, k),
            (20, k),
            (k, k),
            (k.saturating_sub(1), k),
            (1000, k),
        ];
        let info: Vec<u8> = rows
            .iter()
            .flat_map(|&(len, _)| [0i32, len as i32])
            .flat_map(i32::to_le_bytes)
            .collect();
        let bufs = [bytes_of(&scores), info, vec![0; 4 * rows.len() * k]];
        let out = run_on(run, &abi::dsa_topk(rows.len(), stride, k), &bufs);
        let got: Vec<i32> = out[2]
            .chunks(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        for (r, &(len, _)) in rows.iter().enumerate() {
            let want = top_positions(&scores[row(r)..][..len], k);
            let row_got: Vec<u32> = got[r * k..][..k]
                .iter()
                .take_while(|&&v| v >= 0)
                .map(|&v| v as u32)
                .collect();
            assert_eq!(row_got, want, "dsa top-{k} of row {r} ({len} scores)");
        }
    }
}

/// The KDA kernels against `kda`'s row functions, chained as a pass runs them: convolution +
/// SiLU over two interleaved sequences (histories advanced), the q/k L2 norms (both formulas),
/// log-decay (both kinds) and β, the delta rule with read-out (states advanced), and the gated
/// norm (`deltafin_rms_norm` with a gate).
pub fn kda(run: Runner) {
    use deltafin_engine::config::KdaDecay;
    use deltafin_engine::generate::KdaShape;
    use deltafin_engine::model::layers::kda::{self, L2Norm, StepInputs};
    let s = KdaShape {
        heads: 3,
        head_dim: 20,
        kernel: 4,
    };
    let (p, hd, heads) = (s.channels(), s.head_dim, s.heads);
    let width = 3 * p;
    let mild = uniform;
    let seq_of = [0usize, 1, 0, 0, 1];
    let n = seq_of.len();
    let order: Vec<usize> = (0..2)
        .flat_map(|q| (0..n).filter(move |&r| seq_of[r] == q))
        .collect();
    let offsets = [0i32, 3, 5];
    let ints = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let row_ids = ints(&order.iter().map(|&r| r as i32).collect::<Vec<_>>());

    // Convolution + SiLU.
    let raw = mild(n * width, 80, 2.0);
    let conv = mild(width * s.kernel, 81, 1.0);
    let hist = mild(2 * s.conv_len(), 82, 2.0);
    let (mut cpu_hist, mut cpu_qkv) = (hist.clone(), vec![0.0f32; n * width]);
    for &r in &order {
        let h = &mut cpu_hist[seq_of[r] * s.conv_len()..][..s.conv_len()];
        let (q, rest) = cpu_qkv[r * width..(r + 1) * width].split_at_mut(p);
        let (k, v) = rest.split_at_mut(p);
        kda::convolve(&conv, s, h, &raw[r * width..(r + 1) * width], [q, k, v]);
        kda::conv_push(h, &raw[r * width..(r + 1) * width], s);
    }
    let bufs = [
        bytes_of(&raw),
        bytes_of(&conv),
        bytes_of(&hist),
        ints(&offsets),
        row_ids.clone(),
        vec![0; 4 * n * width],
    ];
    let out = run_on(run, &abi::kda_conv(2, width, s.kernel), &bufs);
    assert_same(&cpu_qkv, &floats(&out[5]), "kda conv");
    assert_same(&cpu_hist, &floats(&out[2]), "kda conv history");

    // L2 norms, both formulas.
    let q_scale = 0.2236;
    let mut normed = Vec::new();
    for l2 in [L2Norm::EpsInside(1e-6), L2Norm::EpsFloor(1e-12)] {
        let mut want = cpu_qkv.clone();
        for row in want.chunks_mut(width) {
            for h in 0..heads {
                let q = &mut row[h * hd..(h + 1) * hd];
                l2.apply(q);
                q.iter_mut().for_each(|x| *x *= q_scale);
                l2.apply(&mut row[p + h * hd..p + (h + 1) * hd]);
            }
        }
        let out = run_on(
            run,
            &abi::kda_l2(n, heads, hd, l2, q_scale),
            &[bytes_of(&cpu_qkv)],
        );
        assert_same(&want, &floats(&out[0]), &format!("kda {l2:?}"));
        normed = want;
    }

    // Log-decay and β, both kinds.
    let f = mild(n * p, 83, 4.0);
    let dt_bias = mild(p, 84, 1.0);
    let rate = mild(p, 85, 1.0)
        .iter()
        .map(|r| r.abs() + 0.05)
        .collect::<Vec<_>>();
    let logits = mild(n * heads, 86, 3.0);
    let mut g = Vec::new();
    let beta: Vec<f32> = logits
        .iter()
        .map(|&l| deltafin_engine::kernels::math::sigmoid(l))
        .collect();
    for decay in [KdaDecay::LowerBound(-5.0), KdaDecay::Softplus] {
        let want: Vec<f32> = (0..n * p)
            .map(|e| kda::log_decay(decay, rate[e % p], f[e] + dt_bias[e % p]))
            .collect();
        let bufs = [
            bytes_of(&f),
            bytes_of(&dt_bias),
            bytes_of(&rate),
            bytes_of(&logits),
            vec![0; 4 * n * p],
            vec![0; 4 * n * heads],
        ];
        let out = run_on(run, &abi::kda_gates(n, (p, 1), heads, decay), &bufs);
        assert_same(&want, &floats(&out[4]), &format!("kda log-decay {decay:?}"));
        assert_same(&beta, &floats(&out[5]), "kda beta");
        g = want;
    }

    // The delta rule and read-out.
    let states = mild(2 * heads * hd * hd, 87, 0.3);
    let (mut cpu_states, mut cpu_o) = (states.clone(), vec![0.0f32; n * p]);
    for &r in &order {
        let st = &mut cpu_states[seq_of[r] * heads * hd * hd..][..heads * hd * hd];
        let row = &normed[r * width..(r + 1) * width];
        let x = StepInputs {
            k: &row[p..2 * p],
            v: &row[2 * p..],
            g: &g[r * p..(r + 1) * p],
            beta: &beta[r * heads..(r + 1) * heads],
        };
        kda::delta_rule_step(st, x, s);
        kda::readout(st, &row[..p], s, &mut cpu_o[r * p..(r + 1) * p]);
    }
    let bufs = [
        bytes_of(&states),
        bytes_of(&normed),
        bytes_of(&g),
        bytes_of(&beta),
        ints(&offsets),
        row_ids,
        vec![0; 4 * n * p],
    ];
    let out = run_on(run, &abi::kda_recurrence(2, heads, hd).unwrap(), &bufs);
    assert_same(&cpu_o, &floats(&out[6]), "kda read-out");
    assert_same(&cpu_states, &floats(&out[0]), "kda states");

    // The gated norm.
    let gate = mild(n * p, 88, 3.0);
    let o_norm = mild(hd, 89, 1.5);
    let mut want = cpu_o.clone();
    for (o, gt) in want.chunks_mut(p).zip(gate.chunks(p)) {
        kda::gated_norm(o, gt, &o_norm, 1e-5, kda::GateActivation::Sigmoid);
    }
    let bufs = [
        bytes_of(&cpu_o),
        bytes_of(&o_norm),
        vec![0; 4 * n * p],
        bytes_of(&gate),
    ];
    let out = run_on(run, &abi::rms_norm(n * heads, hd, 1e-5), &bufs);
    assert_same(&want, &floats(&out[2]), "kda gated norm");
}

/// The MLA projections around the attention core: RoPE by host factors (`deltafin_rope`,
/// interleaved queries at a stride and a split-half key) against `Rope::apply`, the absorbed
/// queries (`deltafin_mla_absorb`) against `mla::absorb_query`, the values
/// (`deltafin_mla_values`) against `mla::value_rows`, and K3's output gate
/// (`deltafin_mul_sigmoid`).
pub fn mla_projections(run: Runner) {
    use deltafin_engine::backend::abi::RopeLayout;
    use deltafin_engine::config::RopeConfig;
    use deltafin_engine::model::layers::mla::{MlaDims, absorb_query, value_rows};
    use deltafin_engine::model::layers::rope::Rope;
    let d = MlaDims {
        heads: 3,
        nope: 7,
        rope: 6,
        v: 5,
        kv_lora: 19,
        eps: 1e-6,
        scale: 0.3,
    };
    let (n, qk, c) = (4, d.nope + d.rope, d.kv_lora);
    let mild = |len, seed| uniform(len, seed, 2.0);
    let pos = [0usize, 5, 1000, 70_000];

    for interleave in [true, false] {
        let rope = Rope::new(&RopeConfig::default(), d.rope, interleave);
        let mut factors = vec![0.0f32; n * d.rope];
        for (f, &p) in factors.chunks_mut(d.rope).zip(&pos) {
            rope.factors_into(p, f);
        }
        // Queries: every head's rope part, at offset nope and stride qk.
        let q = mild(n * d.heads * qk, 30);
        let mut want = q.clone();
        for (i, row) in want.chunks_mut(d.heads * qk).enumerate() {
            for h in 0..d.heads {
                rope.apply(&mut row[h * qk + d.nope..][..d.rope], pos[i]);
            }
        }
        let at = RopeLayout {
            vecs: d.heads,
            row_stride: d.heads * qk,
            offset: d.nope,
            vec_stride: qk,
        };
        let l = abi::rope(n, at, d.rope, interleave).unwrap();
        let out = run_on(run, &l, &[bytes_of(&q), bytes_of(&factors)]);
        assert_same(&want, &floats(&out[0]), &format!("rope interleave={interleave}"));
    }

    let q = mild(n * d.heads * qk, 31);
    let wkv = mild(d.heads * (d.nope + d.v) * c, 32);
    let (mut q_abs, mut q_rope) = (vec![0.0f32; n * d.heads * c], vec![0.0f32; n * d.heads * d.rope]);
    for i in 0..n {
        for h in 0..d.heads {
            let qh = &q[(i * d.heads + h) * qk..][..qk];
            let w_uk = &wkv[h * (d.nope + d.v) * c..][..d.nope * c];
            absorb_query(&qh[..d.nope], w_uk, &mut q_abs[(i * d.heads + h) * c..][..c]);
            q_rope[(i * d.heads + h) * d.rope..][..d.rope].copy_from_slice(&qh[d.nope..]);
        }
    }
    let bufs = [
        bytes_of(&q),
        bytes_of(&wkv),
        vec![0; 4 * q_abs.len()],
        vec![0; 4 * q_rope.len()],
    ];
    let out = run_on(run, &abi::mla_absorb(n, &d), &bufs);
    assert_same(&q_abs, &floats(&out[2]), "mla absorbed queries");
    assert_same(&q_rope, &floats(&out[3]), "mla rope queries");

    let ctx = mild(n * d.heads * c, 33);
    let mut want = vec![0.0f32; n * d.heads * d.v];
    for (o, cx) in want.chunks_mut(d.heads * d.v).zip(ctx.chunks(d.heads * c)) {
        value_rows(&wkv, cx, &d, o);
    }
    let bufs = [bytes_of(&wkv), bytes_of(&ctx), vec![0; 4 * want.len()]];
    let out = run_on(run, &abi::mla_values(n, &d), &bufs);
    assert_same(&want, &floats(&out[2]), "mla values");

    let (a, g) = (mild(500, 34), mild(500, 35));
    let want: Vec<f32> = a
        .iter()
        .zip(&g)
        .map(|(a, g)| a * deltafin_engine::kernels::math::sigmoid(*g))
        .collect();
    let out = run_on(
        run,
        &abi::mul_sigmoid(500),
        &[bytes_of(&a), bytes_of(&g), vec![0; 2000]],
    );
    assert_same(&want, &floats(&out[2]), "output gate");
}

/// K3's Block Attention Residual mix (`deltafin_attn_res`) against `AttnRes::mix`: one value
/// (the partial sum alone) and five (four anchors and the partial sum), a width off the lanes.
pub fn attn_res(run: Runner) {
    use deltafin_engine::model::layers::attn_res::AttnRes;
    let (rows, width) = (5, 53);
    let res = AttnRes::new(&uniform(width, 70, 1.5), &uniform(width, 71, 1.0), 1e-6);
    for count in [1, 5] {
        let values = uniform(count * rows * width, 72 + count as u64, 3.0);
        let at = |i: usize, r: usize| &values[(i * rows + r) * width..][..width];
        let mut want = vec![0.0f32; rows * width];
        for (r, o) in want.chunks_mut(width).enumerate() {
            let anchors: Vec<&[f32]> = (0..count - 1).map(|i| at(i, r)).collect();
            res.mix(&anchors, at(count - 1, r), o);
        }
        let bufs = [bytes_of(&values), bytes_of(&res.query), vec![0; 4 * rows * width]];
        let out = run_on(run, &abi::attn_res(rows, width, count, res.eps).unwrap(), &bufs);
        assert_same(&want, &floats(&out[2]), &format!("attn_res with {count} values"));
    }
}
