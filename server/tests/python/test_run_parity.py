"""`deltafin run` and `deltafin serve` are one program: the same request gives the same prompt
ids and the same output ids, with seeded sampling, presence/frequency/repetition penalties,
logit bias and a JSON schema. The server's ids come from `return_token_ids` (vLLM's extension);
`run --json` prints its own."""

import json
import os
import subprocess

import httpx
import jsonschema
import pytest

from conftest import BIN, MODEL

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
CASES = [
    dict(temperature=0.0),
    dict(temperature=0.9, top_p=0.9, seed=7, presence_penalty=0.6, frequency_penalty=0.4, logit_bias={"65": 4.0, "101": -100.0}),
    dict(temperature=0.7, seed=3, repetition_penalty=1.3),
]


def run_cli(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTAFIN_")}
    out = subprocess.run(
        [BIN, "--threads", "2", "run", "--model", MODEL, "--json", *args],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def flags(case):
    out = []
    for key, value in case.items():
        if key == "logit_bias":
            out += ["--logit-bias", ",".join(f"{i}:{b}" for i, b in value.items())]
        else:
            out += ["--" + key.replace("_", "-"), str(value)]
    return out


def post(server, path, body):
    r = httpx.post(server.base + path, json={"model": server.model_id(), "return_token_ids": True, **body}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("case", CASES, ids=["greedy", "sampled-penalties-bias", "repetition"])
def test_run_and_serve_give_the_same_completion_ids(server, case):
    prompt = "Once upon a time, the licence said"
    served = post(server, "/v1/completions", dict(prompt=prompt, max_tokens=20, **case))
    ran = run_cli("--prompt", prompt, "--max-new", "20", *flags(case))
    assert ran["prompt_ids"] == served["prompt_token_ids"]
    assert ran["output_ids"] == served["choices"][0]["token_ids"], (ran["text"], served["choices"][0]["text"])
    assert ran["finish_reason"] == served["choices"][0]["finish_reason"]


def test_run_and_serve_give_the_same_chat_ids_under_a_json_schema(server, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    case = CASES[1]
    message = "Reply in JSON."
    body = dict(
        messages=[{"role": "user", "content": message}],
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
        **case,
    )
    served = post(server, "/v1/chat/completions", body)
    ran = run_cli("--chat", "--prompt", message, "--max-new", "64", "--json-schema", str(schema), *flags(case))
    assert ran["prompt_ids"] == served["prompt_token_ids"]
    assert ran["output_ids"] == served["choices"][0]["token_ids"]
    content = served["choices"][0]["message"]["content"]
    if served["choices"][0]["finish_reason"] == "stop":
        jsonschema.validate(json.loads(content), SCHEMA)


def test_return_token_ids_is_off_by_default(server):
    r = httpx.post(server.base + "/v1/completions", json={"model": server.model_id(), "prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and "prompt_token_ids" not in r.json() and "token_ids" not in r.json()["choices"][0]
