"""The operator's scenarios against a real kube-apiserver, asserted on the API server's objects.

There is no kubelet and no controller-manager: the tests play the Job and Deployment controllers
by writing those objects' status, and owner-reference garbage collection does not run (the tests
check the owner references instead of the deletion).
"""

import copy
import subprocess
import time

import pytest

from conftest import required_env, wait_for

IMAGE = "ghcr.io/deltafin/deltafin:0.1.0"
NEW_IMAGE = "ghcr.io/deltafin/deltafin:0.2.0"
SPEC = {
    "source": {"huggingFace": {"repo": "deltafin-test/tiny-moe", "revision": "0123abc"}},
    "setup": {"mode": "Full"},
    "storage": {"pvc": {"size": "1Gi"}},
}


def model(name, ns, **spec):
    s = copy.deepcopy(SPEC)
    s.update(spec)
    return {"apiVersion": "deltafin.dev/v1alpha1", "kind": "DeltafinModel",
            "metadata": {"name": name, "namespace": ns}, "spec": s}


def condition(obj, type_):
    for c in (obj or {}).get("status", {}).get("conditions", []):
        if c["type"] == type_:
            return c
    return None


def jobs(kube, ns, name, component="setup"):
    return [j for j in kube.list("jobs", ns) if j["metadata"]["name"].startswith(f"{name}-{component}-")]


def wait_job(kube, ns, name, component="setup"):
    found = wait_for(lambda: jobs(kube, ns, name, component), what=f"{component} Job of {ns}/{name}")
    assert len(found) == 1, [j["metadata"]["name"] for j in found]
    return found[0]


def complete_job(kube, ns, job):
    """Plays the Job controller: the Job succeeded."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kube.patch("job", job, ns, {"status": {
        "conditions": [{"type": "Complete", "status": "True", "lastProbeTime": now, "lastTransitionTime": now}],
        "succeeded": 1, "startTime": now, "completionTime": now}}, subresource="status")


def ready_deployment(kube, ns, name):
    """Plays the Deployment controller and kubelet: one ready replica of the current generation."""
    d = kube.get("deployment", name, ns)
    kube.patch("deployment", name, ns, {"status": {
        "observedGeneration": d["metadata"]["generation"], "replicas": 1, "updatedReplicas": 1,
        "readyReplicas": 1, "availableReplicas": 1}}, subresource="status")


def events(kube, ns, name, reason=None):
    out = []
    for e in kube.list("events.events.k8s.io", ns):
        if e.get("regarding", {}).get("name") == name and (reason is None or e.get("reason") == reason):
            out.append(e)
    return out


def serving(kube, ns, name):
    """Creates a model and drives it to Ready; returns the Deployment."""
    kube.apply(model(name, ns))
    complete_job(kube, ns, wait_job(kube, ns, name)["metadata"]["name"])
    wait_for(lambda: kube.get("deployment", name, ns), what="the server Deployment")
    ready_deployment(kube, ns, name)
    wait_for(lambda: (condition(kube.get("dfm", name, ns), "Ready") or {}).get("status") == "True",
             what=f"{ns}/{name} Ready")
    return kube.get("deployment", name, ns)


def test_a_huggingface_model_gets_its_pvc_and_setup_job(kube, operator, ns, version):
    kube.apply(model("tiny", ns))
    pvc = wait_for(lambda: kube.get("pvc", "tiny-weights", ns), what="the weights PVC")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert not pvc["metadata"].get("ownerReferences"), "the weights PVC must outlive the model"
    assert pvc["metadata"]["labels"]["deltafin.dev/model"] == "tiny"

    job = wait_job(kube, ns, "tiny")
    cr = kube.get("dfm", "tiny", ns)
    assert "deltafin.dev/cleanup" in cr["metadata"]["finalizers"]
    owner = job["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("DeltafinModel", cr["metadata"]["uid"], True)
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == IMAGE
    assert c["args"][:3] == ["setup", "--source", "hf://deltafin-test/tiny-moe@0123abc"]
    assert "--full" in c["args"]
    weights = next(m for m in c["volumeMounts"] if m["name"] == "weights")
    assert weights["mountPath"] == "/weights" and not weights.get("readOnly", False), weights
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "tiny-weights"
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    if version[:2] < (1, 26):
        assert "podFailurePolicy" not in job["spec"], "1.20-1.25 do not serve podFailurePolicy"
        said = wait_for(lambda: events(kube, ns, "tiny", "KubernetesFieldsOmitted"), what="the version event")
        assert len(said) == 1 and said[0]["type"] == "Warning"
        assert "podFailurePolicy" in said[0]["note"], said[0]["note"]
    else:
        assert job["spec"]["podFailurePolicy"]["rules"][0]["action"] == "Ignore"
        assert not events(kube, ns, "tiny", "KubernetesFieldsOmitted")


def test_job_complete_brings_deployment_service_and_ready_status(kube, operator, ns):
    kube.apply(model("tiny", ns))
    job = wait_job(kube, ns, "tiny")["metadata"]["name"]
    cr = wait_for(lambda: kube.get("dfm", "tiny", ns).get("status", {}).get("phase") == "Downloading"
                  and kube.get("dfm", "tiny", ns), what="phase Downloading")
    w = condition(cr, "WeightsReady")
    assert (w["status"], w["reason"]) == ("False", "Downloading")
    assert cr["status"]["observedGeneration"] == cr["metadata"]["generation"]
    assert kube.get("deployment", "tiny", ns) is None, "no server before the weights are installed"

    complete_job(kube, ns, job)
    d = wait_for(lambda: kube.get("deployment", "tiny", ns), what="the Deployment")
    svc = wait_for(lambda: kube.get("service", "tiny", ns), what="the Service")
    assert d["spec"]["strategy"]["type"] == "Recreate"
    assert d["spec"]["replicas"] == 1
    assert d["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    assert svc["spec"]["ports"][0]["port"] == 8000
    marker = kube.get("configmap", "tiny-weights", ns)
    assert marker is not None and not marker["metadata"].get("ownerReferences")
    wait_for(lambda: kube.get("dfm", "tiny", ns)["status"].get("phase") == "Starting", what="phase Starting")

    ready_deployment(kube, ns, "tiny")
    cr = wait_for(lambda: (lambda o: o["status"].get("phase") == "Ready" and o)(kube.get("dfm", "tiny", ns)),
                  what="phase Ready")
    assert condition(cr, "Ready")["status"] == "True"
    assert condition(cr, "WeightsReady")["reason"] == "Installed"
    assert cr["status"]["endpoint"]["url"] == f"http://tiny.{ns}.svc:8000/v1"


@pytest.mark.parametrize("bad, message", [
    ({"device": {"type": "Tpu"}}, "Unsupported value"),
    ({"device": {"type": "Cuda", "gpu": {"count": 0}}}, "should be greater than or equal to 1"),
    ({"source": {"huggingFace": {"revision": "x"}}}, "Required value"),
])
def test_the_api_server_refuses_a_spec_that_breaks_the_schema(kube, operator, ns, bad, message):
    # --validate=false: the refusal must come from the API server, not from kubectl.
    r = kube.run("apply", "--validate=false", "-f", "-", check=False,
                 stdin=__import__("yaml").safe_dump(model("bad", ns, **bad)))
    assert r.returncode != 0, f"accepted: {r.stdout}"
    assert message in r.stderr, r.stderr
    assert kube.get("dfm", "bad", ns) is None


def test_an_image_upgrade_changes_the_deployment_without_a_new_setup_job(kube, operator, ns):
    serving(kube, ns, "tiny")
    setup = jobs(kube, ns, "tiny")
    kube.patch("dfm", "tiny", ns, {"spec": {"image": NEW_IMAGE}})
    pre = wait_job(kube, ns, "tiny", "preflight")
    assert pre["spec"]["template"]["spec"]["containers"][0]["image"] == NEW_IMAGE
    image = lambda: kube.get("deployment", "tiny", ns)["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image() == IMAGE, "the old image keeps serving until the pre-flight passes"
    complete_job(kube, ns, pre["metadata"]["name"])
    wait_for(lambda: image() == NEW_IMAGE, what="the Deployment on the new image")
    after = jobs(kube, ns, "tiny")
    assert [j["metadata"]["uid"] for j in after] == [j["metadata"]["uid"] for j in setup], "no new setup Job"


def test_a_deleted_service_and_a_hand_edited_deployment_are_repaired(kube, operator, ns):
    serving(kube, ns, "tiny")
    uid = kube.get("service", "tiny", ns)["metadata"]["uid"]
    kube.run("delete", "service", "tiny", "-n", ns)
    wait_for(lambda: (kube.get("service", "tiny", ns) or {}).get("metadata", {}).get("uid") not in (None, uid),
             timeout=15, what="the Service re-created")

    kube.patch("deployment", "tiny", ns, {"spec": {"replicas": 3, "template": {"spec": {"containers": [
        {"name": "server", "image": "example.invalid/other:1"}]}}}}, kind_of_patch="strategic")
    def repaired():
        d = kube.get("deployment", "tiny", ns)
        return d["spec"]["replicas"] == 1 and d["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    wait_for(repaired, timeout=15, what="the Deployment repaired (replicas 1, the operator's image)")


def test_paused_scales_the_server_to_zero(kube, operator, ns):
    serving(kube, ns, "tiny")
    kube.patch("dfm", "tiny", ns, {"spec": {"paused": True}})
    wait_for(lambda: kube.get("deployment", "tiny", ns)["spec"]["replicas"] == 0, what="replicas 0")
    cr = wait_for(lambda: (lambda o: o["status"].get("phase") == "Paused" and o)(kube.get("dfm", "tiny", ns)),
                  what="phase Paused")
    assert condition(cr, "ServerReady")["reason"] == "Paused"


def test_delete_runs_the_finalizer_and_keeps_the_weights(kube, operator, ns):
    d = serving(kube, ns, "tiny")
    uid = kube.get("dfm", "tiny", ns)["metadata"]["uid"]
    kube.run("delete", "dfm", "tiny", "-n", ns, "--wait=false")
    wait_for(lambda: kube.get("dfm", "tiny", ns) is None, what="the finalizer to let the model go")
    pvc = kube.get("pvc", "tiny-weights", ns)
    assert pvc is not None and pvc["metadata"].get("deletionTimestamp") is None, "retain: the PVC stays"
    assert kube.get("configmap", "tiny-weights", ns) is not None, "retain: the marker stays"
    assert events(kube, ns, "tiny", "WeightsRetained")
    # No garbage collector here: the owned children carry the owner reference it would follow.
    assert d["metadata"]["ownerReferences"][0]["uid"] == uid


def test_a_restart_mid_setup_resumes_without_a_second_job(kube, operator, ns):
    kube.apply(model("tiny", ns))
    job = wait_job(kube, ns, "tiny")
    operator.stop()
    operator.start()
    wait_for(lambda: operator.metrics().get("deltafin_operator_reconciliations_total", 0) >= 1,
             what="a reconcile after the restart")
    complete_job(kube, ns, job["metadata"]["name"])
    wait_for(lambda: kube.get("deployment", "tiny", ns), what="the Deployment after the restart")
    assert [j["metadata"]["uid"] for j in jobs(kube, ns, "tiny")] == [job["metadata"]["uid"]]


def test_two_models_in_two_namespaces_stay_independent(kube, operator, ns):
    other = ns + "-b"
    kube.create_namespace(other)
    kube.apply(model("tiny", ns))
    kube.apply(model("tiny", other))
    a, b = wait_job(kube, ns, "tiny"), wait_job(kube, other, "tiny")
    complete_job(kube, ns, a["metadata"]["name"])
    wait_for(lambda: kube.get("deployment", "tiny", ns), what="the Deployment in the first namespace")
    time.sleep(2)
    assert kube.get("deployment", "tiny", other) is None
    assert kube.get("dfm", "tiny", other)["status"]["phase"] == "Downloading"
    kube.run("delete", "dfm", "tiny", "-n", ns, "--wait=false")
    wait_for(lambda: kube.get("dfm", "tiny", ns) is None, what="the first model deleted")
    assert kube.get("dfm", "tiny", other)["metadata"].get("deletionTimestamp") is None
    assert [j["metadata"]["uid"] for j in jobs(kube, other, "tiny")] == [b["metadata"]["uid"]]


RECONCILES = "deltafin_operator_reconciliations_total"


def api_requests(metrics):
    """{(verb, resource): count} from deltafin_operator_api_requests_total."""
    out = {}
    for key, value in metrics.items():
        if key.startswith("deltafin_operator_api_requests_total{"):
            labels = dict(p.split("=", 1) for p in key[key.index("{") + 1:-1].split(","))
            out[(labels["verb"].strip('"'), labels["resource"].strip('"'))] = value
    return out


def settle(operator, quiet=1.5):
    """Waits until no reconcile started for `quiet` seconds."""
    last, since = None, time.monotonic()
    while time.monotonic() - since < quiet:
        now = operator.metrics().get(RECONCILES, 0)
        if now != last:
            last, since = now, time.monotonic()
        time.sleep(0.2)


def test_a_no_op_reconcile_reads_only_caches_and_changes_no_resource_version(kube, operator, ns):
    serving(kube, ns, "tiny")
    rvs = lambda: {k: kube.get(k, "tiny", ns)["metadata"]["resourceVersion"]
                   for k in ("deployment", "service", "servicemonitor")}
    for attempt in range(5):
        settle(operator)
        before, m0 = rvs(), operator.metrics()
        # Any change to the model triggers a reconcile; an annotation changes nothing it plans.
        kube.run("annotate", "dfm", "tiny", "-n", ns, f"envtest/poke={attempt}", "--overwrite")
        wait_for(lambda: operator.metrics().get(RECONCILES, 0) > m0.get(RECONCILES, 0), what="the reconcile")
        settle(operator, quiet=1.0)
        m1 = operator.metrics()
        if m1[RECONCILES] - m0[RECONCILES] == 1:  # nothing else (a requeue elsewhere) ran
            break
    else:
        raise AssertionError("could not isolate one reconcile")
    a0, a1 = api_requests(m0), api_requests(m1)
    # Watches feed the caches (a reconnect may fall in the window); they are not reconcile reads.
    delta = {k: a1[k] - a0.get(k, 0) for k in a1 if a1[k] != a0.get(k, 0) and k[0] != "watch"}
    print(f"API requests of one no-op reconcile: {delta}")
    reads = {k: v for k, v in delta.items() if k[0] in ("get", "list", "log")}
    assert not reads, f"reads beyond the caches: {reads}"
    # The cached server objects already hold everything the operator would apply: no write.
    # (A hand edit makes them differ and is repaired: test_a_deleted_service_and_a_hand_edited_...)
    assert delta == {}, delta
    assert rvs() == before, "a no-op reconcile must not change a resourceVersion"
    # The operator's own metrics, as Prometheus scrapes them.
    assert m1["deltafin_operator_last_success_timestamp_seconds"] >= time.time() - 60
    assert m1["deltafin_operator_reconcile_duration_seconds_count"] >= m1[RECONCILES] - 1
    assert m1['deltafin_operator_writes_total{kind="Deployment"}'] >= 1
    # Settled: nothing waits in the reconcile queue (every model's next run is a future requeue).
    assert m1["deltafin_operator_queue_depth"] == 0, m1["deltafin_operator_queue_depth"]


def fail_job(kube, ns, job, container, terminated):
    """Plays the kubelet and the Job controller: the Job's pod failed with `terminated`, then the
    Job failed."""
    labels = dict(job["spec"]["template"]["metadata"]["labels"], **{"job-name": job["metadata"]["name"]})
    pod = job["metadata"]["name"] + "-x1"
    kube.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": ns, "labels": labels},
                "spec": {"restartPolicy": "Never", "containers": [{"name": container, "image": "example.invalid/x"}]}})
    kube.patch("pod", pod, ns, {"status": {"phase": "Failed", "containerStatuses": [{
        "name": container, "image": "example.invalid/x", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": terminated}}]}}, subresource="status")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kube.patch("job", job["metadata"]["name"], ns, {"status": {"failed": 1, "startTime": now, "conditions": [{
        "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit",
        "lastProbeTime": now, "lastTransitionTime": now}]}}, subresource="status")


def test_a_failed_preflight_keeps_the_old_image_and_says_why(kube, operator, ns):
    serving(kube, ns, "tiny")
    kube.patch("dfm", "tiny", ns, {"spec": {"image": NEW_IMAGE}})
    fail_job(kube, ns, wait_job(kube, ns, "tiny", "preflight"), "preflight",
             {"exitCode": 1, "reason": "Error", "message": "error: layout version 3 is newer than this image understands"})
    cr = wait_for(lambda: (lambda o: (condition(o, "Upgrading") or {}).get("reason") == "PreflightFailed" and o)(
        kube.get("dfm", "tiny", ns)), what="Upgrading=False PreflightFailed")
    assert "layout version 3" in condition(cr, "Upgrading")["message"]
    assert cr["status"]["lastFailure"]["exitCode"] == 1
    assert condition(cr, "Ready")["status"] == "True", "the old image keeps serving"
    assert kube.get("deployment", "tiny", ns)["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    said = wait_for(lambda: events(kube, ns, "tiny", "PreflightFailed"), what="the PreflightFailed event")
    assert said[0]["type"] == "Warning"


def test_retain_policy_delete_removes_the_claim_and_the_marker(kube, operator, ns):
    kube.apply(model("tiny", ns, storage={"pvc": {"size": "1Gi"}, "retainPolicy": "Delete"}))
    complete_job(kube, ns, wait_job(kube, ns, "tiny")["metadata"]["name"])
    wait_for(lambda: kube.get("configmap", "tiny-weights", ns), what="the marker")
    kube.run("delete", "dfm", "tiny", "-n", ns, "--wait=false")
    wait_for(lambda: kube.get("dfm", "tiny", ns) is None, what="the model deleted")
    assert kube.get("configmap", "tiny-weights", ns) is None
    pvc = kube.get("pvc", "tiny-weights", ns)
    # No pvc-protection controller here: the claim stays Terminating instead of going away.
    assert pvc is None or pvc["metadata"].get("deletionTimestamp"), pvc
    assert events(kube, ns, "tiny", "WeightsDeleted")


def test_a_new_revision_replaces_the_setup_job_while_the_old_server_keeps_serving(kube, operator, ns):
    serving(kube, ns, "tiny")
    old = jobs(kube, ns, "tiny")[0]["metadata"]["name"]
    kube.patch("dfm", "tiny", ns, {"spec": {"source": {"huggingFace": {"revision": "4567def"}}}})
    new = wait_for(lambda: [j for j in jobs(kube, ns, "tiny") if j["metadata"]["name"] != old], what="the new setup Job")
    assert "hf://deltafin-test/tiny-moe@4567def" in new[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    wait_for(lambda: kube.get("job", old, ns) is None, what="the outdated Job deleted")
    cr = wait_for(lambda: (lambda o: condition(o, "Ready")["status"] == "False" and o)(kube.get("dfm", "tiny", ns)),
                  what="Ready=False while downloading")
    assert "previous install keeps serving" in condition(cr, "Ready")["message"]
    assert kube.get("deployment", "tiny", ns)["spec"]["replicas"] == 1


def test_a_model_waiting_for_its_existing_claim_starts_when_the_claim_appears(kube, operator, ns):
    kube.apply(model("tiny", ns, storage={"existingClaim": {"name": "mine"}}))
    wait_for(lambda: (condition(kube.get("dfm", "tiny", ns), "WeightsReady") or {}).get("reason") == "AwaitingStorage",
             what="WeightsReady AwaitingStorage")
    assert not jobs(kube, ns, "tiny"), "no Job before the claim exists"
    kube.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "mine", "namespace": ns},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    # The claim's watch wakes the model (not the 5-minute idle requeue).
    job = wait_job(kube, ns, "tiny")
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "mine"


def test_the_service_monitor_follows_the_model(kube, operator, ns):
    serving(kube, ns, "tiny")
    sm = wait_for(lambda: kube.get("servicemonitor", "tiny", ns), what="the ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "http"
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [ns]
    assert sm["metadata"]["ownerReferences"][0]["kind"] == "DeltafinModel"
    kube.patch("dfm", "tiny", ns, {"spec": {"metrics": {"serviceMonitor": "Disabled"}}})
    wait_for(lambda: kube.get("servicemonitor", "tiny", ns) is None, what="the ServiceMonitor deleted")


def test_a_setup_failure_reports_its_cause(kube, operator, ns):
    kube.apply(model("tiny", ns))
    fail_job(kube, ns, wait_job(kube, ns, "tiny"), "setup",
             {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-01-01T02:00:00Z"})
    cr = wait_for(lambda: (lambda o: o.get("status", {}).get("phase") == "Failed" and o)(kube.get("dfm", "tiny", ns)),
                  what="phase Failed")
    w = condition(cr, "WeightsReady")
    assert (w["status"], w["reason"]) == ("False", "OOMKilled"), w
    assert "delete the Job to retry" in w["message"]
    f = cr["status"]["lastFailure"]
    assert (f["component"], f["exitCode"]) == ("setup", 137)
    assert kube.get("deployment", "tiny", ns) is None


def test_a_crashing_server_is_reported_as_the_last_failure(kube, operator, ns):
    d = serving(kube, ns, "tiny")
    labels = d["spec"]["template"]["metadata"]["labels"]
    kube.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tiny-5d9c-xyz", "namespace": ns, "labels": labels},
                "spec": {"containers": [{"name": "server", "image": IMAGE}]}})
    kube.patch("pod", "tiny-5d9c-xyz", ns, {"status": {"phase": "Running", "containerStatuses": [{
        "name": "server", "image": IMAGE, "imageID": "", "ready": False, "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-01-01T03:00:00Z"}}}]}},
        subresource="status")
    kube.patch("deployment", "tiny", ns, {"status": {"readyReplicas": 0, "availableReplicas": 0}}, subresource="status")
    cr = wait_for(lambda: (lambda o: (condition(o, "ServerReady") or {}).get("reason") == "OOMKilled" and o)(
        kube.get("dfm", "tiny", ns)), what="ServerReady=False OOMKilled")
    assert cr["status"]["phase"] == "Failed"
    f = cr["status"]["lastFailure"]
    assert (f["component"], f["reason"], f["exitCode"]) == ("server", "OOMKilled", 137)


def test_the_setup_reports_progress_to_the_model_status_under_its_own_role(
        kube, operator, ns, cluster, tiny_hub, tmp_path):
    """The real `deltafin setup`, run as the Job would run it (its arguments, and a token of the
    model's `<name>-setup` ServiceAccount), downloads from a loopback Hub and patches
    `status.setupProgress`; the operator sees it through its watch and shows it, reading no log.
    That token can patch this model's status and nothing else."""
    kube.apply(model("tiny", ns))
    kube.apply(model("other", ns))
    job = wait_job(kube, ns, "tiny")
    for kind in ("serviceaccount", "role", "rolebinding"):
        wait_for(lambda: kube.get(kind, "tiny-setup", ns), what=f"{kind} tiny-setup")
    pod = job["spec"]["template"]["spec"]
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == ("tiny-setup", True)
    args = pod["containers"][0]["args"]
    at = args.index("--report-status")
    assert args[at:at + 4] == ["--report-status", f"{ns}/tiny", "--report-job", job["metadata"]["name"]], args
    token = kube.run("create", "token", "tiny-setup", "-n", ns, "--duration", "1h").stdout.strip()
    token_file = tmp_path / "token"
    token_file.write_text(token)
    dir_at = args.index("--dir")
    args = args[:dir_at + 1] + [str(tmp_path / "weights")] + args[dir_at + 2:]
    r = subprocess.run([required_env("DELTAFIN_BIN"), *args, "--kube-api", cluster.server,
                        "--kube-token-file", str(token_file), "--kube-ca-file", str(cluster.ca_file),
                        "--endpoint", tiny_hub.url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "status report" not in r.stderr, r.stderr
    report = kube.get("dfm", "tiny", ns)["status"]["setupProgress"]
    assert report == {"job": job["metadata"]["name"], "phase": "done", "bytesDone": tiny_hub.total_bytes,
                      "bytesTotal": tiny_hub.total_bytes, "filesDone": tiny_hub.files,
                      "filesTotal": tiny_hub.files, "message": report["message"]}, report
    weights = wait_for(lambda: (kube.get("dfm", "tiny", ns)["status"].get("weights") or {}).get("percent") == 100
                       and kube.get("dfm", "tiny", ns)["status"]["weights"], what="the report in status.weights")
    assert (weights["stage"], weights["bytesTotal"]) == ("done", tiny_hub.total_bytes), weights
    assert not [k for k in api_requests(operator.metrics()) if k[0] == "log"], "no pod log is read"
    # The operator's status writes keep the Job's field.
    assert kube.get("dfm", "tiny", ns)["status"]["setupProgress"]["phase"] == "done"
    # The setup token: this model's status only.
    base = f"/apis/deltafin.dev/v1alpha1/namespaces/{ns}/deltafinmodels"
    patch = {"status": {"setupProgress": {"job": "x", "phase": "download"}}}
    assert cluster.request("PATCH", f"{base}/other/status", token, patch)[0] == 403
    assert cluster.request("PATCH", f"{base}/tiny", token, {"spec": {"paused": True}})[0] == 403
    assert cluster.request("GET", f"{base}/tiny", token)[0] == 403
    assert cluster.request("GET", f"/api/v1/namespaces/{ns}/pods", token)[0] == 403
    assert cluster.request("PATCH", f"{base}/tiny/status", token, patch)[0] == 200


def test_a_new_model_reuses_the_retained_weights_without_a_download(kube, operator, ns):
    kube.apply(model("tiny", ns))
    job = wait_job(kube, ns, "tiny")["metadata"]["name"]
    complete_job(kube, ns, job)
    wait_for(lambda: kube.get("deployment", "tiny", ns), what="the first install serving")
    kube.run("delete", "dfm", "tiny", "-n", ns, "--wait=false")
    wait_for(lambda: kube.get("dfm", "tiny", ns) is None, what="the model deleted")
    # Play the garbage collector: the owned children go with their owner.
    kube.run("delete", "job", job, "-n", ns, "--ignore-not-found")
    kube.run("delete", "deployment,service", "tiny", "-n", ns, "--ignore-not-found")

    kube.apply(model("tiny", ns))
    wait_for(lambda: kube.get("deployment", "tiny", ns), what="the server, straight from the retained weights")
    cr = kube.get("dfm", "tiny", ns)
    assert condition(cr, "WeightsReady")["reason"] == "Installed"
    assert not jobs(kube, ns, "tiny"), "no setup Job: the marker and the same claim prove the install"
