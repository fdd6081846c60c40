"""Fixtures of the envtest tier: a real kube-apiserver (KUBECONFIG), the chart installed with the
real helm, the CRD applied with the real kubectl, and the real deltafin-operator binary running
under the chart's RBAC. scripts/test-operator-envtest sets the environment; every variable below is
required (a missing tool fails the run, it is never skipped).
"""

import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "deltafin"
# The release whose ClusterRole the operator runs under (rendered from the chart, applied with
# kubectl, so it outlives the `deltafin` release that test_helm.py uninstalls).
RBAC_RELEASE, RBAC_NS = "envtest", "deltafin-envtest"
OPERATOR_SA = "envtest-deltafin-operator"
# The chart release installed with helm (its operator Deployment never runs: no kubelet).
RELEASE, RELEASE_NS = "deltafin", "deltafin-system"


def required_env(name):
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run scripts/test-operator-envtest")
    return value


def wait_for(fn, timeout=30.0, what="condition", interval=0.2):
    """Polls `fn` until it returns a truthy value; fails with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Kube:
    """kubectl with a kubeconfig; JSON in and out."""

    def __init__(self, kubectl, kubeconfig):
        self.kubectl = kubectl
        self.env = dict(os.environ, KUBECONFIG=kubeconfig)

    def run(self, *args, stdin=None, check=True):
        r = subprocess.run([self.kubectl, *args], input=stdin, capture_output=True, text=True, env=self.env)
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def get(self, kind, name, ns=None):
        args = ["get", kind, name, "-o", "json"] + (["-n", ns] if ns else [])
        r = self.run(*args, check=False)
        if r.returncode != 0:
            if "NotFound" in r.stderr or "not found" in r.stderr:
                return None
            raise AssertionError(f"kubectl get {kind}/{name}: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def list(self, kind, ns=None, selector=None):
        args = ["get", kind, "-o", "json"] + (["-n", ns] if ns else ["-A"])
        if selector:
            args += ["-l", selector]
        return json.loads(self.run(*args).stdout)["items"]

    def apply(self, obj, *flags):
        return self.run("apply", "-f", "-", *flags, stdin=yaml.safe_dump(obj))

    def patch(self, kind, name, ns, patch, kind_of_patch="merge", subresource=None):
        args = ["patch", kind, name, "-n", ns, "--type", kind_of_patch, "-p", json.dumps(patch)]
        if subresource:
            args += ["--subresource", subresource]
        return self.run(*args)

    def create_namespace(self, ns):
        self.run("create", "namespace", ns)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_metrics(text):
    """OpenMetrics text -> {'name{labels}': value} (labels as written, sorted by the encoder)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            pass
    return out


class Operator:
    """The deltafin-operator binary, run against the API server as the chart's ServiceAccount."""

    def __init__(self, binary, kubeconfig, workdir):
        self.binary, self.kubeconfig, self.workdir = binary, kubeconfig, Path(workdir)
        self.proc = None
        self.port = None
        self.starts = 0

    def start(self):
        self.port = free_port()
        self.starts += 1
        self.log_path = self.workdir / f"operator-{self.starts}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DELTAFIN_")}
        env["KUBECONFIG"] = self.kubeconfig
        self.proc = subprocess.Popen(
            [self.binary, "run", "--metrics-addr", f"127.0.0.1:{self.port}", "--pod-name", "envtest",
             "--log", os.environ.get("DELTAFIN_ENVTEST_OPERATOR_LOG", "info,kube=warn")],
            stdout=subprocess.DEVNULL, stderr=open(self.log_path, "w"), env=env)
        wait_for(self._ready, timeout=30, what=f"operator /readyz (log {self.log_path})")

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return parse_metrics(r.read().decode())

    def log(self):
        return self.log_path.read_text() if self.log_path.exists() else ""


def server_version(kube):
    v = json.loads(kube.run("version", "-o", "json").stdout)["serverVersion"]
    minor = int(re.match(r"\d+", v["minor"]).group(0))
    return int(v["major"]), minor, v["gitVersion"]


def helm(*args, check=True):
    r = subprocess.run([required_env("DELTAFIN_HELM"), *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {r.stderr.strip()}")
    return r


def token_kubeconfig(kube, path):
    """A kubeconfig for the chart's operator ServiceAccount: same server and CA, a bound token."""
    admin = json.loads(kube.run("config", "view", "--raw", "--minify", "-o", "json").stdout)
    token = kube.run("create", "token", OPERATOR_SA, "-n", RBAC_NS, "--duration", "3h").stdout.strip()
    cfg = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": OPERATOR_SA, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": admin["clusters"][0]["name"], "user": OPERATOR_SA}}],
        "current-context": "operator",
    }
    Path(path).write_text(yaml.safe_dump(cfg))
    os.chmod(path, 0o600)
    return path


@pytest.fixture(scope="session")
def kube():
    return Kube(required_env("DELTAFIN_KUBECTL"), required_env("KUBECONFIG"))


@pytest.fixture(scope="session")
def version(kube):
    return server_version(kube)


@pytest.fixture(scope="session")
def release(kube, version):
    """`helm install` of the chart with a model enabled: on a first install the DeltafinModel API
    does not exist yet, so the model is not created (NOTES.txt says so; test_helm.py upgrades)."""
    # The release's own operator must not run beside the binary under test where a kubelet
    # exists (your own cluster): its image points nowhere. On envtest nothing runs anyway.
    out = helm("install", RELEASE, str(CHART), "-n", RELEASE_NS, "--create-namespace",
               "--set", "image.repository=example.invalid/deltafin-operator-not-under-test",
               "--set", "model.enabled=true", "--set", "model.name=chart-model",
               "--set", "model.spec.storage.pvc.size=1Gi").stdout
    kube.run("wait", "--for=condition=Established", "crd/deltafinmodels.deltafin.dev", "--timeout=30s")
    return out


@pytest.fixture(scope="session")
def crd(kube, version, release):
    """The CRD the way kubectl users install it: helm template | kubectl apply --server-side."""
    # Rendered as the release `deltafin` so both managers set the same labels (no apply conflict).
    rendered = helm("template", RELEASE, str(CHART), "-n", RELEASE_NS, "--show-only", "templates/crd.yaml",
                    "--kube-version", version[2]).stdout
    r = kube.run("apply", "--server-side", "--force-conflicts", "--field-manager=deltafin-envtest",
                 "-f", "-", stdin=rendered)
    assert "serverside-applied" in r.stdout, r.stdout
    return yaml.safe_load(rendered)


# A stand-in for the Prometheus Operator's ServiceMonitor CRD (the real one is ~1 MB of schema):
# the same group, version, kind and scope, with the spec kept as given. Installed only where no
# ServiceMonitor CRD exists, so the operator's ServiceMonitor path (discovery at start, a dynamic
# reflector, server-side apply, delete) runs against the API server too.
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "ServiceMonitor", "listKind": "ServiceMonitorList", "plural": "servicemonitors",
                       "singular": "servicemonitor"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object",
                 "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]},
}


@pytest.fixture(scope="session")
def service_monitor_crd(kube):
    if kube.get("crd", "servicemonitors.monitoring.coreos.com") is None:
        kube.apply(SERVICE_MONITOR_CRD)
        kube.run("wait", "--for=condition=Established", "crd/servicemonitors.monitoring.coreos.com", "--timeout=30s")


@pytest.fixture(scope="session")
def operator(kube, crd, service_monitor_crd, tmp_path_factory):
    """The operator binary under the chart's ClusterRole (a ServiceAccount token, not the admin)."""
    kube.run("create", "namespace", RBAC_NS, check=False)
    rbac = helm("template", RBAC_RELEASE, str(CHART), "-n", RBAC_NS,
                "--show-only", "templates/rbac.yaml", "--show-only", "templates/serviceaccount.yaml").stdout
    kube.run("apply", "-n", RBAC_NS, "-f", "-", stdin=rbac)
    work = tmp_path_factory.mktemp("operator")
    cfg = token_kubeconfig(kube, str(work / "kubeconfig"))
    op = Operator(required_env("DELTAFIN_OPERATOR_BIN"), cfg, work)
    op.start()
    yield op
    log = op.log()
    op.stop()
    if not os.environ.get("DELTAFIN_ENVTEST_STARTED"):
        kube.run("delete", "clusterrole,clusterrolebinding", OPERATOR_SA, check=False)
        kube.run("delete", "namespace", RBAC_NS, "--wait=false", check=False)
    errors = [line for line in log.splitlines() if "forbidden" in line.lower()]
    assert not errors, "the operator was refused by RBAC:\n" + "\n".join(errors[:10])


_counter = [0]


@pytest.fixture
def ns(kube, request):
    """A fresh namespace per test (envtest has no namespace controller, so they are not deleted
    there; on a real cluster they are)."""
    _counter[0] += 1
    name = re.sub(r"[^a-z0-9-]", "-", f"dfe-{_counter[0]}-{request.node.name[5:30].lower()}").strip("-")
    kube.create_namespace(name)
    yield name
    if not os.environ.get("DELTAFIN_ENVTEST_STARTED"):
        kube.run("delete", "namespace", name, "--wait=false", check=False)


class TinyHub:
    """A loopback Hugging Face endpoint serving one repository: the revision listing
    (`/api/models/ORG/REPO/revision/REV`) and its files (`/ORG/REPO/resolve/SHA/FILE`, with
    `Range`), laid out as the Hub serves them (LFS SHA-256 for weights, git blob ids otherwise)."""

    def __init__(self, repo, revision, model_dir):
        import hashlib
        import http.server
        import threading

        files = {p.name: p.read_bytes() for p in sorted(Path(model_dir).iterdir()) if p.is_file()}
        sha = hashlib.sha1(b"".join(n.encode() + b for n, b in files.items())).hexdigest()
        siblings = []
        for name, data in files.items():
            if name.endswith(".safetensors"):
                siblings.append({"rfilename": name, "size": 135, "blobId": "0" * 40,
                                 "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                         "pointerSize": 135}})
            else:
                blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                siblings.append({"rfilename": name, "size": len(data), "blobId": blob})
        listing = json.dumps({"id": repo, "sha": sha, "siblings": siblings}).encode()
        routes = {f"/api/models/{repo}/revision/{rev}": listing for rev in (revision, sha)}
        routes.update({f"/{repo}/resolve/{sha}/{n}": b for n, b in files.items()})
        self.total_bytes, self.files = sum(len(b) for b in files.values()), len(files)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = routes.get(self.path.split("?", 1)[0])
                if body is None:
                    self.send_error(404)
                    return
                m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
                if m:
                    a, b = int(m.group(1)), min(int(m.group(2)), len(body) - 1)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {a}-{b}/{len(body)}")
                    body = body[a:b + 1]
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Cluster:
    """Where the API server is and how to trust it, from the admin kubeconfig."""

    def __init__(self, kube, workdir):
        import base64

        cfg = json.loads(kube.run("config", "view", "--raw", "--minify", "-o", "json").stdout)
        c = cfg["clusters"][0]["cluster"]
        self.server = c["server"]
        self.ca_file = Path(workdir) / "ca.crt"
        if "certificate-authority-data" in c:
            self.ca_file.write_bytes(base64.b64decode(c["certificate-authority-data"]))
        else:
            self.ca_file.write_bytes(Path(c["certificate-authority"]).read_bytes())

    def request(self, method, path, token, body=None, content_type="application/merge-patch+json"):
        """One request with `token`; returns (status, parsed body)."""
        import ssl
        import urllib.error

        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        req = urllib.request.Request(self.server + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


@pytest.fixture(scope="session")
def cluster(kube, tmp_path_factory):
    return Cluster(kube, tmp_path_factory.mktemp("cluster"))


@pytest.fixture(scope="session")
def tiny_hub():
    hub = TinyHub("deltafin-test/tiny-moe", "0123abc", REPO / "engine" / "tests" / "fixtures" / "qwen3")
    yield hub
    hub.close()
