"""DeepSeek-V3.2 and V4 as DeepSeek ships them (no chat template; `encoding/encoding_dsv32.py` and
`encoding/encoding_dsv4.py` render their prompts) through the real server: `/tokenize` of the
conversations each encoder rendered equals that rendering (engine/tests/fixtures/dsml/ and
dsml-v4/golden.json, made by gen_dsml.py and gen_dsml_v4.py), and DSML calls through the
official openai client: forced calls (required, named, with and without parallel calls) come
back as schema-valid `tool_calls`, `auto` leaves no markup in `content`, and a tool round
renders and answers.
"""

import json
import shutil
from pathlib import Path

import openai
import pytest
from conftest import Server
from test_tool_parity import TOOLS, check_call, outputs_without_and_with_drafts, post

FIXTURES = Path(__file__).resolve().parents[3] / "engine/tests/fixtures"
GOLDEN = json.loads((FIXTURES / "dsml/golden.json").read_text(encoding="utf-8"))
GOLDEN_V4 = json.loads((FIXTURES / "dsml-v4/golden.json").read_text(encoding="utf-8"))


def v32_dir(tmp_path):
    """The dsv32-dsa-bf16 fixture with its chat template taken out, as DeepSeek publishes V3.2."""
    dst = tmp_path / "dsv32"
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copytree(FIXTURES / "dsv32-dsa-bf16", dst)
    config = json.loads((dst / "tokenizer_config.json").read_text(encoding="utf-8"))
    del config["chat_template"]
    (dst / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    # A longer context than the tiny fixture declares, for the DSML tools block (no output is
    # compared with an oracle here).
    model = json.loads((dst / "config.json").read_text(encoding="utf-8"))
    model["max_position_embeddings"] = max(model["max_position_embeddings"], 4096)
    (dst / "config.json").write_text(json.dumps(model), encoding="utf-8")
    return dst


def v4_dir(tmp_path):
    """The dsv4-flash fixture, which ships no chat template, as DeepSeek publishes V4."""
    dst = tmp_path / "dsv4"
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copytree(FIXTURES / "dsv4-flash", dst)
    return dst


@pytest.fixture(scope="module")
def v32(tmp_path_factory):
    s = Server("--max-tokens", "256", model=str(v32_dir(tmp_path_factory.mktemp("dsml"))))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def v4(tmp_path_factory):
    s = Server("--max-tokens", "256", model=str(v4_dir(tmp_path_factory.mktemp("dsml-v4"))))
    yield s
    s.stop()


def test_tokenize_renders_deepseeks_published_tool_conversation_as_its_encoder(v32):
    # The server reads an OpenAI `developer` message as `system` (OpenAI's meaning of the role),
    # which the encoder renders differently: those cases are checked in the engine test only.
    cases = [c for c in GOLDEN["cases"] if all(m["role"] != "developer" for m in c["messages"])]
    assert len(cases) >= 5
    for case in cases:
        body = {"messages": case["messages"], "add_generation_prompt": True,
                "chat_template_kwargs": {"thinking": case["thinking"]}}
        if case["tools"]:
            body["tools"] = case["tools"]
        status, out = post(v32, "/tokenize", body)
        if "error" in case:
            assert status == 400, (case["name"], out)
            continue
        assert status == 200, (case["name"], out)
        assert out["tokens"] == case["ids"], case["name"]


def test_tokenize_renders_v4_conversations_as_its_encoder(v4):
    assert len(GOLDEN_V4["cases"]) >= 10
    for case in GOLDEN_V4["cases"]:
        kwargs = {"thinking": case["thinking"]}
        if case["reasoning_effort"]:
            kwargs["reasoning_effort"] = case["reasoning_effort"]
        body = {"messages": case["messages"], "add_generation_prompt": True, "chat_template_kwargs": kwargs}
        if case["tools"]:
            body["tools"] = case["tools"]
        status, out = post(v4, "/tokenize", body)
        assert status == 200, (case["name"], out)
        assert out["tokens"] == case["ids"], case["name"]


def test_v4_reasoning_effort_is_its_encoders_thinking_mode(v4):
    messages = [{"role": "user", "content": "Prove it."}]
    by_kwargs = {c["name"]: c["ids"] for c in GOLDEN_V4["cases"]}
    status, out = post(v4, "/tokenize", {"messages": [{"role": "system", "content": "S"}] + messages,
                                         "reasoning_effort": "max"})
    assert status == 200 and out["tokens"] == by_kwargs["effort_max"], out
    status, out = post(v4, "/tokenize", {"messages": messages, "reasoning_effort": "high"})
    assert status == 200 and out["tokens"] == by_kwargs["effort_high_is_no_preamble"], out
    status, out = post(v4, "/tokenize", {"messages": messages, "reasoning_effort": "low"})
    assert status == 400, out


@pytest.mark.parametrize("which", ["v32", "v4"])
def test_forced_dsml_calls_come_back_schema_valid_and_auto_leaves_no_markup(which, request):
    server = request.getfixturevalue(which)
    c, m = server.client(), server.model_id()
    messages = [{"role": "user", "content": "What is the weather?"}]
    for choice, parallel in [("required", False), ("required", True),
                             ({"type": "function", "function": {"name": "get_time"}}, False)]:
        r = c.chat.completions.create(model=m, messages=messages, tools=TOOLS, tool_choice=choice,
                                      parallel_tool_calls=parallel, max_tokens=256, temperature=0)
        msg = r.choices[0].message
        assert msg.tool_calls, (choice, msg)
        if not parallel:
            assert len(msg.tool_calls) == 1
        for call in msg.tool_calls:
            check_call(call)
        assert "DSML" not in (msg.content or "")
        # With parallel calls a tiny random model may go on calling until max_tokens: the complete
        # calls come back and the cut-off one is withheld (finish_reason length).
        allowed = ("stop",) if isinstance(choice, dict) else ("tool_calls", "length") if parallel else ("tool_calls",)
        assert r.choices[0].finish_reason in allowed, (choice, parallel, r)
    r = c.chat.completions.create(model=m, messages=messages, tools=TOOLS, tool_choice="auto",
                                  max_tokens=48, temperature=0)
    assert "DSML" not in (r.choices[0].message.content or "")
    labels = dict(endpoint="chat_completions", format="dsml")
    assert server.metric("deltafin_tool_calls_total", **labels, outcome="parsed") >= 3


@pytest.mark.parametrize("which", ["v32", "v4"])
def test_a_two_round_tool_conversation_renders_and_answers(which, request):
    server = request.getfixturevalue(which)
    c, m = server.client(), server.model_id()
    messages = [{"role": "user", "content": "Time?"}]
    # The tiny vocabulary spells a DSML call in up to about 200 tokens.
    r = c.chat.completions.create(model=m, messages=messages, tools=TOOLS, tool_choice="required",
                                  parallel_tool_calls=False, max_tokens=256, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "12:00"}]
    r = c.chat.completions.create(model=m, messages=messages, tools=TOOLS, tool_choice="none",
                                  max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("make_dir", [v32_dir, v4_dir])
def test_drafts_never_change_the_ids_or_the_dsml_calls(tmp_path, make_dir):
    """n-gram drafting gives the same ids and calls."""
    outs = outputs_without_and_with_drafts(lambda spec: make_dir(tmp_path / spec), max_tokens=256)
    assert outs[0] == outs[1]
    assert any(calls for _, calls, _, _ in outs[0]), "forced calls came back"
