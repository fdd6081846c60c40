"""Authentication, the bounded queue (429), cancellation on disconnect, SSE keep-alive and
graceful shutdown, each on its own server."""

import signal
import threading
import time

import httpx
import openai
import pytest

from conftest import Server


def wait_for(pred, timeout=30, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_api_key_is_required_on_v1_but_not_on_probes(tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    s = Server("--api-key-file", str(key))
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            s.client(api_key="wrong").models.list()
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        r = httpx.post(s.base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert s.get("/v1/models")[0] == 401
        assert len(s.client(api_key="s3cret-key").models.list().data) == 1
        assert s.get("/livez")[0] == 200 and s.get("/readyz")[0] == 200 and s.get("/metrics")[0] == 200
        assert s.metric("deltafin_requests_total", endpoint="chat_completions", outcome="invalid") == 1
    finally:
        s.stop()


def long_stream(client, model, max_tokens=100000):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "go"}],
                                          max_tokens=max_tokens, stream=True, temperature=0,
                                          extra_body={"ignore_eos": True})


def test_a_full_queue_answers_429_with_retry_after_and_stays_ready():
    s = Server("--max-batch", "1", "--max-queue", "1", "--step-delay-ms", "20", "--max-tokens", "100000",
               "--context-limit", "1024")
    try:
        c, m = s.client(), s.model_id()
        running = long_stream(c, m)
        next(iter(running))
        queued_result = {}

        def queued():
            try:
                queued_result["r"] = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "q"}],
                                                               max_tokens=2, temperature=0)
            except Exception as e:  # noqa: BLE001
                queued_result["e"] = e

        t = threading.Thread(target=queued)
        t.start()
        wait_for(lambda: s.metric("deltafin_requests_waiting") == 1, what="a queued request")
        with pytest.raises(openai.RateLimitError) as e:
            c.chat.completions.create(model=m, messages=[{"role": "user", "content": "x"}], max_tokens=2)
        assert e.value.status_code == 429
        assert e.value.response.headers["retry-after"] == "1"
        assert e.value.body["code"] == "server_busy"
        assert s.get("/readyz")[0] == 200, "busy is not unready"
        assert s.metric("deltafin_requests_total", endpoint="chat_completions", outcome="busy") == 1
        running.close()
        t.join(60)
        assert "r" in queued_result, queued_result
    finally:
        s.stop()


def test_a_disconnect_cancels_the_generation():
    s = Server("--step-delay-ms", "10", "--max-tokens", "100000", "--context-limit", "1024")
    try:
        c, m = s.client(), s.model_id()
        stream = long_stream(c, m)
        it = iter(stream)
        for _ in range(4):
            next(it)
        stream.close()
        wait_for(lambda: s.metric("deltafin_engine_cancelled_total") == 1, what="the engine to cancel")
        assert s.metric("deltafin_requests_running") == 0
        wait_for(lambda: s.metric("deltafin_requests_total", endpoint="chat_completions", outcome="cancelled") == 1,
                 what="the cancelled outcome")
        generated = s.metric("deltafin_generation_tokens_total", endpoint="chat_completions")
        time.sleep(0.3)
        assert s.metric("deltafin_generation_tokens_total", endpoint="chat_completions") == generated
        assert generated < 200, "work stopped soon after the disconnect"
        # Non-streamed requests are cancelled too when the client goes away.
        with pytest.raises(openai.APITimeoutError):
            s.client(timeout=0.5).chat.completions.create(
                model=m, messages=[{"role": "user", "content": "slow"}], max_tokens=100000, temperature=0,
                extra_body={"ignore_eos": True})
        wait_for(lambda: s.metric("deltafin_engine_cancelled_total") == 2, what="the second cancellation")
    finally:
        s.stop()


def test_sse_keep_alive_comments_while_the_first_token_is_slow():
    s = Server("--step-delay-ms", "400", "--sse-keep-alive", "0.05")
    try:
        body = {"model": s.model_id(), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "stream": True, "temperature": 0}
        with httpx.stream("POST", s.base + "/v1/chat/completions", json=body, timeout=30) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines() if line]
        data = [i for i, line in enumerate(lines) if line.startswith("data:")]
        # The role chunk goes out at once; the first token takes a slow pass: keep-alives between.
        between = lines[data[0] + 1:data[1]]
        assert between and all(line.startswith(":") and "keep-alive" in line for line in between), lines[:6]
        assert lines[-1] == "data: [DONE]"
    finally:
        s.stop()


def test_sigterm_drains_in_flight_requests_then_exits():
    s = Server("--step-delay-ms", "30", "--shutdown-timeout", "20")
    c, m = s.client(), s.model_id()
    stream = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "x"}], max_tokens=30,
                                       stream=True, temperature=0, extra_body={"ignore_eos": True})
    it = iter(stream)
    next(it)
    s.proc.send_signal(signal.SIGTERM)
    rest = list(it)
    assert rest[-1].choices[0].finish_reason == "length", "the in-flight request finished"
    assert s.proc.wait(timeout=30) == 0


def test_sigterm_past_the_deadline_cancels_what_is_left():
    s = Server("--step-delay-ms", "30", "--shutdown-timeout", "0.5", "--max-tokens", "100000")
    c, m = s.client(), s.model_id()
    stream = long_stream(c, m, max_tokens=900)
    it = iter(stream)
    next(it)
    started = time.time()
    s.proc.send_signal(signal.SIGTERM)
    with pytest.raises(openai.APIError):
        list(it)
    assert s.proc.wait(timeout=30) == 0
    assert time.time() - started < 10
