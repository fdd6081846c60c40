//! Malformed checkpoints fail with a typed error that names the file or tensor, never a panic.

use std::path::Path;

use deltafin_engine::Error;
use deltafin_engine::arch;
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use deltafin_engine::weights::{Dtype, TensorSpec, WeightIndex, write_safetensors};

fn synth() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    DeepseekSynth::tiny(ExpertFormat::Bf16).write(dir.path()).unwrap();
    dir
}

fn load_err(dir: &Path) -> Error {
    arch::load(dir).expect_err("loading must fail")
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

/// Rewrite the shard holding `target` with that tensor's dtype/shape replaced (same byte size).
fn rewrite_tensor(dir: &Path, target: &str, dtype: Dtype, shape: &[usize]) {
    let index = WeightIndex::open(dir).unwrap();
    let info = index.info(target).unwrap().clone();
    let shard = index.shard_path(&info).to_path_buf();
    let mut names: Vec<String> = index
        .names()
        .filter(|n| index.shard_path(index.info(n).unwrap()) == shard)
        .map(String::from)
        .collect();
    names.sort();
    let specs: Vec<TensorSpec> = names
        .iter()
        .map(|n| {
            let i = index.info(n).unwrap();
            if n == target {
                TensorSpec::new(n, dtype, shape)
            } else {
                TensorSpec::new(n, i.dtype, &i.shape)
            }
        })
        .collect();
    let blobs: Vec<Vec<u8>> = names
        .iter()
        .map(|n| index.blob(index.info(n).unwrap()).to_vec())
        .collect();
    drop(index);
    write_safetensors(&shard, &specs, &[], |i, out| out.write_all(&blobs[i])).unwrap();
}

#[test]
fn truncated_shard_names_the_file_and_tensor() {
    let dir = synth();
    let shard = dir.path().join("model-00002-of-00002.safetensors");
    let len = std::fs::metadata(&shard).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&shard).unwrap();
    f.set_len(len - 100).unwrap();
    let err = load_err(dir.path());
    assert!(matches!(err, Error::Truncated { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("model-00002-of-00002.safetensors") && msg.contains("truncated"),
        "{msg}"
    );
}

#[test]
fn header_garbage_and_tiny_files_are_malformed_not_panics() {
    for bytes in [
        vec![1u8, 2, 3],
        1u64.to_le_bytes().to_vec(),
        {
            let mut b = 10u64.to_le_bytes().to_vec();
            b.extend_from_slice(b"not json!!");
            b
        },
        u64::MAX.to_le_bytes().to_vec(),
    ] {
        let dir = synth();
        std::fs::write(dir.path().join("model-00001-of-00002.safetensors"), &bytes).unwrap();
        let err = load_err(dir.path());
        assert!(matches!(err, Error::Safetensors { .. }), "{err}");
        assert!(
            err.to_string().contains("model-00001-of-00002.safetensors"),
            "{err}"
        );
    }
}

#[test]
fn missing_shard_listed_in_the_index_is_reported() {
    let dir = synth();
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.to_string().contains("model-00002-of-00002.safetensors"),
        "{err}"
    );
}

#[test]
fn wrong_shape_names_the_tensor() {
    let dir = synth();
    let name = "model.layers.1.self_attn.kv_a_layernorm.weight";
    rewrite_tensor(dir.path(), name, Dtype::BF16, &[4, 8]);
    let err = load_err(dir.path());
    assert!(
        matches!(&err, Error::TensorShape { name: n, .. } if n == name),
        "{err}"
    );
    // A config that disagrees with the tensors is reported the same way.
    let dir = synth();
    edit_config(dir.path(), |c| c["kv_lora_rank"] = 16.into());
    let err = load_err(dir.path());
    assert!(matches!(err, Error::TensorShape { .. }), "{err}");
    assert!(err.to_string().contains("self_attn.kv_a"), "{err}");
}

#[test]
fn wrong_dtype_names_the_tensor() {
    let dir = synth();
    let name = "model.layers.0.self_attn.o_proj.weight";
    let index = WeightIndex::open(dir.path()).unwrap();
    let shape = index.info(name).unwrap().shape.clone();
    drop(index);
    // Same byte size, different dtype: I16 instead of BF16.
    rewrite_tensor(dir.path(), name, Dtype::I16, &shape);
    let err = load_err(dir.path());
    assert!(
        matches!(&err, Error::TensorDtype { name: n, found, .. } if n == name && found == "I16"),
        "{err}"
    );
}

#[test]
fn missing_tensor_and_unknown_model_type() {
    let dir = synth();
    edit_config(dir.path(), |c| c["model_type"] = "mixtral".into());
    let err = load_err(dir.path());
    assert!(
        matches!(err, Error::UnknownModelType { .. }) && err.to_string().contains("mixtral"),
        "{err}"
    );
    let dir = synth();
    edit_config(dir.path(), |c| c["num_hidden_layers"] = 4.into());
    let err = load_err(dir.path());
    assert!(
        matches!(&err, Error::MissingTensor { name, .. } if name.starts_with("model.layers.3.")),
        "{err}"
    );
    let dir = synth();
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    assert!(matches!(load_err(dir.path()), Error::Io { .. }));
}

#[test]
fn out_of_vocabulary_tokens_and_context_overflow_are_errors() {
    let dir = synth();
    let m = arch::load(dir.path()).unwrap();
    let mut s = m.new_state();
    let input = |t: &'static [u32]| t;
    let err = m
        .forward(
            &mut [arch::SeqInput {
                state: &mut s,
                tokens: input(&[1, 99999]),
                logits: arch::LogitRows::Last,
            }],
            None,
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { field: "tokens", .. }),
        "{err}"
    );
    assert_eq!(s.len(), 0, "a rejected pass must not change the state");
    let long = vec![1u32; m.info().max_context + 1];
    let err = m.forward(
        &mut [arch::SeqInput {
            state: &mut s,
            tokens: &long,
            logits: arch::LogitRows::Last,
        }],
        None,
    );
    assert!(matches!(err, Err(Error::ContextOverflow { .. })));
}
