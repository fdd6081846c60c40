//! A scripted, stateful stand-in for the Kubernetes API server, plugged into a `kube::Client`
//! through `tower_test::mock` (the kube-rs testing pattern). It stores objects as JSON per
//! collection path, assigns `uid`/`resourceVersion`/`generation`/`creationTimestamp`, and
//! understands what the operator sends: GET (object, list with an equality label selector),
//! POST, PATCH (server-side apply, JSON merge patch, JSON patch, `/status`) and DELETE
//! (with finalizer semantics). Every request is recorded so tests can assert the exact writes.
//! Tests play the other controllers (Job, Deployment, kubelet) by editing stored objects.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// One request as received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Option<Value>,
}

impl Recorded {
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }

    /// `METHOD path` with the query's field manager, for readable assertions.
    pub fn summary(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

#[derive(Default)]
pub struct State {
    /// collection path -> name -> object.
    pub objects: BTreeMap<String, BTreeMap<String, Value>>,
    pub requests: Vec<Recorded>,
    /// (collection, name) -> the top-level status fields the applier has sent: an apply removes
    /// the ones it sent before and leaves out now, and keeps fields it never sent (another
    /// writer's, such as the setup Job's `setupProgress`), as server-side apply does.
    status_applied: BTreeMap<(String, String), Vec<String>>,
    rv: u64,
    uid: u64,
}

/// Handle on the fake API server.
#[derive(Clone)]
pub struct FakeApi {
    pub state: Arc<Mutex<State>>,
}

impl FakeApi {
    /// A client talking to a new fake API server.
    pub fn start() -> (Client, FakeApi) {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let state = Arc::new(Mutex::new(State::default()));
        let fake = FakeApi { state: state.clone() };
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let (parts, body) = req.into_parts();
                let bytes = body.collect_bytes().await.expect("request body");
                let resp = state.lock().unwrap().handle(&parts, &bytes);
                send.send_response(resp);
            }
        });
        (Client::new(mock, "default"), fake)
    }

    pub fn collection(group_version: &str, ns: &str, resource: &str) -> String {
        if group_version == "v1" {
            format!("/api/v1/namespaces/{ns}/{resource}")
        } else {
            format!("/apis/{group_version}/namespaces/{ns}/{resource}")
        }
    }

    /// Stores (or replaces) an object as if created, assigning metadata.
    pub fn put(&self, collection: &str, obj: Value) {
        let mut s = self.state.lock().unwrap();
        let name = obj["metadata"]["name"].as_str().expect("name").to_string();
        let existing = s.objects.get(collection).and_then(|c| c.get(&name)).cloned();
        let obj = match existing {
            Some(old) => s.updated(old, obj),
            None => s.created(obj),
        };
        s.objects
            .entry(collection.to_string())
            .or_default()
            .insert(name, obj);
    }

    pub fn get(&self, collection: &str, name: &str) -> Option<Value> {
        self.state
            .lock()
            .unwrap()
            .objects
            .get(collection)
            .and_then(|c| c.get(name))
            .cloned()
    }

    pub fn list(&self, collection: &str) -> Vec<Value> {
        self.state
            .lock()
            .unwrap()
            .objects
            .get(collection)
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Edits a stored object in place (no metadata bookkeeping: plays another controller).
    pub fn edit(&self, collection: &str, name: &str, f: impl FnOnce(&mut Value)) {
        let mut s = self.state.lock().unwrap();
        let obj = s
            .objects
            .get_mut(collection)
            .and_then(|c| c.get_mut(name))
            .unwrap_or_else(|| panic!("{collection}/{name} missing"));
        f(obj);
    }

    /// Takes the recorded requests (and forgets them).
    pub fn take_requests(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.state.lock().unwrap().requests)
    }
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code
    });
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}

fn ok(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn matches_selector(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|req| {
        let (k, v) = req.split_once('=').expect("equality selector");
        obj["metadata"]["labels"][k].as_str() == Some(v)
    })
}

/// Deep merge (JSON merge patch semantics: null deletes).
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl State {
    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    fn created(&mut self, mut obj: Value) -> Value {
        self.uid += 1;
        let rv = self.next_rv();
        let m = obj["metadata"].as_object_mut().expect("metadata");
        m.entry("uid").or_insert(json!(format!("uid-{}", self.uid)));
        m.insert("resourceVersion".into(), json!(rv));
        m.entry("generation").or_insert(json!(1));
        m.entry("creationTimestamp")
            .or_insert(json!("2026-01-01T00:00:00Z"));
        obj
    }

    /// `new` replaces `old`, keeping server-owned metadata; generation bumps on spec change.
    fn updated(&mut self, old: Value, mut new: Value) -> Value {
        let rv = self.next_rv();
        let mut generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
        if old.get("spec") != new.get("spec") {
            generation += 1;
        }
        let m = new["metadata"].as_object_mut().expect("metadata");
        for k in ["uid", "creationTimestamp"] {
            if let Some(v) = old["metadata"].get(k) {
                m.insert(k.into(), v.clone());
            }
        }
        m.insert("resourceVersion".into(), json!(rv));
        m.insert("generation".into(), json!(generation));
        new
    }

    fn handle(&mut self, parts: &http::request::Parts, bytes: &[u8]) -> Response<Body> {
        let method = parts.method.to_string();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or_default().to_string();
        let content_type = parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body: Option<Value> =
            (!bytes.is_empty()).then(|| serde_json::from_slice(bytes).expect("JSON body"));
        self.requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            content_type: content_type.clone(),
            body: body.clone(),
        });

        // Split into collection / name / subresource.
        let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let ns_at = segs
            .iter()
            .position(|s| *s == "namespaces")
            .expect("namespaced path");
        let coll_len = ns_at + 3; // ... namespaces {ns} {resource}
        let collection = format!("/{}", segs[..coll_len.min(segs.len())].join("/"));
        let name = segs.get(coll_len).map(|s| s.to_string());
        let sub = segs.get(coll_len + 1).map(|s| s.to_string());

        match (method.as_str(), name, sub.as_deref()) {
            ("GET", None, _) => {
                let sel = query_param(&query, "labelSelector").unwrap_or_default();
                let items: Vec<Value> = self
                    .objects
                    .get(&collection)
                    .map(|c| {
                        c.values()
                            .filter(|o| matches_selector(o, &sel))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                ok(
                    200,
                    &json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": self.rv.to_string()}, "items": items}),
                )
            }
            ("GET", Some(n), _) => match self.objects.get(&collection).and_then(|c| c.get(&n)) {
                Some(o) => ok(200, o),
                None => status(404, "NotFound", &format!("{n} not found")),
            },
            ("POST", None, _) => {
                let obj = body.expect("POST body");
                let n = obj["metadata"]["name"]
                    .as_str()
                    .unwrap_or("generated")
                    .to_string();
                if self.objects.get(&collection).is_some_and(|c| c.contains_key(&n)) {
                    return status(409, "AlreadyExists", &format!("{n} already exists"));
                }
                let obj = self.created(obj);
                self.objects.entry(collection).or_default().insert(n, obj.clone());
                ok(201, &obj)
            }
            ("PATCH", Some(n), sub) => {
                self.patch(&collection, &n, sub, &content_type, body.expect("PATCH body"))
            }
            ("DELETE", Some(n), _) => {
                let Some(obj) = self.objects.get_mut(&collection).and_then(|c| c.get_mut(&n)) else {
                    return status(404, "NotFound", &format!("{n} not found"));
                };
                let has_finalizers = obj["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty());
                if has_finalizers {
                    obj["metadata"]["deletionTimestamp"] = json!("2026-01-02T00:00:00Z");
                    let o = obj.clone();
                    ok(200, &o)
                } else {
                    let o = self.objects.get_mut(&collection).unwrap().remove(&n).unwrap();
                    ok(200, &o)
                }
            }
            (m, n, s) => panic!("fake API: unhandled {m} {path} ({n:?}, {s:?})"),
        }
    }

    fn patch(
        &mut self,
        collection: &str,
        name: &str,
        sub: Option<&str>,
        content_type: &str,
        body: Value,
    ) -> Response<Body> {
        let existing = self.objects.get(collection).and_then(|c| c.get(name)).cloned();
        let apply = content_type.starts_with("application/apply-patch");
        let new = match (existing, sub) {
            (None, None) if apply => {
                let obj = self.created(body);
                self.objects
                    .entry(collection.to_string())
                    .or_default()
                    .insert(name.to_string(), obj.clone());
                return ok(201, &obj);
            }
            (None, _) => return status(404, "NotFound", &format!("{name} not found")),
            (Some(mut obj), Some("status")) => {
                if apply {
                    let sent: Vec<String> = body["status"]
                        .as_object()
                        .map(|m| m.keys().cloned().collect())
                        .unwrap_or_default();
                    let before = self
                        .status_applied
                        .insert((collection.into(), name.into()), sent.clone());
                    let mut status = obj["status"].as_object().cloned().unwrap_or_default();
                    status.retain(|k, _| sent.contains(k) || !before.iter().flatten().any(|b| b == k));
                    for (k, v) in body["status"].as_object().into_iter().flatten() {
                        status.insert(k.clone(), v.clone());
                    }
                    obj["status"] = Value::Object(status);
                } else {
                    merge(&mut obj, &json!({"status": body["status"]}));
                }
                obj
            }
            (Some(old), None) if apply => {
                // Apply: the manager owns every field it sends; replace top-level fields,
                // merge labels and annotations.
                let mut obj = old.clone();
                for (k, v) in body.as_object().unwrap() {
                    if k == "metadata" {
                        for (mk, mv) in v.as_object().unwrap() {
                            match mk.as_str() {
                                "labels" | "annotations" => merge(&mut obj["metadata"][mk], mv),
                                "name" | "namespace" => {}
                                _ => obj["metadata"][mk] = mv.clone(),
                            }
                        }
                    } else {
                        obj[k] = v.clone();
                    }
                }
                obj
            }
            (Some(mut obj), None) if content_type.starts_with("application/json-patch") => {
                // The real API server treats a missing /metadata/finalizers as null.
                if obj["metadata"].get("finalizers").is_none() {
                    obj["metadata"]["finalizers"] = Value::Null;
                }
                let p: json_patch::Patch = serde_json::from_value(body).expect("json patch");
                if let Err(e) = json_patch::patch(&mut obj, &p) {
                    return status(422, "Invalid", &format!("json patch: {e}"));
                }
                if obj["metadata"]["finalizers"].is_null() {
                    obj["metadata"].as_object_mut().unwrap().remove("finalizers");
                }
                obj
            }
            (Some(mut obj), None) => {
                merge(&mut obj, &body);
                obj
            }
            (Some(_), Some(s)) => panic!("fake API: PATCH of subresource {s}"),
        };
        let old = self
            .objects
            .get(collection)
            .and_then(|c| c.get(name))
            .cloned()
            .unwrap();
        let new = self.updated(old, new);
        // A deleting object whose last finalizer is gone disappears.
        let deleting = new["metadata"].get("deletionTimestamp").is_some();
        let finalizers = new["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if deleting && !finalizers {
            self.objects.get_mut(collection).unwrap().remove(name);
        } else {
            self.objects
                .get_mut(collection)
                .unwrap()
                .insert(name.to_string(), new.clone());
        }
        ok(200, &new)
    }
}
