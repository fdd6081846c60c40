//! DeepSeek-V4's hyper-connection kernels (`deltafin_hyper_mixes`, `_weights`, `_expand`)
//! against `layers::hyper`'s CPU functions, bit for bit: a site's weights and collapse, the
//! expand, and the head's collapse, for 4 streams (V4's `hc_mult`) and an odd 3 over a width
//! that is no multiple of 16.

use deltafin_engine::backend::abi;
use deltafin_engine::model::layers::hyper::{self, HyperHead, HyperSite};

use super::{Runner, run_on, uniform};
use crate::kernel_support::{assert_same, bytes_of, floats};

fn site(s: usize, h: usize, seed: u64) -> HyperSite {
    let m = (2 + s) * s;
    HyperSite {
        proj: uniform(m * s * h, seed, 0.3),
        base: uniform(m, seed + 1, 1.0),
        scale: [0.9, 1.2, 1.4],
        streams: s,
        iters: 20,
        hc_eps: 1e-6,
        norm_eps: 1e-6,
    }
}

/// The mixes of `rows` rows through `proj` (`m` rows), on the runner.
fn mixes(
    run: Runner,
    streams: &[f32],
    proj: &[f32],
    (rows, width, m): (usize, usize, usize),
    eps: f32,
) -> Vec<u8> {
    let bufs = [bytes_of(streams), bytes_of(proj), vec![0; 4 * rows * m]];
    let out = run_on(run, &abi::hyper_mixes(rows, width, m, eps), &bufs);
    out[2].clone()
}

pub fn hyper_connections(run: Runner) {
    for (s, h, rows) in [(4, 37, 5), (3, 16, 2)] {
        let (site, m) = (site(s, h, 90 + s as u64), (2 + s) * s);
        let streams = uniform(rows * s * h, 95, 2.0);
        // The site: weights and collapse.
        let (want_w, want_u) = hyper::site_rows(&site, &streams, (rows, h));
        let mx = mixes(run, &streams, &site.proj, (rows, s * h, m), site.norm_eps);
        let consts = [&site.base[..], &site.scale[..]].concat();
        let l = abi::hyper_weights(rows, (s, h), (site.iters, false), site.hc_eps).unwrap();
        let bufs = [
            mx,
            bytes_of(&consts),
            bytes_of(&streams),
            vec![0; 4 * rows * m],
            vec![0; 4 * rows * h],
        ];
        let out = run_on(run, &l, &bufs);
        assert_same(
            &want_w,
            &floats(&out[3]),
            &format!("hyper site weights, {s} streams"),
        );
        assert_same(
            &want_u,
            &floats(&out[4]),
            &format!("hyper site collapse, {s} streams"),
        );
        // The expand of a sub-layer's output.
        let y = uniform(rows * h, 96, 1.0);
        let mut want = streams.clone();
        hyper::expand_rows(&want_w, &y, &mut want, (s, h));
        let l = abi::hyper_expand(rows, s, h).unwrap();
        let bufs = [
            bytes_of(&want_w),
            bytes_of(&y),
            bytes_of(&streams),
            vec![0; 4 * rows * s * h],
        ];
        let out = run_on(run, &l, &bufs);
        assert_same(&want, &floats(&out[3]), &format!("hyper expand, {s} streams"));
        // The head.
        let head = HyperHead {
            proj: uniform(s * s * h, 97, 0.3),
            base: uniform(s, 98, 1.0),
            scale: 0.7,
            hc_eps: 1e-6,
            norm_eps: 1e-6,
        };
        let mx = mixes(run, &streams, &head.proj, (rows, s * h, s), head.norm_eps);
        let consts = [&head.base[..], &[head.scale]].concat();
        let l = abi::hyper_weights(rows, (s, h), (0, true), head.hc_eps).unwrap();
        // (The head's weights need no buffer; the device path passes none. A GPU buffer of
        // zero bytes is one byte, so the case gives it room.)
        let bufs = [
            mx,
            bytes_of(&consts),
            bytes_of(&streams),
            vec![0; 4 * rows * s],
            vec![0; 4 * rows * h],
        ];
        let out = run_on(run, &l, &bufs);
        assert_same(
            &head.rows(&streams, (rows, h)),
            &floats(&out[4]),
            &format!("hyper head, {s} streams"),
        );
    }
    assert!(abi::hyper_expand(1, abi::HYPER_MAX_STREAMS + 1, 8).is_err());
}
