"""The Anthropic Messages API (`/v1/messages`) through the official `anthropic` client: text
streamed and not with the standard event sequence and usage, forced `tool_use` (schema-valid
input, streamed input equal to the non-streamed one), a `tool_result` turn, count_tokens,
`x-api-key` auth, and Anthropic-shaped 400s. Random weights: only constrained output is
asserted on content."""

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest

from conftest import Server

MSGS = [{"role": "user", "content": "Tell me about the sea."}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 16}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
TIME = {
    "name": "get_time",
    "input_schema": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]},
}


def client(server, api_key="unused"):
    return anthropic.Anthropic(base_url=server.base, api_key=api_key, max_retries=0, timeout=120)


# This SDK version no longer has `temperature` / `top_p` / `top_k` arguments; the API still
# takes them in the body.
GREEDY = {"temperature": 0}


def create(server, **kw):
    args = dict(model=server.model_id(), max_tokens=24, extra_body=GREEDY, messages=MSGS)
    args.update(kw)
    return client(server).messages.create(**args)


def raw_events(server, **kw):
    args = dict(model=server.model_id(), max_tokens=24, extra_body=GREEDY, messages=MSGS)
    args.update(kw)
    return list(client(server).messages.create(stream=True, **args))


def tool_uses(message):
    return [b for b in message.content if b.type == "tool_use"]


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def test_text_message_and_stream_agree_with_usage(server):
    r = create(server)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert r.model == server.model_id()
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    assert [b.type for b in r.content] == ["text"]
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 24
    events = raw_events(server)
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    assert types[1] == "content_block_start" and "ping" not in types  # the SDK drops pings
    assert events[0].message.usage.input_tokens == r.usage.input_tokens
    assert events[0].message.content == []
    starts = [e for e in events if e.type == "content_block_start"]
    stops = [e for e in events if e.type == "content_block_stop"]
    assert [e.index for e in starts] == [e.index for e in stops] == list(range(len(starts)))
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text == r.content[0].text
    delta = events[-2]
    assert delta.delta.stop_reason == r.stop_reason and delta.usage.output_tokens == r.usage.output_tokens
    # The SDK's stream helper accumulates the same message.
    with client(server).messages.stream(model=server.model_id(), max_tokens=24, extra_body=GREEDY, messages=MSGS) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == r.content[0].text and final.content[0].text == r.content[0].text
    assert final.usage.output_tokens == r.usage.output_tokens


def test_beta_query_and_system_blocks_are_accepted(server):
    r = client(server).beta.messages.create(
        model=server.model_id(), max_tokens=8, messages=MSGS,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        metadata={"user_id": "u1"}, stop_sequences=["\n\n"], thinking={"type": "adaptive"},
        extra_body={"temperature": 0, "top_k": 5, "top_p": 0.9},
    )
    assert r.type == "message" and r.usage.output_tokens <= 8
    # The system prompt is part of the rendered prompt (count_tokens renders it the same way).
    count = client(server).messages.count_tokens
    short = count(model=server.model_id(), messages=MSGS, system=[{"type": "text", "text": "Be brief."}])
    assert short.input_tokens == r.usage.input_tokens
    longer = count(model=server.model_id(), messages=MSGS, system="Be brief. Answer in one short line.")
    assert longer.input_tokens > short.input_tokens


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_weather"}, {"type": "any"}])
def test_forced_tool_use_gives_schema_valid_input(server, choice):
    r = create(server, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=200)
    uses = tool_uses(r)
    assert uses, r.content
    assert r.stop_reason == "tool_use"
    schemas = {t["name"]: t["input_schema"] for t in (WEATHER, TIME)}
    for u in uses:
        if choice["type"] == "tool":
            assert u.name == "get_weather"
        assert u.name in schemas and u.id
        jsonschema.validate(u.input, schemas[u.name])


def test_streamed_tool_use_reassembles_to_the_non_streamed_input(server):
    kw = dict(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=200)
    r = create(server, **kw)
    events = raw_events(server, **kw)
    starts = [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]
    assert len(starts) == len(tool_uses(r)) >= 1
    assert starts[0].content_block.name == "get_weather" and starts[0].content_block.input == {}
    partial = "".join(e.delta.partial_json for e in events
                      if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
                      and e.index == starts[0].index)
    assert json.loads(partial) == tool_uses(r)[0].input
    assert events[-2].delta.stop_reason == "tool_use"
    with client(server).messages.stream(model=server.model_id(), extra_body=GREEDY, messages=MSGS, **kw) as s:
        final = s.get_final_message()
    assert [(u.name, u.input) for u in tool_uses(final)] == [(u.name, u.input) for u in tool_uses(r)]


def test_a_tool_result_turn_renders_and_is_answered(server):
    history = MSGS + [
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris", "days": 1}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "sunny, 21 C"}]},
            {"type": "text", "text": "Thanks. Summarise."},
        ]},
    ]
    r = create(server, messages=history, tools=[WEATHER], tool_choice={"type": "none"})
    assert r.stop_reason in ("end_turn", "max_tokens") and not tool_uses(r)
    assert r.usage.output_tokens > 0
    c = client(server)
    counted = c.messages.count_tokens(model=server.model_id(), messages=history, tools=[WEATHER],
                                      tool_choice={"type": "none"})
    assert counted.input_tokens == r.usage.input_tokens
    shorter = c.messages.count_tokens(model=server.model_id(), messages=MSGS)
    assert 0 < shorter.input_tokens < counted.input_tokens
    # An error result is accepted too.
    history[-1]["content"][0]["is_error"] = True
    assert create(server, messages=history, tools=[WEATHER], tool_choice={"type": "none"}).type == "message"


def test_output_config_json_schema_validates(server):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 10}},
              "required": ["answer"], "additionalProperties": False}
    r = create(server, output_config={"format": {"type": "json_schema", "schema": schema}}, max_tokens=100)
    assert r.stop_reason == "end_turn", r.content
    jsonschema.validate(json.loads(text_of(r)), schema)


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]),
         "image"),
        (dict(extra_body={"temperature": 1.5}), "temperature"),
        (dict(output_config={"effort": "medium"}), "effort"),
        (dict(tool_choice={"type": "tool", "name": "nope"}, tools=[WEATHER]), "nope"),
        (dict(tools=[{"name": "bad name!", "input_schema": {"type": "object"}}]), "name"),
        (dict(messages=MSGS + [{"role": "assistant", "content": "{"}]), "prefill"),
        (dict(extra_body={"frobnicate": 1}), "frobnicate"),
    ],
)
def test_invalid_requests_are_anthropic_shaped_400s(server, kw, needle):
    with pytest.raises(anthropic.BadRequestError) as e:
        create(server, **kw)
    assert e.value.status_code == 400
    body = e.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert needle in body["error"]["message"]


def test_missing_max_tokens_and_bad_json_are_anthropic_shaped(server):
    r = httpx.post(server.base + "/v1/messages", json={"model": server.model_id(), "messages": MSGS})
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": "`max_tokens` is required"}}
    r = httpx.post(server.base + "/v1/messages", content=b'{"messages": [', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as e:
        create(server, model="claude-no-such-model")
    assert e.value.body["error"]["type"] == "not_found_error"


def test_x_api_key_auth(tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    s = Server("--api-key-file", str(key))
    try:
        m = "tiny-deepseek"
        r = client(s, api_key="s3cret-key").messages.create(model=m, max_tokens=4, messages=MSGS)
        assert r.type == "message"
        with pytest.raises(anthropic.AuthenticationError) as e:
            client(s, api_key="wrong").messages.create(model=m, max_tokens=4, messages=MSGS)
        assert e.value.status_code == 401 and e.value.body["error"]["type"] == "authentication_error"
        # x-api-key works on the OpenAI routes too, and bearer keys on the Messages API.
        r = httpx.get(s.base + "/v1/models", headers={"x-api-key": "s3cret-key"})
        assert r.status_code == 200
        r = httpx.post(s.base + "/v1/messages", headers={"authorization": "Bearer s3cret-key"},
                       json={"model": m, "max_tokens": 4, "messages": MSGS})
        assert r.status_code == 200 and r.json()["type"] == "message"
        assert len(s.client(api_key="s3cret-key").models.list().data) == 1
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").models.list()
        assert s.metric("deltafin_requests_total", endpoint="messages", outcome="invalid") == 1
        assert s.metric("deltafin_requests_total", endpoint="messages", outcome="success") == 2
    finally:
        s.stop()


def test_thinking_blocks_come_from_the_reasoning(thinking_model):
    s = Server("--max-tokens", "512", model=thinking_model)
    try:
        m = s.model_id()
        r = client(s).messages.create(model=m, max_tokens=16, extra_body=GREEDY, messages=MSGS,
                                      thinking={"type": "enabled", "budget_tokens": 1024})
        assert r.content[0].type == "thinking" and r.content[0].thinking and r.content[0].signature == ""
        events = list(client(s).messages.create(model=m, max_tokens=16, extra_body=GREEDY, messages=MSGS,
                                                thinking={"type": "enabled", "budget_tokens": 1024}, stream=True))
        assert events[1].type == "content_block_start" and events[1].content_block.type == "thinking"
        thinking = "".join(e.delta.thinking for e in events
                           if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
        assert thinking == r.content[0].thinking
        # Without `thinking` enabled there is no thinking block, streamed or not (Anthropic's
        # semantics), even where the template cannot turn the reasoning off.
        for kw in ({}, {"thinking": {"type": "disabled"}}):
            r = client(s).messages.create(model=m, max_tokens=16, extra_body=GREEDY, messages=MSGS, **kw)
            assert all(b.type != "thinking" for b in r.content), r.content
            events = list(client(s).messages.create(model=m, max_tokens=16, extra_body=GREEDY, messages=MSGS,
                                                    stream=True, **kw))
            assert all(e.type != "content_block_start" or e.content_block.type != "thinking" for e in events)
        # History thinking blocks are accepted as the assistant's reasoning.
        history = MSGS + [{"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": ""}, {"type": "text", "text": "Waves."}]},
            {"role": "user", "content": "More."}]
        assert client(s).messages.create(model=m, max_tokens=4, messages=history).type == "message"
    finally:
        s.stop()
