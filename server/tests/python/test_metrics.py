"""/metrics: valid Prometheus text (promtool check metrics) with the operator's names and
buckets, and counters that move exactly as known requests say."""

import shutil
import subprocess

import pytest

from conftest import Server

NAMES = [
    "deltafin_time_to_first_token_seconds", "deltafin_inter_token_latency_seconds",
    "deltafin_e2e_request_latency_seconds", "deltafin_prompt_tokens_total", "deltafin_generation_tokens_total",
    "deltafin_requests_total", "deltafin_requests_running", "deltafin_requests_waiting",
    "deltafin_expert_reads_total", "deltafin_expert_read_bytes_total", "deltafin_expert_cache_hit_ratio",
    "deltafin_model_load_seconds", "deltafin_build_info", "deltafin_state_reuse_total",
    "deltafin_device_weight_upload_bytes_total", "deltafin_device_weight_resident_bytes",
    "deltafin_device_cpu_fallbacks_total",
]


def test_promtool_accepts_the_exposition(server):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (scripts/test-server installs the prometheus package)")
    text = server.metrics()
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_names_and_buckets(server):
    text = server.metrics()
    for name in NAMES:
        assert f"# TYPE {name} " in text, name
    assert 'deltafin_time_to_first_token_seconds_bucket{le="10240"}' in text
    assert 'deltafin_inter_token_latency_seconds_bucket{le="120"}' in text
    assert 'deltafin_e2e_request_latency_seconds_bucket{le="86400"}' in text
    assert 'deltafin_expert_reads_total{source="network"}' in text
    assert server.metric("deltafin_model_load_seconds") > 0


def test_counters_move_with_known_requests():
    s = Server()
    try:
        c, m = s.client(), s.model_id()
        r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "count me"}], max_tokens=7,
                                      temperature=0, extra_body={"ignore_eos": True})
        assert s.metric("deltafin_requests_total", endpoint="chat_completions", outcome="success") == 1
        assert s.metric("deltafin_prompt_tokens_total", endpoint="chat_completions") == r.usage.prompt_tokens
        assert s.metric("deltafin_generation_tokens_total", endpoint="chat_completions") == 7
        assert s.metric("deltafin_time_to_first_token_seconds_count") == 1
        assert s.metric("deltafin_inter_token_latency_seconds_count") == 6
        assert s.metric("deltafin_e2e_request_latency_seconds_count") == 1
        assert s.metric("deltafin_engine_prefill_tokens_total") == r.usage.prompt_tokens
        # The DeepSeek test model loads out of core (auto budget): its expert store feeds these.
        reads = s.metric("deltafin_expert_reads_total", source="pinned") + s.metric(
            "deltafin_expert_reads_total", source="disk")
        assert reads > 0 and s.metric("deltafin_expert_read_bytes_total", source="disk") > 0
        r2 = c.completions.create(model=m, prompt="abc", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
        assert s.metric("deltafin_requests_total", endpoint="completions", outcome="success") == 1
        assert s.metric("deltafin_generation_tokens_total", endpoint="completions") == 3
        assert s.metric("deltafin_prompt_tokens_total", endpoint="completions") == r2.usage.prompt_tokens
        with pytest.raises(Exception):
            c.chat.completions.create(model=m, messages=[{"role": "user", "content": "x"}], n=9)
        assert s.metric("deltafin_requests_total", endpoint="chat_completions", outcome="invalid") == 1
        c.models.list()
        assert s.metric("deltafin_requests_total", endpoint="models", outcome="success") >= 1
        assert s.metric("deltafin_requests_running") == 0 and s.metric("deltafin_requests_waiting") == 0
    finally:
        s.stop()
