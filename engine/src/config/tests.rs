use std::path::Path;

use serde_json::{Value, json};

use super::*;
use crate::error::Error;

fn base() -> Value {
    json!({
        "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
        "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
        "eos_token_id": 1, "bos_token_id": 0
    })
}

fn parse(v: &Value) -> crate::Result<Spec<DeepseekV3Config>> {
    Spec::from_value_typed(v, Path::new("config.json"))
}

fn parse_qwen3_moe(v: &Value) -> crate::Result<Spec<Qwen3MoeConfig>> {
    Spec::from_value_typed(v, Path::new("config.json"))
}

fn dsv3(v: &Value) -> DeepseekV3Config {
    Spec::<DeepseekV3Config>::from_value_typed(v, Path::new("config.json"))
        .unwrap()
        .arch
}

#[test]
fn flat_deepseek_v3_parses() {
    let c = dsv3(&base());
    assert_eq!(c.q_lora_rank, Some(32));
    assert_eq!(c.eos_token_ids, vec![1]);
    assert_eq!(c.rope.scaling, RopeScaling::Default);
    assert!(c.rope_interleave);
}

#[test]
fn unknown_model_type_is_named() {
    let mut v = base();
    v["model_type"] = json!("llama");
    let err = parse(&v).unwrap_err();
    assert!(
        matches!(err, Error::UnknownModelType { ref model_type, .. } if model_type == "llama"),
        "{err}"
    );
    assert!(err.to_string().contains("llama"));
}

#[test]
fn inconsistent_fields_are_named() {
    let cases = [
        ("num_experts_per_tok", json!(9)),
        ("n_group", json!(3)),
        ("topk_group", json!(5)),
        ("num_key_value_heads", json!(2)),
        ("moe_layer_freq", json!(2)),
        ("scoring_func", json!("softmax")),
        ("hidden_size", json!("wide")),
    ];
    for (field, value) in cases {
        let mut v = base();
        v[field] = value;
        let err = parse(&v).unwrap_err();
        assert!(
            matches!(&err, Error::Config { field: f, .. } if f == field),
            "{field}: {err}"
        );
    }
    let mut v = base();
    v.as_object_mut().unwrap().remove("kv_lora_rank");
    assert!(matches!(parse(&v).unwrap_err(), Error::Config { field, .. } if field == "kv_lora_rank"));
}

#[test]
fn legacy_and_v5_rope_spellings_agree() {
    let mut legacy = base();
    legacy["rope_theta"] = json!(50000.0);
    legacy["rope_scaling"] = json!({"type": "yarn", "factor": 32.0, "beta_fast": 1.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096});
    let mut v5 = base();
    v5.as_object_mut().unwrap().remove("rope_theta");
    v5["rope_parameters"] = json!({"rope_type": "yarn", "rope_theta": 50000.0, "factor": 32.0, "beta_fast": 1.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096});
    assert_eq!(dsv3(&legacy).rope, dsv3(&v5).rope);
}

#[test]
fn yarn_softmax_scale_matches_reference_values() {
    // model-formats.md §1.2: factor 32 => 192^-0.5 * mscale² = 0.1308608; factor 40 => 0.1352338.
    for (factor, want) in [(32.0, 0.1308608), (64.0, 0.1446796), (40.0, 0.1352338)] {
        let mut v = base();
        v["rope_scaling"] = json!({"type": "yarn", "factor": factor, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096});
        let c = dsv3(&v);
        let scale = 192f64.powf(-0.5) * c.rope.softmax_scale_multiplier();
        assert!((scale - want).abs() < 1e-6, "factor {factor}: {scale}");
        let (_, attention) = c.rope.inv_freq(64);
        assert_eq!(attention, 1.0);
    }
}

#[test]
fn yarn_ramp_bounds_match_reference() {
    // K2: base 50000, beta 1/1, orig 4096 => low 19, high 20: dims < 19 extrapolate, > 20 interpolate.
    let rope = RopeConfig {
        theta: 50000.0,
        scaling: RopeScaling::Yarn {
            factor: 32.0,
            beta_fast: 1.0,
            beta_slow: 1.0,
            mscale: Some(1.0),
            mscale_all_dim: Some(1.0),
            original_max_position_embeddings: 4096,
            attention_factor: None,
            truncate: true,
        },
    };
    let plain = RopeConfig {
        theta: 50000.0,
        scaling: RopeScaling::Default,
    };
    let (inv, _) = rope.inv_freq(64);
    let (base_inv, _) = plain.inv_freq(64);
    assert_eq!(inv[19], base_inv[19]);
    assert_eq!(inv[18], base_inv[18]);
    assert!((inv[25] - base_inv[25] / 32.0).abs() <= f32::EPSILON * inv[25]);
}

#[test]
fn nested_text_config_gets_prefix_and_quant() {
    let mut text = base();
    text["model_type"] = json!("kimi_k2");
    let v = json!({
        "model_type": "kimi_k25",
        "text_config": text,
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
                "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
                    "group_size": 32, "dynamic": false, "observer": "minmax", "actorder": null}}},
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]
        }
    });
    let spec = parse(&v).unwrap();
    assert_eq!(spec.tensor_prefix, "language_model.");
    let Quantization::Int4PackQuantized { group_size, ignore } = &spec.quant else {
        panic!("{:?}", spec.quant)
    };
    assert_eq!(*group_size, 32);
    let ignored = |n: &str| ignore.iter().any(|r| r.matches(n));
    assert!(ignored("model.layers.0.self_attn.q_proj"));
    assert!(ignored("model.layers.0.mlp.gate_proj"));
    assert!(ignored("lm_head"));
    assert!(!ignored("model.layers.1.mlp.experts.3.gate_proj"));
    // Nested errors name the nested field.
    let mut bad = v.clone();
    bad["text_config"]["n_group"] = json!(3);
    assert!(
        matches!(parse(&bad).unwrap_err(), Error::Config { field, .. } if field == "text_config.n_group")
    );
}

#[test]
fn unsupported_quantisation_fails_closed() {
    let mut v = base();
    v["quantization_config"] = json!({"quant_method": "gptq", "bits": 4});
    assert!(
        matches!(parse(&v).unwrap_err(), Error::Config { field, .. } if field == "quantization_config.quant_method")
    );
    v["quantization_config"] = json!({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]});
    assert!(matches!(
        parse(&v).unwrap().quant,
        Quantization::Fp8Block {
            block_rows: 128,
            block_cols: 128
        }
    ));
}

fn qwen3_moe() -> Value {
    json!({
        "model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
        "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2,
        "mlp_only_layers": [0], "max_position_embeddings": 256, "rope_theta": 1000000.0,
        "eos_token_id": [2, 0]
    })
}

#[test]
fn qwen3_moe_parses_with_hf_defaults_and_names_bad_fields() {
    let c = Spec::<Qwen3MoeConfig>::from_value_typed(&qwen3_moe(), Path::new("config.json"))
        .unwrap()
        .arch;
    assert_eq!(
        (c.head_dim(), c.decoder_sparse_step, c.norm_topk_prob),
        (32, 1, false)
    );
    assert_eq!(c.eos_token_id.to_vec(), vec![2, 0]);
    assert_eq!(
        (0..3).map(|i| c.is_moe_layer(i)).collect::<Vec<_>>(),
        vec![false, true, true]
    );
    let mut v = qwen3_moe();
    v["num_local_experts"] = v["num_experts"].take();
    v.as_object_mut().unwrap().remove("num_experts");
    assert!(
        parse_qwen3_moe(&v).is_ok(),
        "transformers 5 spells it num_local_experts"
    );
    for (field, value, want) in [
        ("hidden_size", json!("wide"), "hidden_size"),
        ("num_experts_per_tok", json!(9), "num_experts_per_tok"),
        ("num_key_value_heads", json!(3), "num_key_value_heads"),
        ("use_sliding_window", json!(true), "use_sliding_window"),
    ] {
        let mut v = qwen3_moe();
        v[field] = value;
        let err = parse_qwen3_moe(&v).unwrap_err().to_string();
        assert!(err.contains(want), "{field}: {err}");
    }
    let mut v = qwen3_moe();
    v.as_object_mut().unwrap().remove("vocab_size");
    assert!(
        parse_qwen3_moe(&v)
            .unwrap_err()
            .to_string()
            .contains("vocab_size")
    );
}

#[test]
fn unknown_keys_are_ignored_and_listed_one_policy_for_every_family() {
    let mut v = qwen3_moe();
    v["future_knob"] = json!(3);
    v["router_aux_loss_coef"] = json!(0.001);
    let path = Path::new("config.json");
    let f = Fields {
        map: v.as_object().unwrap(),
        path,
        scope: "",
    };
    let (c, unknown): (Qwen3MoeConfig, Vec<String>) = f.deserialize_noting().unwrap();
    assert_eq!(c.num_experts, 8);
    // Read by the struct (`num_experts`, `head_dim`…) or shared bookkeeping (`model_type`,
    // `rope_theta`) is not listed; the rest is, and loading goes on.
    assert_eq!(unknown, vec!["future_knob", "router_aux_loss_coef"]);
    assert!(parse_qwen3_moe(&v).is_ok());
    // The hand-written dialect (Kimi-Linear, K3) follows the same policy.
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kimi-linear/config.json"
    );
    let mut k: Value = serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
    k["future_knob"] = json!(true);
    k["linear_attn_config"]["future_kda_knob"] = json!(1);
    assert!(Spec::<KimiLinearConfig>::from_value_typed(&k, path).is_ok());
}
