//! DeepSeek-V4's window and entry attention (`deltafin_v4_attend`) against
//! `compressed::attend_head`, bit for bit: rows over two sequences' windows packed in one
//! buffer and chosen entries from a shared pool (none, a few, past a lane group), head
//! dimensions below and past 16 lanes (not multiples of 16), sinks of both signs.

use deltafin_engine::backend::abi;
use deltafin_engine::model::layers::compressed::attend_head;

use super::{Runner, run_on, uniform};
use crate::kernel_support::{assert_same, bytes_of, floats};

fn ints(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn v4_attention(run: Runner) {
    for (heads, hd) in [(3, 40), (2, 16)] {
        let window = uniform(60 * hd, 120, 1.0);
        let entries = uniform(50 * hd, 121, 1.0);
        // (first window row, window keys, chosen entries)
        let rows: [(usize, usize, Vec<i32>); 5] = [
            (0, 1, vec![]),
            (3, 8, vec![0, 4, 9]),
            (20, 17, (0..35).collect()),
            (40, 16, vec![49]),
            (12, 5, (10..26).collect()),
        ];
        let n = rows.len();
        let q = uniform(n * heads * hd, 122, 1.0);
        let sinks: Vec<f32> = (0..heads).map(|h| [0.7, -1.3, 0.1][h % 3]).collect();
        let scale = (hd as f32).powf(-0.5);
        let (mut info, mut chosen) = (Vec::new(), Vec::new());
        let mut want = vec![0.0f32; n * heads * hd];
        for (r, (first, count, sel)) in rows.iter().enumerate() {
            info.extend([
                *first as i32,
                *count as i32,
                chosen.len() as i32,
                sel.len() as i32,
            ]);
            chosen.extend(sel);
            let keys: Vec<&[f32]> = (0..*count)
                .map(|j| &window[(first + j) * hd..][..hd])
                .chain(sel.iter().map(|&e| &entries[e as usize * hd..][..hd]))
                .collect();
            let mut logits = vec![0.0f32; keys.len()];
            for (h, &sink) in sinks.iter().enumerate() {
                let at = (r * heads + h) * hd;
                let out = &mut want[at..at + hd];
                attend_head(&q[at..at + hd], &keys, (sink, scale), &mut logits, out);
            }
        }
        let bufs = [
            bytes_of(&q),
            bytes_of(&window),
            bytes_of(&entries),
            ints(&info),
            ints(&chosen),
            bytes_of(&sinks),
            vec![0; 4 * want.len()],
        ];
        let out = run_on(run, &abi::v4_attend(n, heads, hd, scale).unwrap(), &bufs);
        assert_same(
            &want,
            &floats(&out[6]),
            &format!("v4 attention, {heads} heads of {hd}"),
        );
    }
    assert!(abi::v4_attend(1, 1, abi::V4_MAX_HEAD_DIM + 1, 1.0).is_err());
}
