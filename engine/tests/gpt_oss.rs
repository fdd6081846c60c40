//! gpt-oss (`gpt_oss`) against HF `transformers` `GptOssForCausalLM` (fixture `gpt-oss/`: the
//! published layout — MXFP4 experts stacked as `*_blocks`/`*_scales` with biases, interleaved
//! gate/up, router with bias, attention sinks, sliding/full layers crossed by the prompt, YaRN,
//! zero-based shard names), in memory and out of core, plus its tokenizer and chat template.

mod golden_support;

use deltafin_engine::tokenizer::{ChatOptions, Tokenizer};
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
    let messages = golden_support::messages(&chat["messages"]);
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

/// A copy of the fixture with `target` dropped (`None`) or reshaped.
fn altered(target: &str, shape: Option<&[usize]>) -> tempfile::TempDir {
    golden_support::with_tensor("gpt-oss", target, shape)
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

/// Out of core, each expert's slice of the stacked MXFP4 tensors is verified as it is read: a
/// flipped bit under the experts fails the request naming the tensor and the expert, and the
/// untouched checkpoint runs with every read verified.
#[test]
fn stacked_experts_are_checksum_verified_one_expert_at_a_time_out_of_core() {
    use deltafin_engine::arch;
    use deltafin_engine::cache::{ChecksumMode, OocOptions};
    use deltafin_engine::weights::WeightIndex;
    use deltafin_engine::weights::checksums::Checksums;
    let dir = altered("model.norm.weight", Some(&[64]));
    let index = WeightIndex::open(dir.path()).unwrap();
    let sums = Checksums::compute(&index);
    let name = "model.layers.1.mlp.experts.gate_up_proj_blocks";
    let shard = index.shard_name(index.info(name).unwrap().shard).to_string();
    assert_eq!(sums.shards[&shard].slices[name].len(), 8);
    sums.save(dir.path()).unwrap();
    let info = index.info(name).unwrap().clone();
    let path = index.shard_path(&info).to_path_buf();
    drop(index);
    let mut o = OocOptions::with_budget(1);
    o.reserve_bytes = 0;
    o.checksums = ChecksumMode::Require;
    o.budget = {
        let all = OocOptions {
            budget: u64::MAX / 4,
            ..o.clone()
        };
        let (_, rt) = arch::load_budgeted(dir.path(), &all).unwrap();
        let p = &rt.plan;
        p.fixed_bytes + 2 * p.layer_bytes.iter().max().unwrap() + p.slot_bytes
    };
    let golden: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("golden.json")).unwrap()).unwrap();
    let prompt = golden_support::ids(&golden["prompt_ids"]);
    let forward = |o: &OocOptions| {
        let (model, rt) = arch::load_budgeted(dir.path(), o).unwrap();
        let mut state = model.new_state();
        let mut batch = [deltafin_engine::arch::SeqInput {
            state: &mut state,
            tokens: &prompt,
            logits: deltafin_engine::arch::LogitRows::Last,
        }];
        (model.forward(&mut batch, None), rt.reader.checksums())
    };
    let (ok, verified) = forward(&o);
    ok.unwrap();
    assert!(verified.unwrap() > 0, "no read was verified");
    // Flip one bit in every expert's slice of layer 1's gate/up blocks (same size, same file).
    let mut bytes = std::fs::read(&path).unwrap();
    let each = info.len / 8;
    for e in 0..8 {
        bytes[(info.offset + e * each + 5) as usize] ^= 0x10;
    }
    std::fs::write(&path, &bytes).unwrap();
    let (err, _) = forward(&o);
    let err = err.unwrap_err();
    assert_eq!(err.kind(), "weights_unavailable", "{err}");
    assert!(err.to_string().contains(&format!("{name}[")), "{err}");
}
