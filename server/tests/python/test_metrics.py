"""/metrics: valid Prometheus text (promtool check metrics) with the operator's names and
buckets, and counters that move exactly as known requests say."""

import re
import shutil
import subprocess
import threading
import time

import pytest

from conftest import Server

NAMES = [
    "deltafin_time_to_first_token_seconds", "deltafin_inter_token_latency_seconds",
    "deltafin_e2e_request_latency_seconds", "deltafin_prompt_tokens_total", "deltafin_generation_tokens_total",
    "deltafin_requests_total", "deltafin_requests_running", "deltafin_requests_waiting",
    "deltafin_expert_reads_total", "deltafin_expert_read_bytes_total", "deltafin_expert_cache_hit_ratio",
    "deltafin_model_load_seconds", "deltafin_build_info", "deltafin_state_reuse_total",
    "deltafin_device_weight_upload_bytes_total", "deltafin_device_weight_resident_bytes",
    "deltafin_device_cpu_fallbacks_total", "deltafin_device_expert_resident_bytes",
    "deltafin_device_expert_lookups_total",
]


def test_promtool_accepts_the_exposition(server):
    promtool = shutil.which("promtool")
    # Required, never skipped: scripts/install-test-deps installs Debian's `prometheus` package.
    assert promtool, "promtool is required (scripts/install-test-deps installs the prometheus package)"
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


def documented_series():
    """Every metric name in the table of docs/server.md's "Metrics" section."""
    import pathlib

    doc = (pathlib.Path(__file__).resolve().parents[3] / "docs" / "server.md").read_text()
    section = doc.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    names = []
    for line in section.splitlines():
        if line.startswith("| `deltafin_"):
            names += re.findall(r"`(deltafin_[a-z_]+)`", line.split("|")[1])
    return names


def sample_sum(text, name):
    """Sum of a series' samples (a histogram: its _count)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key = line.split("{", 1)[0].split(" ", 1)[0]
        if key in (name, name + "_count"):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    assert seen, f"{name} is documented but not exposed"
    return total


# Series that cannot move on a CPU machine: they exist and stay zero (docs: "GPU only").
GPU_ONLY = {
    "deltafin_device_weight_upload_bytes_total", "deltafin_device_weight_evictions_total",
    "deltafin_device_weight_resident_bytes", "deltafin_device_cpu_fallbacks_total",
    "deltafin_device_expert_resident_bytes", "deltafin_device_expert_lookups_total",
}
# Series whose non-zero value is checked by a request below, but which do not count up
# (gauges that return to their idle value, info): checked for their expected value instead.
STATIC = {"deltafin_model_load_seconds", "deltafin_build_info", "deltafin_expert_cache_hit_ratio",
          "deltafin_requests_running", "deltafin_requests_waiting"}
# Series that move only when something breaks: zero after a healthy run. Their movement is
# asserted by the fault tests (server/tests/smoke.rs: a shard truncated under the server;
# engine/src/scheduler/fault_tests.rs: a panic in each engine phase).
FAULT_ONLY = {"deltafin_weight_read_errors_total", "deltafin_engine_panics_total"}


def test_every_documented_series_moves_after_the_request_that_should_move_it():
    """Each series in docs/server.md moves after a request that should move it; the
    `page_cache` source with buffered reads of cached files, the `network` source and the
    stream-install fetch times in server/tests/stream_cli.rs."""
    names = documented_series()
    assert len(names) > 25, names
    s = Server("--max-tokens", "256")
    try:
        before = s.metrics()
        c, m = s.client(), s.model_id()
        # Plain chat (latency histograms, tokens, steps, queue wait, prefill chunks, expert reads
        # and fetches), then the same conversation extended (state reuse).
        msgs = [{"role": "user", "content": "metrics " * 40}]
        r = c.chat.completions.create(model=m, messages=msgs, max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "more"}]
        c.chat.completions.create(model=m, messages=msgs, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
        # A forced tool call under a grammar (tool calls, constrained tokens and mask time).
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
        c.chat.completions.create(model=m, messages=[{"role": "user", "content": "weather?"}], tools=[tool],
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=64)
        # A stream dropped after its first chunk (engine cancellation); the running gauge while it runs.
        # The gauge is polled from a thread for the life of the stream: a single sample after the
        # first chunk can miss it, since a tiny model may finish before the scrape is served.
        running, streaming = set(), threading.Event()
        streaming.set()

        def poll():
            while streaming.is_set():
                running.add(s.metric("deltafin_requests_running"))
                time.sleep(0.002)
        poller = threading.Thread(target=poll)
        poller.start()
        stream = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "long"}], max_tokens=250,
                                           stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        next(chunks)
        for _ in range(20):
            next(chunks)
        streaming.clear()
        poller.join()
        stream.close()
        deadline = time.time() + 30
        while s.metric("deltafin_engine_cancelled_total") < 1 and time.time() < deadline:
            time.sleep(0.05)
        after = s.metrics()
    finally:
        s.stop()
    # Buffered reads of files the page cache holds (they were just read by the server above).
    b = Server("--max-tokens", "64", "--read-mode", "buffered")
    try:
        b.client().completions.create(model=b.model_id(), prompt="page cache", max_tokens=4, temperature=0,
                                      extra_body={"ignore_eos": True})
        page_cache = b.metric("deltafin_expert_reads_total", source="page_cache")
        page_cache_bytes = b.metric("deltafin_expert_read_bytes_total", source="page_cache")
    finally:
        b.stop()

    assert page_cache > 0 and page_cache_bytes > 0, "buffered reads of cached files count as page_cache"
    moved, missing = [], []
    for name in names:
        if name in GPU_ONLY:
            assert sample_sum(after, name) == 0, name
            continue
        if name in STATIC:
            continue
        if name in FAULT_ONLY:
            assert sample_sum(after, name) == 0, name
            continue
        (moved if sample_sum(after, name) > sample_sum(before, name) else missing).append(name)
    assert not missing, f"documented series that did not move: {missing}"
    assert running <= {0.0, 1.0} and 1.0 in running, running
    assert sample_sum(after, "deltafin_model_load_seconds") > 0
    assert 0 <= float(re.search(r"^deltafin_expert_cache_hit_ratio (\S+)$", after, re.M).group(1)) <= 1
    assert 'deltafin_build_info{version="' in after
