"""Each family's tool format through the real server, against transformers' own rendering.

* Prompt parity: `/tokenize` of conversations with tools, tool calls (arguments sent as the JSON
  strings the openai client sends), tool results and reasoning equals
  `apply_chat_template(..., tools=...)` on the published templates
  (`engine/tests/fixtures/tool-parity/golden.json`, made by `gen_tool_parity.py`), for Qwen3.5
  XML, Qwen3 hermes, GLM-4.5, GLM-4.7 (and GLM-5, which ships its files), MiniMax-M2 and gpt-oss;
  what the template refuses is a 400.
* The official openai client on the GLM-4.5, GLM-5, MiniMax-M2, Qwen3.5 and gpt-oss (harmony) fixtures: `tool_choice:
  auto` never leaves call or reasoning markup in `content` (reasoning opened by the generation
  prompt's `<think>\n` comes back as `reasoning_content`); a forced call (`required`, named, with and without
  parallel calls) comes back as schema-valid `tool_calls` (`finish_reason` `tool_calls`; `stop`
  for a named function, as OpenAI answers), exactly one when parallel calls are off, after
  reasoning held to half of `max_tokens`; two tool rounds render and run.
"""

import datetime
import json
import re
import shutil
import urllib.request
from pathlib import Path

import pytest
from conftest import Server
from test_agent_loop import run_agents_sdk, run_messages_loop

FIXTURES = Path(__file__).resolve().parents[3] / "engine/tests/fixtures"
GOLDEN = json.loads((FIXTURES / "tool-parity/golden.json").read_text(encoding="utf-8"))
MODELS = {m["name"]: m for m in GOLDEN["models"]}
# GLM-5 (fixture glm5-dsa-fp8) carries GLM-4.7's published template and the tokenizer of the
# glm4-moe-fp8 fixture byte for byte (gen_glm5.py), so GLM-4.7's rendered goldens are its own.
MODELS["glm-5"] = dict(MODELS["glm-4.7"], name="glm-5", fixture="glm5-dsa-fp8", template=None)
# Each family's `format` label of deltafin_tool_calls_total.
LABELS = {"glm-4.5": "glm", "glm-4.7": "glm", "glm-5": "glm", "minimax-m2": "minimax_m2", "qwen3.5": "qwen_xml",
          "gpt-oss": "harmony"}


def wire(messages):
    """The conversation as an OpenAI client sends it: call arguments as JSON strings."""
    out = json.loads(json.dumps(messages))
    for m in out:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.dumps(c["function"]["arguments"])
    return out


def model_dir(tmp_path, model, context=None):
    """A copy of the fixture with the model's published template where the model carries it;
    `context`: a longer context window than the tiny fixture declares (for two tool rounds
    behind gpt-oss's long tool preamble; no output is compared with an oracle there)."""
    dst = tmp_path / model["name"]
    shutil.copytree(FIXTURES / model["fixture"], dst)
    if model["template"]:
        shutil.copy(FIXTURES / "tool-parity" / model["template"], dst / "chat_template.jinja")
    if context:
        config = json.loads((dst / "config.json").read_text())
        inner = config.get("text_config", config)  # Qwen3.5 nests its text model's config
        inner["max_position_embeddings"] = max(inner["max_position_embeddings"], context)
        (dst / "config.json").write_text(json.dumps(config))
    return dst


def post(server, path, body):
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


DATE_LINE = re.compile(r"Current date: (\d{4}-\d{2}-\d{2})")


def expected_ids(model, case):
    """The golden ids, or, for a template that prints the day it renders (gpt-oss's
    `strftime_now('%Y-%m-%d')`, which the server reads from the clock as transformers does), the
    golden text with today's date in place, tokenized by HF `tokenizers` from the fixture's own
    tokenizer.json. The recorded text must give the recorded ids, so the oracle is checked too."""
    dates = DATE_LINE.findall(case["text"])
    if not dates:
        return case["ids"]
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(FIXTURES / model["fixture"] / "tokenizer.json"))
    assert hf.encode(case["text"], add_special_tokens=False).ids == case["ids"], "the oracle re-tokenizes the golden"
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    text = DATE_LINE.sub(f"Current date: {today}", case["text"])
    return hf.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("name", list(MODELS))
def test_tokenize_matches_the_published_template_with_tools_calls_and_results(tmp_path, name):
    model = MODELS[name]
    s = Server("--max-tokens", "8", model=str(model_dir(tmp_path, model)))
    try:
        for case in model["cases"]:
            body = {"messages": wire(GOLDEN["conversations"][case["conversation"]]),
                    "add_generation_prompt": True, "chat_template_kwargs": case["chat_template_kwargs"]}
            if case["tools"]:
                body["tools"] = GOLDEN["tools"]
            status, out = post(s, "/tokenize", body)
            where = f"{name} {case['conversation']} {case['chat_template_kwargs']}"
            if "error" in case:
                assert status == 400, (where, out)
                continue
            assert status == 200, (where, out)
            want = expected_ids(model, case)
            assert out["tokens"] == want, where
            assert out["count"] == len(want), where
            # The request's own `reasoning_effort` reaches gpt-oss's template the same way;
            # models without an effort control refuse it.
            if case["chat_template_kwargs"] == {"reasoning_effort": "high"}:
                body = dict(body, chat_template_kwargs={}, reasoning_effort="high")
                status, out = post(s, "/tokenize", body)
                if name == "gpt-oss":
                    assert (status, out["tokens"]) == (200, want), where
                else:
                    assert status == 400 and "reasoning_effort" in json.dumps(out), (where, out)
    finally:
        s.stop()


# Enum- and boolean-only parameters and no other keys, so a forced call on a tiny random model
# ends quickly (JSON arguments would otherwise admit extra keys of any length).
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "hourly": {"type": "boolean"}},
        "required": ["unit", "hourly"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "description": "Time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["utc", "local"]}}, "required": ["zone"],
        "additionalProperties": False}}},
]


def check_call(call):
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"unit", "hourly"} and args["unit"] in ("c", "f") and isinstance(args["hourly"], bool), args
    else:
        assert call.function.name == "get_time" and args in ({"zone": "utc"}, {"zone": "local"}), args


@pytest.mark.parametrize("name", ["glm-4.5", "glm-4.7", "glm-5", "minimax-m2", "qwen3.5", "gpt-oss"])
def test_the_openai_client_gets_native_calls_forced_by_grammar_and_no_markup(tmp_path, name):
    model = MODELS[name]
    s = Server("--max-tokens", "256", model=str(model_dir(tmp_path, model, context=2048)))
    markup = ["<tool_call>", "</tool_call>", "<arg_key>", "<minimax:tool_call>", "<invoke", "<function=",
              "<think>", "</think>", "<|channel|>", "<|message|>", "<|call|>", "to=functions"]
    try:
        c, m = s.client(), s.model_id()
        messages = [{"role": "user", "content": "What is the weather?"}]
        for stream in (False, True):
            if stream:
                chunks = list(c.chat.completions.create(model=m, messages=messages, tools=TOOLS, max_tokens=24,
                                                        temperature=0, stream=True))
                content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            else:
                r = c.chat.completions.create(model=m, messages=messages, tools=TOOLS, max_tokens=24, temperature=0)
                content = r.choices[0].message.content or ""
                if name in ("minimax-m2", "qwen3.5"):
                    # The generation prompt opens `<think>\n`: the output starts as reasoning.
                    assert r.choices[0].message.model_extra.get("reasoning_content"), r
            assert not any(t in content for t in markup), content
        labels = dict(endpoint="chat_completions", format=LABELS[name])
        # A random model's `auto` output may hold malformed markup (counted); forced calls never.
        malformed = s.metric("deltafin_tool_calls_total", **labels, outcome="malformed")
        for choice, parallel in [("required", True), ("required", False),
                                 ({"type": "function", "function": {"name": "get_time"}}, False)]:
            r = c.chat.completions.create(model=m, messages=messages, tools=TOOLS, tool_choice=choice,
                                          parallel_tool_calls=parallel, max_tokens=256, temperature=0)
            msg = r.choices[0].message
            # With parallel calls a tiny random model may go on calling until max_tokens: the
            # complete calls come back and the cut-off one is withheld (finish_reason length).
            # A named function ends with "stop", as OpenAI answers it.
            allowed = ("stop",) if isinstance(choice, dict) else ("tool_calls", "length") if parallel else ("tool_calls",)
            assert r.choices[0].finish_reason in allowed, (choice, parallel, r)
            assert msg.tool_calls and not any(t in (msg.content or "") for t in markup), msg
            if not parallel:
                assert len(msg.tool_calls) == 1, msg.tool_calls
            if isinstance(choice, dict):
                assert msg.tool_calls[0].function.name == "get_time"
            for call in msg.tool_calls:
                check_call(call)
        # A forced call streamed reassembles to the same call as the non-streamed one.
        kw = dict(model=m, messages=messages, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                  max_tokens=256, temperature=0)
        whole = c.chat.completions.create(**kw).choices[0].message.tool_calls
        parts = {}
        for ch in c.chat.completions.create(stream=True, **kw):
            for t in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                p = parts.setdefault(t.index, {"id": t.id, "name": "", "arguments": ""})
                p["name"] += (t.function.name or "") if t.function else ""
                p["arguments"] += (t.function.arguments or "") if t.function else ""
        assert [(p["name"], p["arguments"]) for p in parts.values()] == \
            [(t.function.name, t.function.arguments) for t in whole]
        # Every parsed call was counted under the family's format label.
        assert s.metric("deltafin_tool_calls_total", **labels, outcome="parsed") >= 5
        assert s.metric("deltafin_tool_calls_total", **labels, outcome="malformed") == malformed
        # Two tool rounds: the calls and results go back, and the server renders them.
        for _ in range(2):
            r = c.chat.completions.create(model=m, messages=messages, tools=TOOLS, tool_choice="required",
                                          parallel_tool_calls=False, max_tokens=256, temperature=0)
            msg = r.choices[0].message
            messages.append({"role": "assistant", "content": msg.content or "",
                             "tool_calls": [t.model_dump() for t in msg.tool_calls]})
            messages.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "sunny"})
        r = c.chat.completions.create(model=m, messages=messages, tools=TOOLS, max_tokens=8, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    finally:
        s.stop()


@pytest.mark.parametrize("name", ["glm-4.5", "glm-5", "minimax-m2", "qwen3.5", "gpt-oss"])
def test_the_agents_sdk_and_an_anthropic_loop_run_two_tool_rounds_on_each_family(tmp_path, name):
    s = Server("--max-tokens", "256", model=str(model_dir(tmp_path, MODELS[name], context=4096)))
    try:
        run_agents_sdk(s)
        run_messages_loop(s)
    finally:
        s.stop()


def tool_outputs(server, max_tokens=160):
    """Token ids and parsed calls of auto and forced tool requests, greedy and sampled."""
    c, m = server.client(), server.model_id()
    messages = [{"role": "user", "content": "What is the weather? abc abc abc abc"}]
    out = []
    for choice, sampling in [("auto", {"temperature": 0}), ("required", {"temperature": 0}),
                             ("required", {"temperature": 0.9, "top_p": 0.9, "seed": 7})]:
        r = c.chat.completions.create(model=m, messages=messages, tools=TOOLS, tool_choice=choice,
                                      max_tokens=max_tokens, extra_body={"return_token_ids": True}, **sampling)
        msg = r.choices[0].message
        calls = [(t.function.name, t.function.arguments) for t in msg.tool_calls or []]
        out.append((r.choices[0].model_extra["token_ids"], calls, msg.content, r.choices[0].finish_reason))
    return out


def outputs_without_and_with_drafts(make_dir, max_tokens=160):
    """`tool_outputs` of a server on `make_dir(spec)` with n-gram drafting off, then on (the
    fixtures carry no draft model); checks that it drafted."""
    outs = []
    for spec in ("off", "on"):
        s = Server("--max-tokens", "256", "--spec", spec, model=str(make_dir(spec)))
        try:
            outs.append(tool_outputs(s, max_tokens))
            if spec == "on":
                assert s.metric("deltafin_spec_decode_drafts_total", draft="ngram") > 0, "n-gram drafted"
        finally:
            s.stop()
    return outs


@pytest.mark.parametrize("name", ["glm-4.5", "glm-5", "minimax-m2", "qwen3.5", "gpt-oss"])
def test_drafts_never_change_the_ids_or_the_calls(tmp_path, name):
    """n-gram drafting gives the same ids and calls."""
    outs = outputs_without_and_with_drafts(lambda spec: model_dir(tmp_path / spec, MODELS[name], context=2048))
    assert outs[0] == outs[1]


HARMONY = json.loads((FIXTURES / "harmony/golden.json").read_text(encoding="utf-8"))


def test_gpt_oss_prompts_equal_openai_harmony_where_the_published_template_does(tmp_path):
    """`/tokenize` on gpt-oss against OpenAI's `openai-harmony` renderer and gpt-oss's published
    template (`harmony/golden.json`, made by `gen_harmony.py`): richer tools (enums, defaults,
    arrays, a function without parameters), history calls and results, two rounds, each
    reasoning effort. Where the two renderers agree the server gives exactly that prompt; where
    they differ (recorded in the golden: the template's blank line after bare instructions, its
    comma after a default, `()` for a function without parameters, tool results as JSON strings,
    and analysis of finished turns dropped) the server follows the published template, as HF
    `transformers` renders it."""
    from tokenizers import Tokenizer

    model = MODELS["gpt-oss"]
    s = Server("--max-tokens", "8", model=str(model_dir(tmp_path, model, context=4096)))
    hf = Tokenizer.from_file(str(FIXTURES / model["fixture"] / "tokenizer.json"))
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    agreed = 0
    try:
        for case in HARMONY["renders"]:
            body = {"messages": wire(HARMONY["conversations"][case["conversation"]]),
                    "add_generation_prompt": True, "chat_template_kwargs": case["chat_template_kwargs"]}
            if case["tools"]:
                body["tools"] = HARMONY["tools"]
            status, out = post(s, "/tokenize", body)
            where = f"{case['conversation']} {case['chat_template_kwargs']}"
            assert status == 200, (where, out)
            text = case["harmony_text"] if case["agree"] else case["hf_text"]
            text = text.replace(f"Current date: {HARMONY['date']}", f"Current date: {today}")
            assert out["tokens"] == hf.encode(text, add_special_tokens=False).ids, where
            agreed += case["agree"]
    finally:
        s.stop()
    assert agreed >= 6, "plain and finished-answer conversations render as openai-harmony does"


def test_a_gpt_oss_responses_replay_renders_as_the_chat_conversation(tmp_path):
    """Responses input items replayed to gpt-oss (reasoning items with `reasoning_text`, function
    calls, their outputs, an assistant answer between two tool rounds, `reasoning.effort`) render
    the prompt the chat conversation renders: `usage.input_tokens` equals the length of
    gpt-oss's published template on the same conversation (`harmony/golden.json`), which keeps
    the reasoning of the open tool loop and drops that of the finished turn."""
    from tokenizers import Tokenizer

    model = MODELS["gpt-oss"]
    s = Server("--max-tokens", "8", model=str(model_dir(tmp_path, model, context=4096)))
    hf = Tokenizer.from_file(str(FIXTURES / model["fixture"] / "tokenizer.json"))
    tools = [dict(type="function", **t["function"]) for t in HARMONY["tools"]]

    def reasoning(text):
        return {"type": "reasoning", "id": f"rs_{len(text)}", "summary": [],
                "content": [{"type": "reasoning_text", "text": text}]}

    def call(c):
        return {"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                "arguments": json.dumps(c["function"]["arguments"])}

    def output(call_id, text):
        return {"type": "function_call_output", "call_id": call_id, "output": text}

    def items(name):
        out = []
        for m in HARMONY["conversations"][name]:
            if m["role"] == "user":
                out.append({"role": "user", "content": m["content"]})
            elif m["role"] == "tool":
                out.append(output(m["tool_call_id"], m["content"]))
            else:
                if m.get("reasoning_content"):
                    out.append(reasoning(m["reasoning_content"]))
                if m.get("content"):
                    out.append({"type": "message", "role": "assistant",
                                "content": [{"type": "output_text", "text": m["content"]}]})
                out.extend(call(c) for c in m.get("tool_calls") or [])
        return out

    try:
        for name in ["call_and_result", "two_rounds"]:
            for effort in [None, "high"]:
                kwargs = {"reasoning_effort": effort} if effort else {}
                case = next(c for c in HARMONY["renders"]
                            if c["conversation"] == name and c["chat_template_kwargs"] == kwargs)
                want = len(hf.encode(case["hf_text"], add_special_tokens=False).ids)
                extra = {"reasoning": {"effort": effort}} if effort else {}
                r = s.client().responses.create(model=s.model_id(), input=items(name), tools=tools,
                                                max_output_tokens=1, **extra)
                assert r.usage.input_tokens == want, (name, effort, r.usage.input_tokens, want)
    finally:
        s.stop()
