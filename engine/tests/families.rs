//! The family table is the one list of what this build runs: the README's table and the
//! unknown-`model_type` error derive from it, and every row is reachable (no earlier row
//! shadows it).

use deltafin_engine::arch::{FAMILIES, ModelSpec, families_markdown, supported_model_types};

const START: &str = "<!-- families:start (generated from arch::FAMILIES; engine/tests/families.rs) -->\n";
const END: &str = "<!-- families:end -->";

#[test]
fn the_readme_table_is_the_family_table() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme.find(START).expect("README has the families markers") + START.len();
    let end = readme[start..]
        .find(END)
        .expect("README closes the families block")
        + start;
    assert_eq!(
        &readme[start..end],
        families_markdown(),
        "README.md's family table is stale; paste this between the markers:\n{}",
        families_markdown()
    );
}

#[test]
fn an_unknown_model_type_lists_every_row() {
    let err = ModelSpec::from_value(
        &serde_json::json!({"model_type": "mixtral"}),
        std::path::Path::new("config.json"),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("mixtral"), "{text}");
    assert!(text.contains(&supported_model_types()), "{text}");
    for f in FAMILIES {
        for t in f.model_types {
            assert!(supported_model_types().contains(t), "{t} missing from {text}");
        }
    }
}

#[test]
fn every_row_is_reachable() {
    for (i, f) in FAMILIES.iter().enumerate() {
        for (j, g) in FAMILIES[..i].iter().enumerate() {
            let same_types = f.model_types.iter().any(|t| g.model_types.contains(t));
            assert!(
                !same_types || f.nesting != g.nesting,
                "row {i} ({:?}) is shadowed by row {j}",
                f.model_types
            );
        }
    }
}
