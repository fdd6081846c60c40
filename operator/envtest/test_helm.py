"""The chart installed for real with helm: install, the model on the second upgrade, uninstall.
Runs after test_scenarios.py (scripts/test-operator-envtest passes the files in order): the
uninstall removes the release's CRD ownership, not the CRD.
"""

from conftest import CHART, RELEASE, RELEASE_NS, helm, wait_for


def test_helm_install_creates_the_crd_rbac_and_operator_but_not_yet_the_model(kube, release, version):
    crd = kube.get("crd", "deltafinmodels.deltafin.dev")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert "x-kubernetes-validations" in str(schema) or version[:2] < (1, 25)
    assert kube.get("clusterrole", "deltafin-operator") is not None
    binding = kube.get("clusterrolebinding", "deltafin-operator")
    assert binding["subjects"][0] == {"kind": "ServiceAccount", "name": "deltafin-operator", "namespace": RELEASE_NS}
    assert kube.get("serviceaccount", "deltafin-operator", RELEASE_NS) is not None
    d = kube.get("deployment", "deltafin-operator", RELEASE_NS)
    assert d["spec"]["template"]["spec"]["serviceAccountName"] == "deltafin-operator"
    assert d["spec"]["strategy"]["type"] == "Recreate"
    # First install: the API did not exist when the chart was rendered.
    assert "was NOT created" in release, release
    assert kube.get("dfm", "chart-model", RELEASE_NS) is None


def test_helm_upgrade_creates_the_model_and_uninstall_keeps_crd_and_weights(kube, release, operator):
    out = helm("upgrade", RELEASE, str(CHART), "-n", RELEASE_NS, "--reuse-values").stdout
    assert "watch the download" in out, out
    cr = wait_for(lambda: kube.get("dfm", "chart-model", RELEASE_NS), what="the chart's DeltafinModel")
    assert cr["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    pvc = wait_for(lambda: kube.get("pvc", "chart-model-weights", RELEASE_NS), what="its weights PVC")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "1Gi"

    helm("uninstall", RELEASE, "-n", RELEASE_NS)
    wait_for(lambda: kube.get("dfm", "chart-model", RELEASE_NS) is None, what="the model deleted (finalizer run)")
    assert kube.get("crd", "deltafinmodels.deltafin.dev") is not None, "helm.sh/resource-policy: keep"
    assert kube.get("pvc", "chart-model-weights", RELEASE_NS) is not None, "retain: the weights PVC stays"
    assert kube.get("clusterrole", "deltafin-operator") is None
    assert kube.get("deployment", "deltafin-operator", RELEASE_NS) is None


GROUPS = {"deltafinmodels": "deltafin.dev", "deployments": "apps", "jobs": "batch", "events": "events.k8s.io",
          "servicemonitors": "monitoring.coreos.com", "roles": "rbac.authorization.k8s.io",
          "rolebindings": "rbac.authorization.k8s.io"}
# Granted, needed, and not exercised by this tier (each with its reason).
NOT_EXERCISED = {
    ("deltafin.dev", "deltafinmodels/finalizers", "update"):
        "blockOwnerDeletion owner references, checked only under OwnerReferencesPermissionEnforcement",
    ("events.k8s.io", "events", "patch"): "a repeated event (the recorder patches its series)",
}


def granted_rules(kube):
    rules = set()
    for rule in kube.get("clusterrole", "envtest-deltafin-operator")["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                for verb in rule["verbs"]:
                    rules.add((group, res, verb))
    return rules


def test_the_chart_rbac_is_exactly_what_the_operator_used(kube, operator):
    """Runs last: the operator has run every scenario under the chart's ClusterRole (a refusal
    fails the session); here every grant must have been used, or be listed with its reason."""
    used = set()
    for key, value in operator.metrics().items():
        if not key.startswith("deltafin_operator_api_requests_total{") or value == 0:
            continue
        labels = dict(part.split("=", 1) for part in key[key.index("{") + 1:-1].split(","))
        verb, res = labels["verb"].strip('"'), labels["resource"].strip('"')
        if verb == "discovery":
            continue
        used.add((GROUPS.get(res.split("/")[0], ""), res, verb))
        if verb == "patch" and not res.endswith("/status") and res != "deltafinmodels":
            used.add((GROUPS.get(res, ""), res, "create"))  # a server-side apply that creates
    granted = granted_rules(kube)
    assert used <= granted, f"used but not granted: {sorted(used - granted)}"
    excess = granted - used - set(NOT_EXERCISED)
    assert not excess, f"granted but never used: {sorted(excess)}"
