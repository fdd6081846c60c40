//! DeepSeek-V4 (`deepseek_v4`) against HF `transformers` `DeepseekV4ForCausalLM` (fixture
//! `dsv4-flash/`: sliding / compressed sparse / heavily compressed attention with a window of 8,
//! ratios 4 and 8 and an indexer keeping 3 entries against a 47-token prompt and its
//! continuation; mHC with 4 streams; two hash-routed layers and two `sqrtsoftplus` layers;
//! FP4 experts and block FP8 with UE8M0 scales under DeepSeek's published names), in memory and
//! out of core, with the exactness properties every family has.

mod golden_support;

#[test]
fn dsv4_flash_matches_hf_in_memory() {
    golden_support::check("dsv4-flash");
}

#[test]
fn dsv4_flash_gives_hf_ids_under_every_memory_budget() {
    golden_support::check_out_of_core("dsv4-flash");
}

/// The tokenizer's encodings and decodings as HF's, and BOS added by the tokenizer (V4 renders
/// chats with DeepSeek's Python encoder, not a Jinja template: the chat format is DSML's).
#[test]
fn dsv4_tokenizer_matches_hf() {
    use deltafin_engine::tokenizer::Tokenizer;
    use golden_support::ids;
    let dir = golden_support::fixture("dsv4-flash");
    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    let t = Tokenizer::from_dir(&dir).unwrap();
    let cases = golden["tokenizer"]["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        assert_eq!(t.encode_with_special(text), ids(&case["ids"]), "encode {text:?}");
        assert_eq!(t.decode(&ids(&case["ids"])), text, "decode {text:?}");
        let with_bos = ids(&case["ids_add_special_tokens"]);
        assert_eq!(with_bos[0], 0, "BOS first");
        assert_eq!(t.encode_with_special(text), with_bos[1..], "{text:?} after BOS");
    }
}

#[test]
fn dsv4_chunking_batching_prefix_reuse_and_drafts_are_exact() {
    golden_support::check_consistency("dsv4-flash");
}

/// Long prompts, where every compressed layer holds hundreds of entries and the indexer keeps 3
/// of them: one pass, chunks of 256 and of 64, and batched beside another sequence give the
/// same logits bit for bit; the context memory a committed sequence holds is within the plan
/// (entries per token, the sliding window and open windows per sequence), far below every
/// position's kv and compressor inputs.
fn long_prompt_bits_agree(len: usize) {
    let (model, mut state) = golden_support::long_prompt_bits_agree("dsv4-flash", len, 520);
    let plan = model.info().state;
    // Per position, the compressed entries only: 32/4 + 16/4 floats on each sparse layer
    // (entry and indexer key), 32/8 on the heavy one.
    assert_eq!(plan.per_token, 4 * (2 * (32 / 4 + 16 / 4) + 32 / 8));
    state.commit_all();
    let held = state.cache_bytes() as u64;
    let blocks = |n: usize| n.div_ceil(64) as u64 * 64;
    assert!(held <= plan.bytes(len, 0), "{held} > plan {}", plan.bytes(len, 0));
    // Every position's kv and compressor inputs would be 4·(4·32 + 2·(4·32 + 4·16) + 2·32) bytes.
    let uncompressed = 4 * (4 * 32 + 2 * (4 * 32 + 4 * 16) + 2 * 32) * blocks(len);
    eprintln!(
        "{len} tokens: held {held} B, plan {} B, every position's parts {uncompressed} B",
        plan.bytes(len, 0)
    );
    assert!(
        held * 4 < uncompressed,
        "{held} of {uncompressed}: the window and open windows only"
    );
    assert!(held >= plan.per_token * len as u64, "{held}: every entry is held");
    // A committed state rewinds only as far as its held window and open windows reach: a
    // reuse of the early prefix recomputes (0), the last positions rewind exactly.
    assert_eq!(state.rewind_point(100), 0);
    assert_eq!(state.rewind_point(len - 3), len - 3);
}

#[test]
fn dsv4_1k_token_prompt_is_bit_identical_in_chunks_and_batches() {
    long_prompt_bits_agree(1024);
}

#[test]
fn dsv4_8k_token_prompt_is_bit_identical_in_chunks_and_batches() {
    long_prompt_bits_agree(8192);
}

/// Malformed checkpoints are refused with a typed error naming the tensor, in memory and out
/// of core: a missing indexer weight, an FP4 scale of the wrong shape, a hash table of the
/// wrong size, and a compressor's position bias of the wrong shape.
#[test]
fn malformed_dsv4_checkpoints_name_the_tensor() {
    use deltafin_engine::arch;
    use deltafin_engine::cache::OocOptions;
    use deltafin_engine::error::Error;
    let budget = OocOptions::with_budget(u64::MAX / 4);
    let missing = "layers.1.attn.indexer.weights_proj.weight";
    let dir = golden_support::with_tensor("dsv4-flash", missing, None);
    for err in [
        arch::load(dir.path()).unwrap_err(),
        arch::load_budgeted(dir.path(), &budget).unwrap_err(),
    ] {
        assert!(
            matches!(&err, Error::MissingTensor { name, .. } if name == missing),
            "{err}"
        );
    }
    for (tensor, shape) in [
        ("layers.2.ffn.experts.3.w1.scale", &[16usize, 4][..]),
        ("layers.0.ffn.gate.tid2eid", &[264, 8][..]),
        ("layers.1.attn.indexer.compressor.ape", &[8, 16][..]),
    ] {
        let dir = golden_support::with_tensor("dsv4-flash", tensor, Some(shape));
        for err in [
            arch::load(dir.path()).unwrap_err(),
            arch::load_budgeted(dir.path(), &budget).unwrap_err(),
        ] {
            assert!(
                matches!(&err, Error::TensorShape { name, .. } if name == tensor),
                "{tensor}: {err}"
            );
        }
    }
}

/// A synthetic checkpoint in DeepSeek's own config spelling (`compress_ratios` with a ratio of
/// 16 and the MTP block's entry, `num_hash_layers`, `rope_scaling`, `compress_rope_theta`) and
/// the published formats loads and decodes the same ids in memory and under a budget that
/// streams its experts; its MTP block (`mtp.0.*`, as `synth --preset dsv4-flash` writes it)
/// drafts on both without changing an id.
#[test]
fn a_synthetic_v4_in_deepseeks_spelling_runs_the_same_in_memory_and_out_of_core() {
    use deltafin_engine::arch;
    use deltafin_engine::cache::OocOptions;
    use deltafin_engine::generate::{GenerateOptions, Sampling, generate, generate_with};
    use deltafin_engine::spec::mtp::Mtp;
    use deltafin_engine::spec::{EconomicsConfig, Speculator};
    use deltafin_engine::synth::DeepseekV4Synth;
    let s = DeepseekV4Synth {
        hidden: 256,
        heads: 4,
        head_dim: 64,
        rope: 16,
        q_lora: 64,
        o_groups: 2,
        // A block-row multiple: the grouped output projection runs on its row blocks.
        o_rank: 128,
        window: 16,
        index_heads: 4,
        index_head_dim: 32,
        index_topk: 8,
        ratios: (4, 16),
        experts: 8,
        moe_intermediate: 64,
        shards: 2,
        ..DeepseekV4Synth::flash(4)
    };
    let dir = tempfile::tempdir().unwrap();
    s.write(dir.path()).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 40,
        sampling: Sampling::Greedy,
        stop_ids: vec![],
        prefill_chunk: 16,
    };
    let prompt: Vec<u32> = (0..70).map(|i| (i * 37 % 250) as u32).collect();
    let run = |m: &dyn arch::Model| {
        generate(m, &mut m.new_state(), &prompt, &opts, |_| {
            deltafin_engine::generate::Flow::Continue
        })
        .unwrap()
        .output_ids
    };
    let model = arch::load(dir.path()).unwrap();
    let want = run(model.as_ref());
    let (budgeted, _runtime) =
        arch::load_budgeted(dir.path(), &OocOptions::with_budget((35 << 20) + (400 << 10))).unwrap();
    assert_eq!(run(budgeted.as_ref()), want, "out of core");
    let mtp = std::sync::Arc::new(Mtp::new(
        arch::load_mtp(dir.path())
            .unwrap()
            .expect("the synth writes mtp.0.*"),
    ));
    for m in [model.as_ref(), budgeted.as_ref()] {
        mtp.check_target(m).unwrap();
        let forced = EconomicsConfig {
            forced: true,
            max_width: 3,
            ..Default::default()
        };
        let mut spec = Speculator::new(vec![Box::new(mtp.session())], &forced, None);
        let drafted = generate_with(m, &mut m.new_state(), &prompt, &opts, Some(&mut spec), |_| {
            deltafin_engine::generate::Flow::Continue
        })
        .unwrap();
        assert_eq!(drafted.output_ids, want, "MTP drafts");
        let drafts = spec.summary().proposers.get("mtp").map_or(0, |p| p.proposals);
        assert!(drafts > 0, "the MTP block drafted");
    }
}

/// A committed V4 state keeps only its window, so it rewinds into its history through a
/// checkpoint: taken after each prefill chunk (as the scheduler does for reused prompts), it
/// restores the window parts, and the continuation is bit-identical to a fresh run of the
/// prefix; before the first checkpoint nothing is reusable.
#[test]
fn a_v4_state_rewinds_into_its_history_through_a_checkpoint() {
    use deltafin_engine::arch;
    use golden_support::pass_bits;
    let model = arch::load(&golden_support::fixture("dsv4-flash")).unwrap();
    let m = model.as_ref();
    let prompt: Vec<u32> = (0..600).map(|i| ((i * 7919 + 13) % 520) as u32).collect();
    let tail: Vec<u32> = (0..50).map(|i| ((i * 31 + 5) % 520) as u32).collect();
    let mut fresh = m.new_state();
    pass_bits(m, &mut fresh, &prompt[..400]);
    let want = pass_bits(m, &mut fresh, &tail);
    let mut reused = m.new_state();
    for chunk in prompt.chunks(200) {
        pass_bits(m, &mut reused, chunk);
        reused.checkpoint(4);
    }
    assert_eq!(reused.checkpoint_positions(), vec![200, 400, 600]);
    assert_eq!(reused.rewind_point(450), 400);
    assert_eq!(reused.rewind_point(150), 0);
    reused.truncate(400).unwrap();
    assert_eq!(
        pass_bits(m, &mut reused, &tail),
        want,
        "resumed from the checkpoint at 400"
    );
}
