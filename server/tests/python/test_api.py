"""The OpenAI API through the official client: chat and completions, streamed and not, usage,
stop strings, seeded sampling, reasoning split, state reuse, unsupported fields."""

import http.client
import json

import openai
import pytest

from conftest import Server

GREEDY = dict(temperature=0, max_tokens=24)
MSGS = [{"role": "user", "content": "Tell me about the sea."}]


def chat(client, model, messages=MSGS, **kw):
    args = dict(GREEDY)
    args.update(kw)
    return client.chat.completions.create(model=model, messages=messages, **args)


def stream_chat(client, model, messages=MSGS, **kw):
    args = dict(GREEDY)
    args.update(kw)
    chunks = list(client.chat.completions.create(model=model, messages=messages, stream=True, **args))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage]
    return content, reasoning, finish, usage, chunks


def test_models_lists_the_served_model(server):
    models = server.client().models.list().data
    assert len(models) == 1 and models[0].id == "tiny-deepseek"
    assert models[0].owned_by == "deltafin" and models[0].max_model_len == 1024


def test_chat_json_and_stream_agree_with_usage(server):
    c, m = server.client(), server.model_id()
    r = chat(c, m)
    assert r.object == "chat.completion" and r.model == m
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 24 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    content, _, finish, usage, chunks = stream_chat(c, m, stream_options={"include_usage": True})
    assert content == choice.message.content
    assert finish == [choice.finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len(usage) == 1 and usage[0].completion_tokens == r.usage.completion_tokens
    assert usage[0].prompt_tokens == r.usage.prompt_tokens
    # Without include_usage no usage chunk is sent.
    _, _, _, usage, _ = stream_chat(c, m)
    assert usage == []


def test_completions_json_and_stream_agree(server):
    c, m = server.client(), server.model_id()
    r = c.completions.create(model=m, prompt="Once upon a time", temperature=0, max_tokens=20)
    assert r.object == "text_completion"
    assert r.usage.completion_tokens <= 20
    text = r.choices[0].text
    chunks = list(c.completions.create(model=m, prompt="Once upon a time", temperature=0, max_tokens=20, stream=True,
                                       stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # Token-id prompts are accepted too; the default max_tokens is 16.
    r = c.completions.create(model=m, prompt=[256, 72, 105], temperature=0)
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens <= 16


def test_stop_strings_cut_before_the_match(server):
    c, m = server.client(), server.model_id()
    base = c.completions.create(model=m, prompt="The weather", temperature=0, max_tokens=48, extra_body={"ignore_eos": True})
    text = base.choices[0].text
    assert len(text) > 12, text
    stop = text[8:11]
    cut = text.index(stop)
    r = c.completions.create(model=m, prompt="The weather", temperature=0, max_tokens=48, stop=[stop],
                             extra_body={"ignore_eos": True})
    assert r.choices[0].text == text[:cut]
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < base.usage.completion_tokens
    chunks = list(c.completions.create(model=m, prompt="The weather", temperature=0, max_tokens=48, stop=stop,
                                       stream=True, extra_body={"ignore_eos": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text[:cut]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible(server):
    c, m = server.client(), server.model_id()
    kw = dict(temperature=1.0, top_p=0.95, max_tokens=24, extra_body={"top_k": 50, "ignore_eos": True})
    a = chat(c, m, seed=42, **kw).choices[0].message.content
    b = chat(c, m, seed=42, **kw).choices[0].message.content
    s, _, _, _, _ = stream_chat(c, m, seed=42, **kw)
    assert a == b == s
    others = {chat(c, m, seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "different seeds should give different samples"


def test_reasoning_goes_to_reasoning_content(thinking_model):
    s = Server("--max-tokens", "512", model=thinking_model)
    try:
        c, m = s.client(), s.model_id()
        found = None
        for seed in range(40):
            r = chat(c, m, temperature=2.0, seed=seed, max_tokens=400)
            msg = r.choices[0].message
            reasoning = getattr(msg, "reasoning_content", None) or ""
            assert reasoning, "the generation prompt opens <think>: output starts as reasoning"
            if msg.content:
                found = (seed, reasoning, msg.content)
                break
        assert found, "no seed produced </think> within 40 tries"
        seed, reasoning, content = found
        assert "<think>" not in content and "</think>" not in reasoning
        s_content, s_reasoning, _, _, _ = stream_chat(c, m, temperature=2.0, seed=seed, max_tokens=400)
        assert (s_reasoning, s_content) == (reasoning, content)
    finally:
        s.stop()


def test_plain_template_has_no_reasoning(server):
    r = chat(server.client(), server.model_id())
    assert getattr(r.choices[0].message, "reasoning_content", None) is None


@pytest.mark.parametrize(
    "field,kwargs",
    [
        ("n", dict(n=9)),
        ("top_logprobs", dict(top_logprobs=3)),
        ("tools[0].type", dict(tools=[{"type": "web_search", "function": {"name": "f"}}])),
        ("response_format.type", dict(response_format={"type": "yaml"})),
        ("logit_bias", dict(logit_bias={"65": 101})),
        ("presence_penalty", dict(presence_penalty=3)),
        ("reasoning_effort", dict(reasoning_effort="low")),
        ("frobnicate", dict(extra_body={"frobnicate": True})),
    ],
)
def test_unsupported_or_invalid_fields_are_400_naming_the_field(server, field, kwargs):
    with pytest.raises(openai.BadRequestError) as e:
        chat(server.client(), server.model_id(), **kwargs)
    err = e.value.body
    assert e.value.status_code == 400
    assert err["param"] == field and field in err["message"]
    assert err["type"] == "invalid_request_error"


def test_bad_values_and_unknown_model(server):
    c, m = server.client(), server.model_id()
    with pytest.raises(openai.BadRequestError) as e:
        chat(c, m, max_tokens=100000)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        chat(c, m, temperature=3)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError) as e:
        chat(c, "no-such-model")
    assert e.value.body["code"] == "model_not_found"


def raw(server, method, path, body=b"", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data, r


def test_malformed_json_and_oversized_bodies(server):
    status, data, _ = raw(server, "POST", "/v1/chat/completions", b'{"messages": [')
    assert status == 400 and json.loads(data)["error"]["code"] == "invalid_json"
    status, data, _ = raw(server, "POST", "/v1/chat/completions", b"x" * 100_000)
    assert status == 413 and json.loads(data)["error"]["code"] == "payload_too_large"
    status, data, _ = raw(server, "GET", "/v1/nope")
    assert status == 404 and "error" in json.loads(data)
    status, data, _ = raw(server, "GET", "/v1/chat/completions")
    assert status == 405 and "error" in json.loads(data)


def test_context_limit_is_400(server):
    with pytest.raises(openai.BadRequestError) as e:
        chat(server.client(), server.model_id(), messages=[{"role": "user", "content": "x" * 5000}])
    assert e.value.body["code"] == "context_length_exceeded"


def test_conversation_state_reuse_gives_identical_output(server):
    c, m = server.client(), server.model_id()
    first = chat(c, m, max_tokens=20, extra_body={"ignore_eos": True})
    convo = MSGS + [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "And the mountains?"}]
    hits = server.metric("deltafin_state_reuse_total", result="hit")
    second = chat(c, m, messages=convo, max_tokens=20, temperature=0.7, seed=9)
    assert server.metric("deltafin_state_reuse_total", result="hit") == hits + 1
    assert second.usage.prompt_tokens_details.cached_tokens >= 16
    fresh = Server("--state-cache", "0")
    try:
        again = chat(fresh.client(), fresh.model_id(), messages=convo, max_tokens=20, temperature=0.7, seed=9)
        assert again.usage.prompt_tokens_details.cached_tokens == 0
        assert again.choices[0].message.content == second.choices[0].message.content
        assert again.usage.completion_tokens == second.usage.completion_tokens
    finally:
        fresh.stop()
