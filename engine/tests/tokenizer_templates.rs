//! Chat-template features against transformers' Jinja environment
//! (fixtures/tokenizers/gen_templates.py).

mod tokenizer_support;

use deltafin_engine::Error;
use deltafin_engine::tokenizer::ChatTemplate;
use tokenizer_support::*;

#[test]
fn templates_render_like_transformers() {
    let g = load_json("templates.json");
    let fixed = g["fixed_unix"].as_i64().unwrap();
    let mut failures = Vec::new();
    for case in g["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let template =
            ChatTemplate::new(case["template"].as_str().unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = template.render_at(&case["context"], fixed);
        match (&got, case.get("output"), case.get("error")) {
            (Ok(out), Some(want), _) if out == want.as_str().unwrap() => {}
            (Err(e), None, Some(want)) if e.to_string().contains(want.as_str().unwrap()) => {}
            _ => failures.push(format!(
                "{name}: got {got:?}, want {}",
                case.get("output").or(case.get("error")).unwrap()
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn syntax_errors_are_template_errors() {
    let err = ChatTemplate::new("{% for x in xs %}no end").unwrap_err();
    assert!(matches!(err, Error::Template(_)), "{err:?}");
    let t = ChatTemplate::new("{{ x | tojson(bogus=1) }}").unwrap();
    assert!(matches!(
        t.render(&serde_json::json!({"x": 1})),
        Err(Error::Template(_))
    ));
    assert!(matches!(
        t.render(&serde_json::json!([1])),
        Err(Error::Template(_))
    ));
}

#[test]
fn source_is_kept() {
    let t = ChatTemplate::new("{{ 'a' }}").unwrap();
    assert_eq!(t.source(), "{{ 'a' }}");
    assert_eq!(t.render(&serde_json::json!({})).unwrap(), "a");
}
