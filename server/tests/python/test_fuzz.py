"""A few thousand malformed or hostile requests (random JSON, wrong types, huge numbers,
invalid UTF-8, deep nesting, odd methods and paths): every one gets a 4xx, and the server stays
healthy. Deterministic (seeded) and bounded in count and time."""

import http.client
import json
import random
import time

from conftest import Server

N = 2500


def rand_scalar(rng):
    return rng.choice([
        None, True, False, 0, -1, 1, 2**63, -(2**63) - 1, 10**30, 1e308, -1e308, 1.5, -0.0, "", "x" * rng.randint(0, 300),
        "\u0000", "\ud7ff", "<think>", "<|im_end|>", "\U0001F600", [], {},
    ])


def rand_value(rng, depth=0):
    r = rng.random()
    if depth > 3 or r < 0.5:
        return rand_scalar(rng)
    if r < 0.75:
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(FIELDS + ["zz", ""]): rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


FIELDS = ["model", "messages", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
          "stream_options", "n", "logprobs", "tools", "response_format", "logit_bias", "role", "content",
          "max_completion_tokens", "chat_template_kwargs"]


def hostile_body(rng, i):
    kind = i % 10
    if kind == 0:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 200)))
    if kind == 1:
        return b'{"messages": [{"role": "user", "content": "\xff\xfe bad utf8"}], "max_tokens": 2}'
    if kind == 2:
        d = rng.randint(200, 5000)
        return ("[" * d + "]" * d).encode() if rng.random() < 0.5 else ('{"a":' * d + "1" + "}" * d).encode()
    if kind == 3:
        return json.dumps({"messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": rng.choice([0, -5, 10**40, 1e300, "7", True, 2.5, 10**6])}).encode()
    if kind == 4:
        body = {"messages": rand_value(rng), "model": rand_scalar(rng)}
        return json.dumps(body).encode()
    if kind == 5:
        body = {rng.choice(FIELDS): rand_value(rng) for _ in range(rng.randint(1, 6))}
        body["max_tokens"] = -1  # never a valid request, whatever else was drawn
        return json.dumps(body).encode()
    if kind == 6:
        v = rand_value(rng)
        if isinstance(v, dict):
            v["max_tokens"] = -1
        return json.dumps(v).encode()
    if kind == 7:
        return b'{"messages": [{"role": "user", "content": "hi"}], "seed": 1' + b"9" * rng.randint(20, 400) + b"}"
    if kind == 8:
        return json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                           "stream": rng.choice([1, "yes", None])}).encode()
    return b'{"prompt": [' + b",".join(str(rng.choice([-1, 2**40, 3.5, 99999999])).encode() for _ in range(3)) + b"]}"


def test_hostile_requests_all_get_4xx_and_the_server_stays_healthy():
    s = Server("--max-request-bytes", "100000", "--max-tokens", "64")
    try:
        rng = random.Random(1234)
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        statuses = {}
        started = time.time()
        for i in range(N):
            path = rng.choice(["/v1/chat/completions", "/v1/completions"])
            method = "POST"
            if i % 97 == 0:
                method, path = rng.choice([("PUT", "/v1/completions"), ("DELETE", "/v1/models"), ("POST", "/v1/x")])
            body = hostile_body(rng, i)
            try:
                conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
                continue
            statuses[r.status] = statuses.get(r.status, 0) + 1
            assert 400 <= r.status < 500, (r.status, body[:200], data[:300])
            assert "error" in json.loads(data), data[:200]
            assert time.time() - started < 300, "bounded in time"
        conn.close()
        assert sum(statuses.values()) >= N * 0.95, statuses
        assert s.get("/livez")[0] == 200 and s.get("/readyz")[0] == 200
        r = s.client().chat.completions.create(model=s.model_id(), messages=[{"role": "user", "content": "still ok?"}],
                                               max_tokens=3, temperature=0)
        assert r.usage.completion_tokens >= 1
        assert s.proc.poll() is None
    finally:
        assert s.stop() == 0
