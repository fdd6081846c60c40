//! The pure object builders: snapshots of every child of the example models, and the
//! invariants every rendering must keep.

mod support;

use deltafin_operator::crd::{DeltafinModel, SetupMode};
use deltafin_operator::model::{Model, Storage, resolve};
use deltafin_operator::names;
use deltafin_operator::resources;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::Resource;
use serde::Serialize;
use support::{EXAMPLES, assert_snapshot, example, settings};

const IMAGE: &str = "ghcr.io/deltafin/deltafin:0.1.0";
const NEW_IMAGE: &str = "ghcr.io/deltafin/deltafin:0.2.0";

fn yaml<T: Serialize>(docs: &[T]) -> String {
    docs.iter()
        .map(|d| resources::canonical(serde_json::to_value(d).unwrap()))
        .map(|d| format!("---\n{}", serde_yaml::to_string(&d).unwrap()))
        .collect()
}

fn render(m: &Model<'_>) -> String {
    let mut docs: Vec<serde_json::Value> = Vec::new();
    if let Some(p) = resources::pvc(m) {
        docs.push(serde_json::to_value(p).unwrap());
    }
    let marker = resources::Marker {
        key: m.key.clone(),
        image: IMAGE.into(),
        storage_uid: None,
        bytes_total: Some(1),
    };
    docs.push(serde_json::to_value(resources::marker(m, &marker)).unwrap());
    if m.source_uri.is_some() {
        docs.push(serde_json::to_value(resources::setup_service_account(m)).unwrap());
        docs.push(serde_json::to_value(resources::setup_role(m)).unwrap());
        docs.push(serde_json::to_value(resources::setup_role_binding(m)).unwrap());
    }
    docs.push(serde_json::to_value(resources::setup_job(m, &m.image)).unwrap());
    docs.push(serde_json::to_value(resources::preflight_job(m, NEW_IMAGE)).unwrap());
    docs.push(serde_json::to_value(resources::deployment(m, &m.image)).unwrap());
    docs.push(serde_json::to_value(resources::service(m)).unwrap());
    docs.push(serde_json::to_value(resources::service_monitor(m)).unwrap());
    yaml(&docs)
}

#[test]
fn snapshots_of_every_child() {
    let s = settings();
    for name in EXAMPLES {
        let cr = example(name);
        let m = resolve(&cr, &s).expect("example resolves");
        assert_snapshot(&format!("{name}.yaml"), &render(&m));
    }
}

fn pod_specs(m: &Model<'_>) -> Vec<(&'static str, PodSpec)> {
    let d = resources::deployment(m, &m.image);
    let s = resources::setup_job(m, &m.image);
    let p = resources::preflight_job(m, NEW_IMAGE);
    vec![
        ("server", d.spec.unwrap().template.spec.unwrap()),
        ("setup", s.spec.unwrap().template.spec.unwrap()),
        ("preflight", p.spec.unwrap().template.spec.unwrap()),
    ]
}

fn for_each_model(f: impl Fn(&DeltafinModel, &Model<'_>)) {
    let s = settings();
    for name in EXAMPLES {
        let cr = example(name);
        let m = resolve(&cr, &s).unwrap();
        f(&cr, &m);
    }
}

#[test]
fn server_is_one_replica_recreated_never_surged() {
    for_each_model(|_, m| {
        let d = resources::deployment(m, &m.image);
        let spec = d.spec.unwrap();
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(spec.strategy.unwrap().type_.as_deref(), Some("Recreate"));
    });
    let mut cr = example("kimi-k2-pvc");
    cr.spec.paused = true;
    let m = resolve(&cr, &settings()).unwrap();
    assert_eq!(
        resources::deployment(&m, &m.image).spec.unwrap().replicas,
        Some(0),
        "paused scales to zero"
    );
}

#[test]
fn probes_hit_the_server_endpoints() {
    for_each_model(|cr, m| {
        let c = &pod_specs(m)[0].1.containers[0];
        let path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
            p.as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .clone()
                .unwrap()
        };
        assert_eq!(path(&c.readiness_probe), "/readyz");
        assert_eq!(path(&c.liveness_probe), "/livez");
        assert_eq!(path(&c.startup_probe), "/livez");
        let startup = c.startup_probe.as_ref().unwrap();
        let budget = startup.period_seconds.unwrap() * startup.failure_threshold.unwrap();
        let want = cr.spec.server.startup_timeout_seconds.unwrap_or(600);
        assert!(budget >= want, "startup budget {budget}s < {want}s");
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, names::SERVER_PORT);
        assert_eq!(c.ports.as_ref().unwrap()[0].name.as_deref(), Some("http"));
    });
}

/// `account`: the ServiceAccount whose token the pod may mount (the setup reporter), or none.
fn assert_restricted(what: &str, pod: &PodSpec, account: Option<String>) {
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true), "{what}");
    assert_eq!(psc.run_as_user, Some(65532), "{what}");
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault",
        "{what}"
    );
    assert_eq!(
        pod.automount_service_account_token,
        Some(account.is_some()),
        "{what}: no API token in model pods but the setup reporter's"
    );
    assert_eq!(pod.service_account_name, account, "{what}");
    assert_eq!(
        pod.enable_service_links,
        Some(false),
        "{what}: service env vars would collide with DELTAFIN_*"
    );
    for c in &pod.containers {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{what}");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{what}");
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..]),
            "{what}"
        );
        assert!(sc.privileged.is_none(), "{what}");
        // Every writable path is a volume.
        let mounts: Vec<_> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert!(
            mounts.contains(&"/tmp") && mounts.contains(&"/cache"),
            "{what}: {mounts:?}"
        );
    }
}

#[test]
fn every_pod_runs_restricted() {
    for_each_model(|_, m| {
        for (what, pod) in pod_specs(m) {
            let reporter =
                (what == "setup" && m.source_uri.is_some()).then(|| names::setup_reporter(&m.name));
            assert_restricted(what, &pod, reporter);
        }
    });
}

/// The setup pod's token can patch its own model's status and do nothing else.
#[test]
fn the_setup_reporter_may_patch_only_its_models_status() {
    for_each_model(|_, m| {
        let role = resources::setup_role(m);
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        let r = &rules[0];
        assert_eq!(r.api_groups.as_deref(), Some(&["deltafin.dev".to_string()][..]));
        assert_eq!(
            r.resources.as_deref(),
            Some(&["deltafinmodels/status".to_string()][..])
        );
        assert_eq!(r.resource_names.as_deref(), Some(&[m.name.clone()][..]));
        assert_eq!(r.verbs, ["patch"]);
        let b = resources::setup_role_binding(m);
        assert_eq!(b.role_ref.name, names::setup_reporter(&m.name));
        let subject = &b.subjects.unwrap()[0];
        assert_eq!(
            (subject.kind.as_str(), subject.name.as_str()),
            ("ServiceAccount", b.role_ref.name.as_str())
        );
        assert_eq!(subject.namespace.as_deref(), Some(m.namespace.as_str()));
        let sa = resources::setup_service_account(m);
        assert_eq!(
            sa.automount_service_account_token,
            Some(false),
            "mounted only where asked"
        );
        if m.source_uri.is_some() {
            let job = resources::setup_job(m, &m.image);
            let args = job.spec.unwrap().template.spec.unwrap().containers[0]
                .args
                .clone()
                .unwrap();
            let at = args
                .iter()
                .position(|a| a == "--report-status")
                .expect("--report-status");
            assert_eq!(args[at + 1], format!("{}/{}", m.namespace, m.name));
            let at = args
                .iter()
                .position(|a| a == "--report-job")
                .expect("--report-job");
            assert_eq!(args[at + 1], names::setup_job(&m.name, &m.key));
        }
    });
}

fn weights_mount(c: &Container) -> bool {
    c.volume_mounts
        .iter()
        .flatten()
        .find(|v| v.name == "weights")
        .unwrap()
        .read_only
        .unwrap()
}

#[test]
fn weights_are_read_only_for_the_server_in_full_mode_only() {
    for_each_model(|cr, m| {
        let pods = pod_specs(m);
        let server_ro = weights_mount(&pods[0].1.containers[0]);
        assert_eq!(server_ro, cr.spec.setup.mode == SetupMode::Full, "{}", m.name);
        assert!(
            !weights_mount(&pods[1].1.containers[0]),
            "setup writes the weights"
        );
        assert!(weights_mount(&pods[2].1.containers[0]), "pre-flight only reads");
    });
}

#[test]
fn setup_runs_in_its_own_job_never_in_the_serving_pod() {
    for_each_model(|cr, m| {
        let pods = pod_specs(m);
        let server = &pods[0].1.containers[0];
        assert_eq!(server.args.as_ref().unwrap()[0], "serve");
        assert!(
            pods[0].1.init_containers.is_none(),
            "no download in the serving pod"
        );
        let setup = &pods[1].1;
        assert_eq!(setup.restart_policy.as_deref(), Some("Never"));
        let args = setup.containers[0].args.clone().unwrap();
        if cr.spec.source.preloaded.is_some() {
            assert_eq!(args[0], "doctor", "preloaded weights are only checked");
        } else {
            assert_eq!(args[0], "setup");
            assert!(args.contains(&"--progress-file".into()));
            let mode = if cr.spec.setup.mode == SetupMode::Full {
                "--full"
            } else {
                "--stream"
            };
            assert!(args.contains(&mode.into()), "{args:?}");
        }
        let pf = &pods[2].1.containers[0];
        assert_eq!(
            pf.args.as_ref().unwrap()[..2],
            ["doctor".to_string(), "--dir".to_string()]
        );
        assert_eq!(pf.image.as_deref(), Some(NEW_IMAGE));
    });
}

#[test]
fn gpu_limits_and_runtime_class_for_cuda_only() {
    for_each_model(|cr, m| {
        let pod = &pod_specs(m)[0].1;
        let limits = pod.containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        let args = pod.containers[0].args.clone().unwrap_or_default();
        let device = args
            .windows(2)
            .find(|w| w[0] == "--device")
            .map(|w| w[1].as_str());
        assert_eq!(
            device,
            m.gpu.as_ref().map(|_| "cuda"),
            "the server computes where its GPU is"
        );
        match &m.gpu {
            Some(g) => {
                assert_eq!(limits.get(&g.resource_name).map(|q| q.0.as_str()), Some("1"));
                assert_eq!(pod.runtime_class_name, g.runtime_class_name);
                assert!(
                    cr.spec
                        .resources
                        .as_ref()
                        .unwrap()
                        .limits
                        .as_ref()
                        .unwrap()
                        .contains_key("memory")
                );
                assert!(limits.contains_key("memory"), "the spec's limits are kept");
            }
            None => {
                assert!(!limits.keys().any(|k| k.contains("gpu")), "{limits:?}");
                assert!(pod.runtime_class_name.is_none());
            }
        }
        // Setup and pre-flight never hold the GPU.
        for (_, p) in &pod_specs(m)[1..] {
            let l = p.containers[0]
                .resources
                .as_ref()
                .and_then(|r| r.limits.clone())
                .unwrap_or_default();
            assert!(!l.keys().any(|k| k.contains("gpu")));
        }
    });
}

#[test]
fn retained_weights_have_no_owner_everything_else_is_owned() {
    for_each_model(|cr, m| {
        if let Some(p) = resources::pvc(m) {
            assert!(
                resources::owners(&p).is_empty(),
                "weights PVC must outlive the DeltafinModel"
            );
        }
        let mk = resources::Marker {
            key: m.key.clone(),
            image: IMAGE.into(),
            ..Default::default()
        };
        assert!(
            resources::owners(&resources::marker(m, &mk)).is_empty(),
            "marker must outlive it too"
        );
        let uid = cr.meta().uid.clone().unwrap();
        let check =
            |what: &str, owners: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
                assert_eq!(owners.len(), 1, "{what}");
                assert_eq!(owners[0].uid, uid, "{what}");
                assert_eq!(owners[0].controller, Some(true), "{what}");
                assert_eq!(owners[0].kind, "DeltafinModel", "{what}");
            };
        check(
            "deployment",
            resources::owners(&resources::deployment(m, &m.image)),
        );
        check("service", resources::owners(&resources::service(m)));
        check("setup", resources::owners(&resources::setup_job(m, &m.image)));
        check(
            "preflight",
            resources::owners(&resources::preflight_job(m, NEW_IMAGE)),
        );
        check(
            "servicemonitor",
            resources::owners(&resources::service_monitor(m)),
        );
    });
}

#[test]
fn recommended_labels_everywhere_and_selectors_use_immutable_ones() {
    for_each_model(|_, m| {
        let mut metas = vec![
            resources::deployment(m, &m.image).metadata,
            resources::service(m).metadata,
            resources::setup_job(m, &m.image).metadata,
            resources::preflight_job(m, NEW_IMAGE).metadata,
            resources::service_monitor(m).metadata,
        ];
        if let Some(p) = resources::pvc(m) {
            metas.push(p.metadata);
        }
        for meta in metas {
            let l = meta.labels.unwrap();
            for k in [
                "app.kubernetes.io/name",
                "app.kubernetes.io/instance",
                "app.kubernetes.io/component",
                "app.kubernetes.io/part-of",
                "app.kubernetes.io/managed-by",
                names::MODEL_LABEL,
            ] {
                assert!(l.contains_key(k), "{:?} lacks {k}", meta.name);
            }
            assert_eq!(l["app.kubernetes.io/managed-by"], names::MANAGER);
            assert_eq!(l[names::MODEL_LABEL], m.name);
        }
        let d = resources::deployment(m, &m.image).spec.unwrap();
        let sel = d.selector.match_labels.unwrap();
        assert_eq!(
            sel.keys().collect::<Vec<_>>(),
            [
                "app.kubernetes.io/component",
                "app.kubernetes.io/instance",
                "app.kubernetes.io/name"
            ]
        );
        let pod_labels = d.template.metadata.unwrap().labels.unwrap();
        assert!(sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        let svc = resources::service(m).spec.unwrap();
        assert_eq!(svc.selector.unwrap(), sel);
        let port = &svc.ports.unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.port),
            (Some("http"), m.cr.spec.service.port)
        );
    });
}

#[test]
fn content_key_follows_what_is_installed_not_how_it_is_served() {
    let s = settings();
    let base = example("kimi-k2-pvc");
    let key = |cr: &DeltafinModel| resolve(cr, &s).unwrap().key;
    let k0 = key(&base);
    let mut c = base.clone();
    c.spec.image = Some("other:1".into());
    c.spec.server.max_tokens = Some(10);
    c.spec.paused = true;
    assert_eq!(key(&c), k0, "image and server options never trigger a download");
    let mut c = base.clone();
    c.spec.source.hugging_face.as_mut().unwrap().revision = Some("abc123".into());
    assert_ne!(key(&c), k0);
    let mut c = base.clone();
    c.spec.drafts.qwen.enabled = true;
    assert_ne!(key(&c), k0);
    let mut c = base.clone();
    c.spec.setup.mode = SetupMode::Stream;
    assert_ne!(key(&c), k0);
}

#[test]
fn storage_and_dirs_resolve() {
    let s = settings();
    let k2 = example("kimi-k2-pvc");
    let m = resolve(&k2, &s).unwrap();
    assert_eq!(
        m.storage,
        Storage::Pvc {
            claim: "kimi-k2-weights".into()
        }
    );
    assert_eq!(m.dir, "/weights/hf/moonshotai/Kimi-K2-Instruct/main");
    assert_eq!(
        m.source_uri.as_deref(),
        Some("hf://moonshotai/Kimi-K2-Instruct@main")
    );
    assert_eq!(m.url(), "http://kimi-k2.ai.svc:8000/v1");
    let pre = example("preloaded-existing-claim");
    let m = resolve(&pre, &s).unwrap();
    assert_eq!(
        m.storage,
        Storage::ExistingClaim {
            claim: "models".into()
        }
    );
    assert_eq!(m.dir, "/weights/deepseek-v3");
    assert_eq!(m.image, "registry.lan:5000/deltafin:0.1.0");
    let k3 = example("kimi-k3-cuda-hostpath");
    let m = resolve(&k3, &s).unwrap();
    assert_eq!(
        m.image, "ghcr.io/deltafin/deltafin:0.1.0-cuda",
        "CUDA models default to the CUDA image"
    );
}

#[test]
fn invalid_specs_are_reported_not_rendered() {
    let s = settings();
    let mut cr = example("kimi-k2-pvc");
    cr.spec.source.preloaded = Some(Default::default());
    assert!(resolve(&cr, &s).unwrap_err().contains("exactly one of source"));
    let mut cr = example("kimi-k3-cuda-hostpath");
    cr.spec.storage.retain_policy = Some(deltafin_operator::crd::RetainPolicy::Delete);
    assert!(resolve(&cr, &s).unwrap_err().contains("retainPolicy"));
    let mut cr = example("kimi-k2-pvc");
    cr.spec.server.memory_budget = Some("lots".into());
    assert!(resolve(&cr, &s).unwrap_err().contains("memoryBudget"));
}

#[test]
fn server_options_become_flags() {
    let cr = example("kimi-k3-cuda-hostpath");
    let m = resolve(&cr, &settings()).unwrap();
    let c = resources::deployment(&m, &m.image)
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers[0]
        .clone();
    let args = c.args.unwrap().join(" ");
    assert!(
        args.starts_with("serve --model /weights/hf/moonshotai/Kimi-K3/main --host 0.0.0.0 --port 8000"),
        "{args}"
    );
    assert!(args.contains("--max-queue 4"), "{args}");
    assert!(
        args.contains("--api-key-file /etc/deltafin/api-key/api-key"),
        "{args}"
    );
    let env: Vec<_> = c.env.unwrap().into_iter().map(|e| e.name).collect();
    assert!(
        env.contains(&"HF_TOKEN".to_string()),
        "Stream mode fetches experts: the server needs the token"
    );
    assert_eq!(c.command.unwrap(), ["deltafin"]);
}
