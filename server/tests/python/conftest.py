"""Fixtures: start the real `deltafin serve` binary on 127.0.0.1 (port 0, the chosen port is
read from its stderr) against a synthetic model, and stop it with SIGTERM afterwards.

Environment (set by server/tests/python_suite.rs): DELTAFIN_BIN (the binary), DELTAFIN_TEST_MODEL
(a tiny synthetic checkpoint with a byte-level Kimi-style tokenizer).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

import openai
import pytest

BIN = os.environ.get("DELTAFIN_BIN", "")
MODEL = os.environ.get("DELTAFIN_TEST_MODEL", "")
K3_MODEL = os.environ.get("DELTAFIN_TEST_K3_MODEL", "")


class Server:
    """One running server process."""

    def __init__(self, *args, model=MODEL, env=None):
        if not BIN or not MODEL:
            pytest.skip("DELTAFIN_BIN / DELTAFIN_TEST_MODEL not set (run through cargo test --test python_suite)")
        cmd = [BIN, "--threads", "2", "serve", "--model", model, "--port", "0", *args]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("DELTAFIN_")}
        full_env.update(env or {})
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=full_env, text=True)
        self.log = []
        self.port = None
        deadline = time.time() + 60
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("server exited early: " + "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if time.time() > deadline:
                raise RuntimeError("server did not start")
        threading.Thread(target=self._drain, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.port}"
        self.wait_ready()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            status, _ = self.get("/readyz")
            if status == 200:
                return
            time.sleep(0.05)
        raise RuntimeError("server never became ready")

    def get(self, path, headers=None):
        req = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metrics(self):
        status, text = self.get("/metrics")
        assert status == 200
        return text

    def metric(self, name, **labels):
        """The value of one sample (0 if absent)."""
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        key = f"{name}{{{want}}}" if labels else name
        for line in self.metrics().splitlines():
            if line.startswith(key + " "):
                return float(line.split()[-1])
        return 0.0

    def client(self, api_key="unused", timeout=120):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0, timeout=timeout)

    def model_id(self):
        return self.client().models.list().data[0].id

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    s = Server("--max-request-bytes", "65536", "--max-tokens", "512")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def k3_server():
    """The built-in default model (Kimi K3 architecture and chat format, random weights)."""
    if not K3_MODEL:
        pytest.skip("DELTAFIN_TEST_K3_MODEL not set (run through cargo test --test python_suite)")
    s = Server("--max-tokens", "1024", model=K3_MODEL)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def thinking_model(tmp_path_factory):
    """A copy of the test model whose chat template opens the thinking (`<think>`) in the
    generation prompt, as Kimi's thinking templates and DeepSeek-R1 do."""
    if not MODEL:
        pytest.skip("DELTAFIN_TEST_MODEL not set")
    dst = tmp_path_factory.mktemp("thinking") / "thinking-model"
    shutil.copytree(MODEL, dst)
    cfg_path = dst / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    tpl = cfg["chat_template"]
    assert "<|im_assistant|>assistant<|im_middle|>{%- endif -%}" in tpl
    cfg["chat_template"] = tpl.replace(
        "<|im_assistant|>assistant<|im_middle|>{%- endif -%}", "<|im_assistant|>assistant<|im_middle|><think>{%- endif -%}"
    )
    cfg_path.write_text(json.dumps(cfg))
    return str(dst)
