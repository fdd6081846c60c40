//! `deltafin run`: one generation from a model directory (default: the built-in synthetic
//! model), under the memory budget. Prompts are byte-level token ids (the synthetic models'
//! tokenizer) until the tokenizer module lands.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use deltafin_engine::arch;
use deltafin_engine::generate::{Flow, GenerateOptions, Sampling, generate};

use crate::ooc_args::{OocArgs, describe_plan};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Model directory; without it, the built-in default model (generated on first use).
    #[arg(long, env = "DELTAFIN_MODEL")]
    pub model: Option<PathBuf>,
    #[arg(long, default_value = "The license grants", env = "DELTAFIN_PROMPT")]
    pub prompt: String,
    #[arg(long, default_value_t = 16, env = "DELTAFIN_MAX_NEW")]
    pub max_new: usize,
    #[command(flatten)]
    pub ooc: OocArgs,
    /// Print statistics (plan, bytes by source) to stderr.
    #[arg(long)]
    pub stats: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: RunArgs) -> Result<()> {
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => {
            let d = std::env::temp_dir().join("deltafin-builtin");
            deltafin_engine::synth::ensure_builtin(&d)?;
            d
        }
    };
    let (model, runtime) = match a.ooc.options()? {
        None => (arch::load(&dir).with_context(|| dir.display().to_string())?, None),
        Some(o) => {
            let (m, rt) = arch::load_budgeted(&dir, &o).with_context(|| dir.display().to_string())?;
            eprintln!("{}", describe_plan(&rt.plan));
            if let Some(note) = &rt.heat_note {
                eprintln!("heat: {note}");
            }
            (m, Some(rt))
        }
    };
    let prompt: Vec<u32> = a.prompt.bytes().map(u32::from).collect();
    let opts = GenerateOptions {
        max_new_tokens: a.max_new,
        sampling: Sampling::Greedy,
        stop_ids: model.info().eos_token_ids.clone(),
        prefill_chunk: 64,
    };
    let mut state = model.new_state();
    let g = generate(model.as_ref(), &mut state, &prompt, &opts, |_| Flow::Continue)?;
    if let Some(rt) = &runtime {
        rt.flush_heat()?;
    }
    let stats = runtime.as_ref().map(|rt| rt.stats());
    if a.json {
        println!("{}", serde_json::json!({"output_ids": g.output_ids, "finish_reason": g.finish_reason, "stats": g.stats, "out_of_core": stats}));
    } else {
        let text: String = g.output_ids.iter().map(|&t| if t < 256 { char::from(t as u8) } else { '\u{fffd}' }).collect();
        println!("{text}");
        eprintln!("ids {:?}; decode {:.2} tok/s", g.output_ids, g.stats.decode_tokens_per_second);
        if a.stats && let Some(s) = stats {
            eprintln!("{}", serde_json::to_string_pretty(&s)?);
        }
    }
    Ok(())
}
