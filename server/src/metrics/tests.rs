//! The exposition: names, labels and values as the operator table and the docs name them.

use deltafin_engine::scheduler::ExpertSource;

use super::*;

fn metrics() -> Metrics {
    Metrics::new(BuildInfo {
        version: "0.1.0".into(),
        device: "cpu".into(),
        spine: "bf16".into(),
        exact: true,
    })
}

#[test]
fn buckets_follow_the_operator_table() {
    assert_eq!(TTFT_BUCKETS.len(), 16);
    assert_eq!(ITL_BUCKETS.len(), 20);
    assert_eq!((E2E_BUCKETS[0], *E2E_BUCKETS.last().unwrap()), (1.0, 86400.0));
    assert!(E2E_BUCKETS.windows(2).all(|w| w[1] > w[0]));
}

#[test]
fn a_dropped_timer_counts_as_cancelled_and_a_finished_one_as_success() {
    let m = Arc::new(metrics());
    {
        let mut t = RequestTimer::new(m.clone(), Endpoint::Chat, Instant::now());
        t.token();
        t.token();
    }
    {
        let mut t = RequestTimer::new(m.clone(), Endpoint::Completions, Instant::now());
        t.token();
        t.finish("success", 7);
    }
    let text = m.render(None, &ExpertIoStats::default());
    assert!(text.contains("deltafin_requests_total{endpoint=\"chat_completions\",outcome=\"cancelled\"} 1"));
    assert!(text.contains("deltafin_requests_total{endpoint=\"completions\",outcome=\"success\"} 1"));
    assert!(text.contains("deltafin_generation_tokens_total{endpoint=\"chat_completions\"} 2"));
    assert!(text.contains("deltafin_prompt_tokens_total{endpoint=\"completions\"} 7"));
    assert!(text.contains("deltafin_time_to_first_token_seconds_count 2"));
    assert!(text.contains("deltafin_inter_token_latency_seconds_count 1"));
    assert!(text.contains("deltafin_e2e_request_latency_seconds_count 1"));
    assert!(text.contains("deltafin_time_to_first_token_seconds_bucket{le=\"0.25\"} 2"));
    assert!(
        text.contains(
            "deltafin_build_info{version=\"0.1.0\",device=\"cpu\",spine=\"bf16\",exact=\"true\"} 1"
        )
    );
}

#[test]
fn expert_io_counters_are_exposed_by_source() {
    let io = ExpertIoStats::default();
    io.record(ExpertSource::Disk, 100);
    io.record(ExpertSource::PageCache, 50);
    let text = metrics().render(None, &io);
    assert!(text.contains("deltafin_expert_read_bytes_total{source=\"disk\"} 100"));
    assert!(text.contains("deltafin_expert_reads_total{source=\"page_cache\"} 1"));
    assert!(text.contains("deltafin_expert_cache_hit_ratio 0.5"));
}

#[test]
fn the_exposition_is_prometheus_text_with_one_help_per_family() {
    let text = metrics().render(None, &ExpertIoStats::default());
    assert!(!text.contains("# EOF"), "Prometheus 0.0.4 text, not OpenMetrics");
    assert!(!text.contains(".."), "the registry's period is not doubled");
    assert!(text.contains("# TYPE deltafin_requests_total counter"));
    assert!(text.contains("deltafin_model_load_seconds 0"));
    assert!(text.contains("deltafin_expert_cache_hit_ratio NaN"));
    assert!(text.contains("deltafin_engine_step_seconds_bucket{le=\"+Inf\"} 0"));
    let helps: Vec<&str> = text.lines().filter(|l| l.starts_with("# HELP ")).collect();
    let mut names: Vec<&str> = helps.iter().map(|l| l.split(' ').nth(2).unwrap()).collect();
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "a family is described twice");
}

#[test]
fn drafting_series_are_labelled_by_proposer() {
    let mut s = SpecSummary::default();
    let p = deltafin_engine::spec::ProposerStats {
        proposals: 3,
        accepted_tokens: 4,
        accepted_lengths: vec![1, 1, 1],
        ..Default::default()
    };
    s.proposers.insert("ngram", p);
    let text = render_spec(&s);
    assert!(text.contains("deltafin_spec_decode_drafts_total{draft=\"ngram\"} 3"));
    assert!(text.contains("deltafin_spec_decode_drafts_total{draft=\"qwen\"} 0"));
    assert!(text.contains("deltafin_spec_decode_accepted_length_bucket{draft=\"ngram\",le=\"1\"} 2"));
    assert!(text.contains("deltafin_spec_decode_accepted_length_count{draft=\"ngram\"} 3"));
    assert!(text.contains("deltafin_spec_decode_seconds_total{draft=\"dspark\",phase=\"verify\"} 0"));
}
