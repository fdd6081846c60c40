//! GLM-5 (`glm_moe_dsa`) against HF `transformers` `GlmMoeDsaForCausalLM` (fixture
//! `glm5-dsa-fp8/`: MLA with Q-LoRA and DeepSeek Sparse Attention, a lightning indexer on layers
//! 0 and 2 and layers 1 and 3 sharing its choice, `index_topk` 12 against a 58-token prompt and
//! its continuation; block FP8 with partial edge blocks, per-expert tensors, a dense first
//! layer, sigmoid routing with correction bias, a shared expert, and the unused MTP layer), in
//! memory and out of core, with the exactness properties every family has.

mod golden_support;

#[test]
fn glm5_dsa_fp8_matches_hf_in_memory() {
    golden_support::check("glm5-dsa-fp8");
}

#[test]
fn glm5_dsa_fp8_gives_hf_ids_under_every_memory_budget() {
    golden_support::check_out_of_core("glm5-dsa-fp8");
}

#[test]
fn glm5_tokenizer_and_chat_template_match_hf() {
    golden_support::check_tokenizer("glm5-dsa-fp8");
}

#[test]
fn glm5_chunking_batching_prefix_reuse_and_drafts_are_exact() {
    golden_support::check_consistency("glm5-dsa-fp8");
}

/// Long prompts, where nearly every row attends sparsely (12 of up to `len` positions): one
/// pass, chunks of 256 and of 64, and batched beside another sequence give the same logits bit
/// for bit; the context memory the sequence holds is the plan's bytes per token (latent, shared
/// key and indexer key of every layer that has one) times its length.
fn long_prompt_bits_agree(len: usize) {
    let (model, state) = golden_support::long_prompt_bits_agree("glm5-dsa-fp8", len, 420);
    let plan = model.info().state;
    assert_eq!(
        plan.per_token,
        4 * (4 * (32 + 8) + 2 * 32),
        "4 MLA layers, 2 with an indexer"
    );
    assert_eq!(
        state.cache_bytes() as u64,
        plan.per_token * len as u64 + plan.per_sequence
    );
}

#[test]
fn glm5_1k_token_prompt_is_bit_identical_in_chunks_and_batches() {
    long_prompt_bits_agree(1024);
}

#[test]
fn glm5_8k_token_prompt_is_bit_identical_in_chunks_and_batches() {
    long_prompt_bits_agree(8192);
}

/// A checkpoint without an indexer tensor, or with one of the wrong shape, is refused naming
/// it, in memory and out of core; a shared layer's missing indexer is what the config says.
#[test]
fn a_missing_or_misshapen_indexer_tensor_names_it() {
    use deltafin_engine::arch;
    use deltafin_engine::cache::OocOptions;
    use deltafin_engine::error::Error;
    let wk = "model.layers.2.self_attn.indexer.wk.weight";
    let dir = golden_support::with_tensor("glm5-dsa-fp8", wk, None);
    let err = arch::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::MissingTensor { name, .. } if name == wk),
        "{err}"
    );
    let err = arch::load_budgeted(dir.path(), &OocOptions::with_budget(u64::MAX / 4)).unwrap_err();
    assert!(
        matches!(&err, Error::MissingTensor { name, .. } if name == wk),
        "{err}"
    );
    let proj = "model.layers.0.self_attn.indexer.weights_proj.weight";
    let dir = golden_support::with_tensor("glm5-dsa-fp8", proj, Some(&[8, 192]));
    let err = arch::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::TensorShape { name, .. } if name == proj),
        "{err}"
    );
    // Layer 1 shares layer 0's choice: marking it full asks for an indexer it does not have.
    let dir = golden_support::with_config("glm5-dsa-fp8", |c| c["indexer_types"][1] = "full".into());
    let err = arch::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::MissingTensor { name, .. } if name.starts_with("model.layers.1.self_attn.indexer.")),
        "{err}"
    );
}

/// GLM-5's MTP module as a drafter: after a proposal its cache holds exactly the committed
/// positions (speculative rows are cut), and its drafts do not depend on how the committed rows
/// reached it (all in one multi-row pass, or one row per step).
#[test]
fn glm5_mtp_drafts_do_not_depend_on_how_rows_were_batched() {
    use std::sync::Arc;

    use deltafin_engine::arch::{self, LogitRows, SeqInput, Trace};
    use deltafin_engine::spec::mtp::Mtp;
    use deltafin_engine::spec::{Observation, Proposal, Proposer};
    let dir = golden_support::fixture("glm5-dsa-fp8");
    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    let prompt = golden_support::ids(&golden["prompt_ids"]);
    let model = arch::load(&dir).unwrap();
    let m = model.as_ref();
    let mtp = Arc::new(Mtp::new(
        arch::load_mtp(&dir)
            .unwrap()
            .expect("the fixture has an MTP layer"),
    ));
    mtp.check_target(m).unwrap();
    let capture = mtp.session().captures().to_vec();
    let mut trace = Trace::capture(&capture);
    let mut state = m.new_state();
    let inputs = &mut [SeqInput {
        state: &mut state,
        tokens: &prompt,
        logits: LogitRows::Last,
    }];
    m.forward(inputs, Some(&mut trace)).unwrap();
    let h = m.info().hidden_size;
    let rows = |start: usize, n: usize| trace.rows(&capture, start, n, h);
    let pending = 7u32;
    let full: Vec<u32> = prompt.iter().copied().chain([pending]).collect();

    let mut whole = mtp.session();
    let hidden = rows(0, prompt.len());
    let obs = Observation {
        start: 0,
        tokens: &prompt,
        hidden: &hidden,
    };
    whole.observe(m, &obs).unwrap();
    let a = whole.propose(m, &full, 4).unwrap();
    assert_eq!(whole.cached(), prompt.len(), "speculative rows were cut");

    let mut stepwise = mtp.session();
    let mut last = Proposal::default();
    for t in 0..prompt.len() {
        let hidden = rows(t, 1);
        let obs = Observation {
            start: t,
            tokens: &prompt[t..t + 1],
            hidden: &hidden,
        };
        stepwise.observe(m, &obs).unwrap();
        last = stepwise
            .propose(m, &full[..t + 2], if t + 1 == prompt.len() { 4 } else { 3 })
            .unwrap();
        assert_eq!(stepwise.cached(), t + 1);
    }
    assert_eq!(last, a, "one row per step drafts what one multi-row pass drafts");
    assert_eq!(a.tokens.len(), 4);
    assert_eq!(
        stepwise.propose(m, &full, 4).unwrap(),
        Proposal::default(),
        "nothing new to read"
    );
}
