"""Tool calling and structured output on the built-in default model (Kimi K3 architecture, XTML
chat format, random weights), through the official openai and anthropic clients. K3's calls are
`<|open|>tools<|sep|>` elements with typed argument blocks; the grammar forces them, the parser
turns them back into OpenAI `tool_calls`. With thinking on, a random model never ends its
reasoning, so the forced cases run with thinking off (`reasoning_effort: "none"`), as a client
that wants an immediate call would."""

import json

import anthropic
import jsonschema
import pytest

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "detail": {"type": "object", "properties": {"wind": {"type": "boolean"}}, "required": ["wind"],
                   "additionalProperties": False},
    },
    "required": ["city", "days", "detail"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
USER = [{"role": "user", "content": "Weather in Paris for two days, please."}]


def ask(server, **kw):
    args = dict(model=server.model_id(), messages=USER, max_tokens=600, temperature=0, reasoning_effort="none")
    args.update(kw)
    return server.client().chat.completions.create(**args)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_are_schema_valid(k3_server, choice):
    r = ask(k3_server, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    calls = r.choices[0].message.tool_calls
    assert calls and len(calls) == 1, r.choices[0]
    c = calls[0]
    if isinstance(choice, dict):
        assert c.function.name == "get_weather"
    jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    assert r.choices[0].finish_reason == ("stop" if isinstance(choice, dict) else "tool_calls")
    # Seeded sampling under the constraint is valid and reproducible too.
    s1 = ask(k3_server, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, temperature=0.8, seed=4)
    s2 = ask(k3_server, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, temperature=0.8, seed=4)
    for s in (s1, s2):
        for c in s.choices[0].message.tool_calls:
            jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    args = lambda r: [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls]
    assert args(s1) == args(s2)


def test_streamed_k3_call_reassembles(k3_server):
    kw = dict(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    whole = ask(k3_server, **kw).choices[0].message.tool_calls
    parts = {}
    for chunk in ask(k3_server, stream=True, **kw):
        for t in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            p = parts.setdefault(t.index, {"name": t.function.name, "arguments": ""})
            p["arguments"] += t.function.arguments or ""
    assert [(p["name"], p["arguments"]) for _, p in sorted(parts.items())] == [
        (c.function.name, c.function.arguments) for c in whole]


def test_tool_results_out_of_order_render_and_are_answered(k3_server):
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(
            {"city": "Paris", "days": 2, "detail": {"wind": True}})}},
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}},
    ]
    history = USER + [{"role": "assistant", "content": None, "tool_calls": calls}]
    ordered = history + [{"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
                         {"role": "tool", "tool_call_id": "call_b", "content": "12:00"}]
    swapped = history + [ordered[-1], ordered[-2]]
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": TIME}}
    a = ask(k3_server, messages=ordered, tools=TOOLS, tool_choice="none", response_format=fmt)
    b = ask(k3_server, messages=swapped, tools=TOOLS, tool_choice="none", response_format=fmt)
    # The encoder re-orders results into the calls' order: the same prompt, the same answer.
    assert a.usage.prompt_tokens == b.usage.prompt_tokens
    assert a.choices[0].message.content == b.choices[0].message.content
    jsonschema.validate(json.loads(a.choices[0].message.content), TIME)


def test_json_schema_with_thinking_off_validates(k3_server):
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER, "strict": True}}
    for kw in (dict(), dict(temperature=1.0, seed=9)):
        r = ask(k3_server, response_format=fmt, **kw)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), WEATHER)


def test_thinking_effort_and_forced_calls_with_thinking_never_fail(k3_server):
    for effort in ("low", "high", "max"):
        r = ask(k3_server, reasoning_effort=effort, tools=TOOLS, tool_choice="required", max_tokens=32)
        # A random model keeps thinking: the output is reasoning cut by the limit, not an error.
        assert r.choices[0].finish_reason in ("length", "tool_calls")


def test_messages_api_forced_tool_use_on_k3(k3_server):
    c = anthropic.Anthropic(base_url=k3_server.base, api_key="unused", max_retries=0)
    tool = {"name": "get_time", "input_schema": TIME}
    forced = {"type": "tool", "name": "get_time", "disable_parallel_tool_use": True}
    # Thinking is off unless the request enables it (K3 thinks by default): no thinking block.
    for kw in ({}, {"thinking": {"type": "disabled"}}):
        r = c.messages.create(model=k3_server.model_id(), max_tokens=300, messages=USER, tools=[tool],
                              tool_choice=forced, extra_body={"temperature": 0}, **kw)
        assert [b.type for b in r.content] == ["tool_use"], r.content
        assert r.content[0].name == "get_time"
        jsonschema.validate(r.content[0].input, TIME)
        assert r.stop_reason == "tool_use"
    # A forced tool with thinking enabled is refused, as Anthropic refuses it.
    for choice in (forced, {"type": "any"}):
        with pytest.raises(anthropic.BadRequestError) as e:
            c.messages.create(model=k3_server.model_id(), max_tokens=300, messages=USER, tools=[tool],
                              tool_choice=choice, thinking={"type": "enabled", "budget_tokens": 1024})
        assert "Thinking may not be enabled when tool_choice forces tool use" in str(e.value)


def test_responses_api_forced_function_call_on_k3(k3_server):
    r = k3_server.client().responses.create(
        model=k3_server.model_id(), input="What time is it in Berlin?", max_output_tokens=300, temperature=0,
        reasoning={"effort": "none"}, parallel_tool_calls=False, tool_choice="required",
        tools=[{"type": "function", "name": "get_time", "parameters": TIME, "strict": True}],
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_time"
    jsonschema.validate(json.loads(calls[0].arguments), TIME)
    # The call's result answered in a follow-up (previous_response_id), constrained to JSON.
    follow = k3_server.client().responses.create(
        model=k3_server.model_id(), previous_response_id=r.id, max_output_tokens=300, temperature=0,
        reasoning={"effort": "none"}, tool_choice="none",
        tools=[{"type": "function", "name": "get_time", "parameters": TIME, "strict": True}],
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "12:00 CET"}],
        text={"format": {"type": "json_schema", "name": "t", "schema": TIME, "strict": True}},
    )
    assert follow.status == "completed"
    jsonschema.validate(json.loads(follow.output_text), TIME)
    assert follow.usage.input_tokens > r.usage.input_tokens
