//! Whether an object on the server already holds everything the operator would apply (pure).
//!
//! The reconcile compares each server object it owns (Deployment, Service, ServiceMonitor) with
//! the object the watch cache holds for it. When the live object holds every field the desired
//! one sets, with the same value, the apply is skipped: a no-op reconcile writes nothing. Any
//! drift — a hand-edited field, a deleted object — makes them differ, and the server-side apply
//! repairs it on that reconcile. This compares contents, not a hash of the spec, so an edit
//! behind the operator's back is never mistaken for "already applied".
//!
//! What the server adds (defaults, status, other managers' fields) does not count. Empty maps
//! and lists the server drops are treated as absent. A field the operator stops setting is not
//! removed until something else in the object changes (server-side apply prunes it then).

use serde::Serialize;
use serde_json::Value;

/// Whether `live` holds every field of `desired` with an equal value (numbers compared by
/// value; `desired`'s empty values and nulls may be absent in `live`).
pub fn holds(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d.iter().all(|(k, v)| match l.get(k) {
            Some(lv) => holds(v, lv),
            None => is_empty(v),
        }),
        (Value::Array(d), Value::Array(l)) => d.len() == l.len() && d.iter().zip(l).all(|(a, b)| holds(a, b)),
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (d, l) => d == l || (is_empty(d) && is_empty(l)),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.values().all(is_empty),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Whether the cached `live` object already holds `desired` (`None`: it does not exist).
pub fn already_applied<T: Serialize, L: Serialize>(desired: &T, live: Option<&L>) -> bool {
    let Some(live) = live else { return false };
    match (serde_json::to_value(desired), serde_json::to_value(live)) {
        (Ok(d), Ok(l)) => holds(&d, &l),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn server_additions_do_not_count_but_a_changed_or_missing_field_does() {
        let desired = json!({"metadata": {"name": "s", "labels": {"a": "1"}, "annotations": {}},
            "spec": {"replicas": 1, "ports": [{"port": 80, "protocol": "TCP"}]}});
        let live = json!({"metadata": {"name": "s", "labels": {"a": "1", "extra": "x"}, "resourceVersion": "7",
            "managedFields": []}, "spec": {"replicas": 1.0, "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}],
            "clusterIP": "10.0.0.1"}, "status": {}});
        assert!(holds(&desired, &live));
        let edited = json!({"metadata": {"name": "s", "labels": {"a": "1"}}, "spec": {"replicas": 3,
            "ports": [{"port": 80, "protocol": "TCP"}]}});
        assert!(!holds(&desired, &edited), "a hand-edited field");
        let missing = json!({"metadata": {"name": "s"}, "spec": {"replicas": 1, "ports": [{"port": 80, "protocol": "TCP"}]}});
        assert!(!holds(&desired, &missing), "a label removed");
        let extra_port = json!({"metadata": {"name": "s", "labels": {"a": "1"}}, "spec": {"replicas": 1,
            "ports": [{"port": 80, "protocol": "TCP"}, {"port": 81}]}});
        assert!(!holds(&desired, &extra_port), "a list of another length");
        assert!(!already_applied(&desired, None::<&Value>), "a deleted object");
        assert!(already_applied(&desired, Some(&live)));
    }
}
