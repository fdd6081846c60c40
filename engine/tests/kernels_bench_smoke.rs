//! `backend::bench::run` end to end. The default test runs tiny shapes and checks the report's
//! structure only (no timed assertion). The ignored test runs the real benchmark (7168x2048 and
//! 2048x7168, 512 MiB probe, 2 threads) and prints it:
//! `cargo test --release -p deltafin-engine --test kernels_bench_smoke -- --ignored --nocapture`.

use std::time::Duration;

use deltafin_engine::backend::bench::{self, BenchFormat, BenchOptions};

#[test]
fn bench_report_covers_every_format_and_batch_size() {
    let opts = BenchOptions {
        threads: 2,
        min_time: Duration::from_millis(5),
        min_iters: 2,
        probe_bytes: 64 << 20,
        working_set_bytes: 1 << 20,
        shapes: vec![(64, 256)],
        ..BenchOptions::default()
    };
    let report = bench::run(&opts);
    assert_eq!(report.threads, 2);
    assert!(report.probe.gb_per_s > 0.0 && report.probe.bytes >= 64 << 20);
    assert_eq!(report.kernels.len(), BenchFormat::ALL.len());
    for k in &report.kernels {
        assert!(k.gb_per_s > 0.0 && k.matrices >= 2, "{k:?}");
        let ns: Vec<usize> = k.batch.iter().map(|b| b.n).collect();
        assert_eq!(ns, [2, 4, 8]);
        assert!(k.batch.iter().all(|b| b.ratio_vs_n1 > 0.0));
    }
    let text = report.to_string();
    assert!(text.contains("mxfp4") && text.contains("GB/s"), "{text}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["kernels"][1]["format"], "bf16");
    assert_eq!(BenchFormat::parse("FP8"), Some(BenchFormat::Fp8));
    eprintln!("{report}");
}

#[test]
#[ignore = "a real measurement: run in release with --ignored --nocapture"]
fn full_kernel_bench() {
    let opts = BenchOptions {
        threads: 2,
        ..BenchOptions::default()
    };
    let report = bench::run(&opts);
    println!("{report}");
    println!("{}", serde_json::to_string(&report).unwrap());
}
