//! gpt-oss (`gpt_oss`) against HF `transformers` `GptOssForCausalLM` (fixture `gpt-oss/`: the
//! published layout — MXFP4 experts stacked as `*_blocks`/`*_scales` with biases, interleaved
//! gate/up, router with bias, attention sinks, sliding/full layers crossed by the prompt, YaRN,
//! zero-based shard names), in memory and out of core, plus its tokenizer and chat template.

mod golden_support;

use deltafin_engine::tokenizer::{ChatMessage, ChatOptions, Tokenizer};
use serde_json::Value;

#[test]
fn gpt_oss_matches_hf_in_memory() {
    golden_support::check("gpt-oss");
}

#[test]
fn gpt_oss_gives_hf_ids_under_every_memory_budget() {
    golden_support::check_out_of_core("gpt-oss");
}

/// Encodes and decodes as HF's tokenizer does, and renders the published harmony chat template
/// as `apply_chat_template` does (its `Current date:` line is the day it runs, on both sides).
#[test]
fn gpt_oss_tokenizer_and_chat_template_match_hf() {
    let dir = golden_support::fixture("gpt-oss");
    let golden: Value = serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    let t = Tokenizer::from_dir(&dir).unwrap();
    let tok = &golden["tokenizer"];
    for case in tok["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = golden_support::ids(&case["ids"]);
        assert_eq!(t.encode_with_special(text), want, "encode {text:?}");
        assert_eq!(t.decode(&want), text, "decode {text:?}");
    }
    let prompt = golden["prompt_text"].as_str().unwrap();
    assert_eq!(
        t.encode_with_special(prompt),
        golden_support::ids(&golden["prompt_ids"])
    );
    let chat = &tok["chat"];
    let messages: Vec<ChatMessage> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            ChatMessage::new(
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let opts = ChatOptions {
        add_generation_prompt: true,
        ..ChatOptions::default()
    };
    let ours = t.render_chat(&messages, &opts).unwrap();
    let recorded = chat["date"].as_str().unwrap();
    let line = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("Current date: "))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no date line in {text:?}"))
    };
    let today = line(&ours);
    let want = chat["rendered"].as_str().unwrap().replace(
        &format!("Current date: {recorded}"),
        &format!("Current date: {today}"),
    );
    assert_eq!(ours, want, "chat");
    if today == recorded {
        assert_eq!(
            t.encode_chat(&messages, &opts).unwrap(),
            golden_support::ids(&chat["ids"])
        );
    } else {
        assert_eq!(
            t.encode_chat(&messages, &opts).unwrap(),
            t.encode_with_special(&want)
        );
    }
}

/// A copy of the fixture with the shard holding `target` rewritten: the tensor dropped (`None`)
/// or given another shape of the same byte size.
fn altered(target: &str, shape: Option<&[usize]>) -> tempfile::TempDir {
    use deltafin_engine::weights::{TensorSpec, WeightIndex, write_safetensors};
    let src = golden_support::fixture("gpt-oss");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let index = WeightIndex::open(dir.path()).unwrap();
    let shard = index.shard_path(index.info(target).unwrap()).to_path_buf();
    let mut names: Vec<String> = index
        .names()
        .filter(|n| index.shard_path(index.info(n).unwrap()) == shard)
        .filter(|n| shape.is_some() || n != &target)
        .map(String::from)
        .collect();
    names.sort();
    let specs: Vec<TensorSpec> = names
        .iter()
        .map(|n| {
            let i = index.info(n).unwrap();
            match (n == target, shape) {
                (true, Some(s)) => TensorSpec::new(n, i.dtype, s),
                _ => TensorSpec::new(n, i.dtype, &i.shape),
            }
        })
        .collect();
    let blobs: Vec<Vec<u8>> = names
        .iter()
        .map(|n| index.blob(index.info(n).unwrap()).to_vec())
        .collect();
    drop(index);
    write_safetensors(&shard, &specs, &[], |i, out| out.write_all(&blobs[i])).unwrap();
    if shape.is_none() {
        let path = dir.path().join("model.safetensors.index.json");
        let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        v["weight_map"].as_object_mut().unwrap().remove(target);
        std::fs::write(path, v.to_string()).unwrap();
    }
    dir
}

#[test]
fn a_malformed_gpt_oss_checkpoint_is_a_typed_error_naming_the_tensor_or_key() {
    use deltafin_engine::Error;
    use deltafin_engine::arch;
    let scales = "model.layers.1.mlp.experts.down_proj_scales";
    let dir = altered(scales, None);
    let err = arch::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::MissingTensor { name, .. } if name == scales),
        "{err}"
    );

    let blocks = "model.layers.2.mlp.experts.gate_up_proj_blocks";
    let dir = altered(blocks, Some(&[8, 64, 4, 8]));
    let err = arch::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::TensorShape { name, .. } if name == blocks),
        "{err}"
    );

    let dir = altered(blocks, Some(&[8, 64, 2, 16]));
    let path = dir.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["layer_types"][2] = "chunked_attention".into();
    std::fs::write(&path, config.to_string()).unwrap();
    let err = arch::load(dir.path()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Config { .. }), "{text}");
    assert!(
        text.contains("layer_types") && text.contains("chunked_attention"),
        "{text}"
    );
}

#[test]
fn gpt_oss_is_batch_and_chunk_invariant_and_drafts_change_nothing() {
    golden_support::check_consistency("gpt-oss");
}
