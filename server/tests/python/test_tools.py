"""Tool calling, structured output, logprobs, n and the sampling controls on /v1/chat/completions
and /v1/completions, driven by the official openai client against the real server. The test
model has random weights, so only constrained output is asserted on content: forced calls must be
to an allowed tool with schema-valid arguments, JSON answers must validate, greedy logprobs must
rank the chosen token first. The model speaks Kimi K2's native tool-call format (its byte-level
tokenizer has K2's tool tokens)."""

import json

import jsonschema
import openai
import pytest

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "metric": {"type": "boolean"},
    },
    "required": ["city", "days", "metric"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ANSWER = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "label": {"type": "string", "maxLength": 8},
        "kind": {"enum": ["a", "b", "c"]},
    },
    "required": ["ok", "count", "label", "kind"],
    "additionalProperties": False,
}
USER = [{"role": "user", "content": "What is the weather in Paris for three days?"}]


def ask(server, **kw):
    args = dict(model=server.model_id(), messages=USER, max_tokens=400, temperature=0)
    args.update(kw)
    return server.client().chat.completions.create(**args)


def norm(message):
    """A message without its per-response call ids."""
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    return message.content, calls


def check_call(call, allowed):
    assert call.type == "function"
    assert call.function.name in allowed
    assert call.id
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_gives_a_schema_valid_call(server):
    before = server.metric("deltafin_tool_calls_total", endpoint="chat_completions", format="kimi_k2", outcome="parsed")
    r = ask(server, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert len(calls) == 1
    check_call(calls[0], SCHEMAS)
    # Ids are unique per response (K2's own `functions.NAME:IDX` restarts every turn; the
    # prompt side restores it, see test_tool_results_in_history_render_and_are_answered).
    assert calls[0].id.startswith("call_")
    after = server.metric("deltafin_tool_calls_total", endpoint="chat_completions", format="kimi_k2", outcome="parsed")
    assert after == before + 1
    assert server.metric("deltafin_constrained_tokens_total") > 0


def test_required_with_parallel_calls_and_seeded_sampling(server):
    for seed in (1, 2, 3):
        r = ask(server, tools=TOOLS, tool_choice="required", temperature=0.9, seed=seed, max_tokens=500)
        calls = r.choices[0].message.tool_calls or []
        if r.choices[0].finish_reason == "tool_calls":
            assert len(calls) >= 1
        for c in calls:
            check_call(c, SCHEMAS)
        again = ask(server, tools=TOOLS, tool_choice="required", temperature=0.9, seed=seed, max_tokens=500)
        same = [(c.function.name, c.function.arguments) for c in again.choices[0].message.tool_calls or []]
        assert same == [(c.function.name, c.function.arguments) for c in calls], "seeded sampling is reproducible"


def test_a_call_cut_off_by_max_tokens_is_withheld_never_content(server):
    """A forced call that max_tokens cuts off is withheld: finish_reason length, only complete
    calls, and no call markup in content, streamed or not; the withheld call is counted."""
    before = server.metric("deltafin_tool_calls_total", endpoint="chat_completions", format="kimi_k2", outcome="withheld")
    for max_tokens in (3, 7, 12):
        r = ask(server, tools=TOOLS, tool_choice="required", max_tokens=max_tokens)
        choice = r.choices[0]
        assert choice.finish_reason == "length", (max_tokens, choice)
        assert "tool_call" not in (choice.message.content or ""), choice.message.content
        for c in choice.message.tool_calls or []:
            check_call(c, SCHEMAS)
        stream = ask(server, tools=TOOLS, tool_choice="required", max_tokens=max_tokens, stream=True)
        text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        assert "tool_call" not in text, text
    after = server.metric("deltafin_tool_calls_total", endpoint="chat_completions", format="kimi_k2", outcome="withheld")
    assert after >= before + 3


def test_named_choice_calls_that_tool_and_finishes_with_stop(server):
    r = ask(server, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] and all(c.function.name == "get_time" for c in calls)
    for c in calls:
        check_call(c, {"get_time": TIME})
    # OpenAI reports `stop` for a named tool choice.
    assert r.choices[0].finish_reason == "stop"


def test_streamed_tool_call_deltas_reassemble_to_the_non_streamed_call(server):
    kw = dict(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    whole = ask(server, **kw).choices[0]
    stream = ask(server, stream=True, **kw)
    calls, finish, content = {}, None, ""
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for t in delta.tool_calls or []:
            if t.index not in calls:
                # The first fragment of a call carries its id, type and name, with empty arguments.
                assert t.id and t.type == "function" and t.function.name and t.function.arguments == ""
                calls[t.index] = {"id": t.id, "name": t.function.name, "arguments": ""}
            else:
                assert t.id is None and t.function.name is None
                calls[t.index]["arguments"] += t.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    # Ids are minted per response; everything else is identical.
    got = [{"name": calls[i]["name"], "arguments": calls[i]["arguments"]} for i in sorted(calls)]
    want = [{"name": c.function.name, "arguments": c.function.arguments} for c in whole.message.tool_calls]
    assert got == want
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert finish == whole.finish_reason == "tool_calls"
    assert content == (whole.message.content or "")


def test_tool_results_in_history_render_and_are_answered(server):
    r = ask(server, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    call = r.choices[0].message.tool_calls[0]
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    answer = ask(server, messages=history, tools=TOOLS, max_tokens=24)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.usage.prompt_tokens > r.usage.prompt_tokens
    # Foreign ids (another provider's `call_…`) are accepted and normalised for K2.
    foreign = history[:]
    foreign[1] = {**foreign[1], "tool_calls": [{**call.model_dump(), "id": "call_abc123"}]}
    foreign[2] = {**foreign[2], "tool_call_id": "call_abc123"}
    again = ask(server, messages=foreign, tools=TOOLS, max_tokens=24)
    assert again.usage.prompt_tokens == answer.usage.prompt_tokens
    assert norm(again.choices[0].message) == norm(answer.choices[0].message)
    # The history turn renders as the model wrote it, so the follow-up extends the state of the
    # turn that made the call (strict extension: state reuse).
    native = history[:]
    native[1] = {**native[1], "tool_calls": [{**call.model_dump(), "id": f"functions.{call.function.name}:0"}]}
    native[2] = {**native[2], "tool_call_id": f"functions.{call.function.name}:0"}
    same = ask(server, messages=native, tools=TOOLS, max_tokens=24)
    assert norm(same.choices[0].message) == norm(answer.choices[0].message)


def test_tool_choice_none_and_auto_never_fail(server):
    for choice in ("none", "auto"):
        r = ask(server, tools=TOOLS, tool_choice=choice, max_tokens=48, temperature=1.0, seed=5)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
        if choice == "none":
            assert r.choices[0].message.tool_calls is None


@pytest.mark.parametrize("temperature,seed", [(0, None), (0.8, 11), (1.2, 12)])
def test_json_schema_output_validates(server, temperature, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    r = ask(server, response_format=fmt, temperature=temperature, seed=seed)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), ANSWER)
    if seed is not None:
        again = ask(server, response_format=fmt, temperature=temperature, seed=seed)
        assert again.choices[0].message.content == r.choices[0].message.content


def test_json_object_output_is_an_object(server):
    r = ask(server, response_format={"type": "json_object"}, max_tokens=512)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        # Cut by max_tokens: still a valid JSON prefix of an object.
        assert r.choices[0].message.content.startswith("{")


def test_an_invalid_schema_is_400(server):
    bad = {"type": "object", "properties": {"a": {"type": "no-such-type"}}}
    with pytest.raises(openai.BadRequestError) as e:
        ask(server, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad}})
    assert e.value.body["param"] == "response_format"
    assert "schema" in e.value.body["message"].lower()
    bad_tool = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                 "properties": {"a": {"type": "no-such-type"}}}}}]
    with pytest.raises(openai.BadRequestError):
        ask(server, tools=bad_tool, tool_choice="required")


def test_greedy_top_logprobs_rank_the_chosen_token_first(server):
    r = ask(server, logprobs=True, top_logprobs=5, max_tokens=12)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    for e in entries:
        assert e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == e.logprob <= 0
        assert len(e.top_logprobs) == 5
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
    # Streamed logprobs are the same entries.
    stream = ask(server, logprobs=True, top_logprobs=5, max_tokens=12, stream=True)
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]
    # Under a constraint the logprobs are those of the masked distribution.
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    c = ask(server, logprobs=True, top_logprobs=2, response_format=fmt).choices[0]
    assert c.logprobs.content[0].token == "{" and c.logprobs.content[0].logprob == 0.0


def test_completions_logprobs(server):
    r = server.client().completions.create(
        model=server.model_id(), prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=3
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    for tok, top in zip(lp.tokens, lp.top_logprobs):
        assert max(top, key=top.get) == tok
    assert lp.text_offset[0] == 0


def test_n_choices_share_one_prefill(server):
    prefill_before = server.metric("deltafin_engine_prefill_tokens_total")
    r = ask(server, n=3, temperature=0.9, seed=21, max_tokens=16,
            messages=[{"role": "user", "content": "n choices " + "x" * 40}])
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens <= 3 * 16
    prefilled = server.metric("deltafin_engine_prefill_tokens_total") - prefill_before
    assert prefilled <= r.usage.prompt_tokens, "one prefill for three choices"
    solo = ask(server, n=1, temperature=0.9, seed=21, max_tokens=16,
               messages=[{"role": "user", "content": "n choices " + "x" * 40}])
    assert solo.choices[0].message.content == r.choices[0].message.content
    stream = ask(server, n=2, temperature=0.9, seed=21, max_tokens=16, stream=True,
                 messages=[{"role": "user", "content": "n choices " + "x" * 40}])
    texts = {}
    for c in stream:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
    assert texts[0] == r.choices[0].message.content and texts[1] == r.choices[1].message.content


def test_logit_bias_and_penalties(server):
    # +100 on "Q" (byte 81): greedy picks it at every step.
    r = ask(server, logit_bias={"81": 100}, max_tokens=10)
    assert r.choices[0].message.content == "Q" * 10
    # A strong frequency penalty stops the repetition after the first pick.
    p = ask(server, logit_bias={"81": 5}, frequency_penalty=2.0, max_tokens=10)
    assert p.choices[0].message.content.count("Q") < 10
    for kw in (dict(presence_penalty=1.5), dict(extra_body={"repetition_penalty": 1.3, "min_p": 0.1})):
        ask(server, max_tokens=8, temperature=0.7, seed=3, **kw)
