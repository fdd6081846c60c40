//! `deltafin bench spec`: what speculative decoding buys, per proposer, at controlled
//! acceptance rates, on a model in memory or one streaming experts from disk.
//!
//! A target-only run gives the reference tokens and the baseline tokens/s. Each proposer then
//! runs wrapped in a *controlled* proposer: the real proposer is asked for its draft (so its
//! whole cost — the draft head's forward, the Qwen drafter's translation — is paid and its state
//! kept in step), and each position of the draft is then replaced by the reference token with
//! probability `a` (a draw keyed by position) or by a wrong token otherwise. That makes the
//! acceptance rate a knob while everything else is the real code path. Every run's tokens are
//! checked against the reference; the table shows tokens/s against target-only under the
//! economics gate (`auto`) and with drafting forced on (`on`), so the gate's decisions are
//! visible where drafting loses.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use clap::Args;
use deltafin_engine::arch::{self, Model};
use deltafin_engine::cache::OocRuntime;
use deltafin_engine::generate::{Flow, GenerateOptions, Sampling, generate_with, uniform};
use deltafin_engine::spec::dspark::DSpark;
use deltafin_engine::spec::mtp::Mtp;
use deltafin_engine::spec::ngram::Ngram;
use deltafin_engine::spec::qwen::{QwenDraftConfig, QwenDrafter};
use deltafin_engine::spec::{EconomicsConfig, Observation, Proposal, Proposer, ProposerKind, Speculator};
use deltafin_engine::synth::DSparkSynth;
use deltafin_engine::tokenizer::Tokenizer;
use serde::Serialize;

/// Arguments of `deltafin bench spec`.
#[derive(Debug, Args)]
pub struct SpecBenchArgs {
    /// Target model (default: the synthetic MoE of `deltafin bench serve`).
    #[arg(long, env = "DELTAFIN_MODEL")]
    model: Option<PathBuf>,
    /// Routing locality of the default model (0 = routes follow the token, 1 = the context;
    /// default 0.5): with more locality, the rows of a verify pass share more experts.
    #[arg(long, env = "DELTAFIN_ROUTE_LOCALITY")]
    route_locality: Option<f32>,
    /// Qwen3 drafter directory (default MODEL/drafts/qwen; the proposer is skipped without one).
    #[arg(long, env = "DELTAFIN_DRAFT_QWEN")]
    draft_qwen: Option<PathBuf>,
    /// Proposers to measure (`mtp`: the model's own multi-token-prediction module, when its
    /// checkpoint has one).
    #[arg(
        long,
        default_value = "ngram,dspark,qwen",
        value_delimiter = ',',
        env = "DELTAFIN_PROPOSERS"
    )]
    proposers: Vec<String>,
    /// Acceptance rates to impose.
    #[arg(
        long,
        default_value = "0.3,0.6,0.9",
        value_delimiter = ',',
        env = "DELTAFIN_RATES"
    )]
    rates: Vec<f64>,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 64, env = "DELTAFIN_TOKENS")]
    tokens: usize,
    /// Prompt length.
    #[arg(long, default_value_t = 32, env = "DELTAFIN_PROMPT_TOKENS")]
    prompt_tokens: usize,
    /// A text prompt (encoded by the model's tokenizer) instead of `--prompt-tokens` fixed ids:
    /// natural acceptance rates depend on the text a trained model continues.
    #[arg(long, env = "DELTAFIN_PROMPT")]
    prompt: Option<String>,
    /// Widest draft.
    #[arg(long, default_value_t = 8, env = "DELTAFIN_SPEC_MAX_WIDTH")]
    max_width: usize,
    /// Repetitions of each configuration, each right after its own target-only run; the table
    /// shows medians (the machines are shared and noisy: compare ratios from adjacent runs).
    #[arg(long, default_value_t = 3, env = "DELTAFIN_REPEAT")]
    repeat: usize,
    /// Print one JSON object instead of a table.
    #[arg(long, env = "DELTAFIN_JSON")]
    json: bool,
    #[command(flatten)]
    ooc: crate::cli::ooc_args::OocArgs,
}

/// Wraps a real proposer and imposes an acceptance rate on its drafts.
#[derive(Debug)]
struct Controlled {
    inner: Box<dyn Proposer>,
    reference: Arc<Vec<u32>>,
    prompt_len: usize,
    rate: f64,
    vocab: u32,
}

impl Proposer for Controlled {
    fn kind(&self) -> ProposerKind {
        self.inner.kind()
    }

    fn captures(&self) -> &[String] {
        self.inner.captures()
    }

    fn propose(
        &mut self,
        target: &dyn Model,
        history: &[u32],
        max: usize,
    ) -> deltafin_engine::Result<Proposal> {
        let _ = self.inner.propose(target, history, max)?; // pay the real proposer's cost
        let emitted = history.len() - self.prompt_len;
        let tokens = (0..max)
            .map_while(|j| self.reference.get(emitted + j).map(|&t| (j, t)))
            .map(|(j, t)| {
                if uniform(0xACCE, (emitted + j) as u64) < self.rate {
                    t
                } else {
                    (t + 1) % self.vocab
                }
            })
            .collect();
        Ok(Proposal::new(tokens))
    }

    fn observe(&mut self, target: &dyn Model, obs: &Observation<'_>) -> deltafin_engine::Result<()> {
        self.inner.observe(target, obs)
    }
}

/// One measured configuration.
#[derive(Debug, Serialize)]
struct Row {
    proposer: String,
    /// Imposed per-draft acceptance (`None`: the proposer's own drafts).
    rate: Option<f64>,
    mode: &'static str,
    decode_tokens_per_second: f64,
    /// The adjacent target-only runs (median).
    baseline_tokens_per_second: f64,
    /// Median over the repetitions of (this run / the target-only run just before it).
    speedup: f64,
    drafts: u64,
    draft_tokens: u64,
    accepted_tokens: u64,
    mean_accepted: f64,
    target_only_steps: u64,
    switched_off: u64,
    draft_seconds: f64,
    verify_seconds: f64,
    identical: bool,
}

struct Bench {
    model: Box<dyn Model>,
    prompt: Vec<u32>,
    opts: GenerateOptions,
    reference: Arc<Vec<u32>>,
    dspark: Option<Arc<DSpark>>,
    qwen: Option<Arc<QwenDrafter>>,
    mtp: Option<Arc<Mtp>>,
    max_width: usize,
}

impl Bench {
    fn proposer(&self, name: &str) -> Option<Box<dyn Proposer>> {
        match name {
            "ngram" => Some(Box::new(Ngram::default())),
            "dspark" => self
                .dspark
                .as_ref()
                .map(|d| Box::new(d.session(8192)) as Box<dyn Proposer>),
            "qwen" => self
                .qwen
                .as_ref()
                .map(|q| Box::new(q.session()) as Box<dyn Proposer>),
            "mtp" => self
                .mtp
                .as_ref()
                .map(|m| Box::new(m.session()) as Box<dyn Proposer>),
            _ => None,
        }
    }

    /// Target-only decode tokens/s.
    fn plain(&self) -> Result<f64> {
        let m = self.model.as_ref();
        let g = generate_with(m, &mut m.new_state(), &self.prompt, &self.opts, None, |_| {
            Flow::Continue
        })?;
        ensure!(
            g.output_ids == *self.reference,
            "a target-only run changed its output"
        );
        Ok(g.stats.decode_tokens_per_second)
    }

    /// `repeat` runs of a configuration, each right after a target-only run; medians.
    fn measure(&self, name: &str, rate: Option<f64>, forced: bool, repeat: usize) -> Result<Option<Row>> {
        let (mut rows, mut bases) = (Vec::new(), Vec::new());
        for _ in 0..repeat.max(1) {
            let base = self.plain()?;
            let Some(row) = self.once(name, rate, forced, base)? else {
                return Ok(None);
            };
            bases.push(base);
            rows.push(row);
        }
        let speedup = median(rows.iter().map(|r| r.speedup).collect());
        let rate_tps = median(rows.iter().map(|r| r.decode_tokens_per_second).collect());
        let identical = rows.iter().all(|r| r.identical);
        let mut row = rows.pop().expect("at least one run");
        row.speedup = speedup;
        row.decode_tokens_per_second = rate_tps;
        row.baseline_tokens_per_second = median(bases);
        row.identical = identical;
        Ok(Some(row))
    }

    fn once(&self, name: &str, rate: Option<f64>, forced: bool, baseline: f64) -> Result<Option<Row>> {
        let Some(inner) = self.proposer(name) else {
            return Ok(None);
        };
        let proposer: Box<dyn Proposer> = match rate {
            None => inner,
            Some(rate) => Box::new(Controlled {
                inner,
                reference: self.reference.clone(),
                prompt_len: self.prompt.len(),
                rate,
                vocab: self.model.info().vocab_size as u32,
            }),
        };
        let cfg = EconomicsConfig {
            forced,
            max_width: self.max_width,
            ..Default::default()
        };
        let mut spec = Speculator::new(vec![proposer], &cfg, None);
        let mut state = self.model.new_state();
        let g = generate_with(
            self.model.as_ref(),
            &mut state,
            &self.prompt,
            &self.opts,
            Some(&mut spec),
            |_| Flow::Continue,
        )?;
        let s = spec.summary();
        let p = s.proposers.values().next().cloned().unwrap_or_default();
        Ok(Some(Row {
            proposer: name.into(),
            rate,
            mode: if forced { "on" } else { "auto" },
            decode_tokens_per_second: g.stats.decode_tokens_per_second,
            baseline_tokens_per_second: baseline,
            speedup: g.stats.decode_tokens_per_second / baseline,
            drafts: p.proposals,
            draft_tokens: p.draft_tokens,
            accepted_tokens: p.accepted_tokens,
            mean_accepted: if p.proposals == 0 {
                0.0
            } else {
                p.accepted_tokens as f64 / p.proposals as f64
            },
            target_only_steps: s.target_only_steps,
            switched_off: p.switched_off,
            draft_seconds: p.draft_seconds,
            verify_seconds: p.verify_seconds,
            identical: g.output_ids == *self.reference,
        }))
    }
}

fn load(dir: &Path, args: &SpecBenchArgs) -> Result<(Box<dyn Model>, Option<OocRuntime>)> {
    let budgeted = args.ooc.explicit() || arch::supports_budget(dir)?;
    Ok(match args.ooc.options()?.filter(|_| budgeted) {
        None => (
            arch::load(dir).with_context(|| format!("loading {}", dir.display()))?,
            None,
        ),
        Some(mut o) => {
            if args.proposers.iter().any(|p| p == "mtp") {
                deltafin_server::drafts::reserve_mtp(dir, &mut o)?;
            }
            let (m, rt) =
                arch::load_budgeted(dir, &o).with_context(|| format!("loading {}", dir.display()))?;
            eprintln!("{}", crate::cli::ooc_args::describe_plan(&rt.plan, &rt.read));
            (m, Some(rt))
        }
    })
}

pub fn run(args: SpecBenchArgs, cache_dir: &Path) -> Result<()> {
    let shape = args.route_locality.map(|l| {
        let name = format!("locality{:.0}", 100.0 * l);
        let shape = deltafin_engine::synth::RoutingShape {
            locality: l,
            ..Default::default()
        };
        (name, shape)
    });
    let dir = crate::bench::serve::resolve_with(
        args.model.clone(),
        cache_dir,
        shape.as_ref().map(|(n, s)| (n.as_str(), *s)),
    )?;
    let (model, _ooc) = load(&dir, &args)?;
    let tok = Arc::new(Tokenizer::from_dir(&dir).with_context(|| format!("tokenizer of {}", dir.display()))?);
    let vocab = model.info().vocab_size;
    let prompt: Vec<u32> = match &args.prompt {
        Some(text) => tok.encode_prompt(text),
        None => (0..args.prompt_tokens.max(1))
            .map(|i| ((i * 37 + 11) % vocab.min(256)) as u32)
            .collect(),
    };
    ensure!(!prompt.is_empty(), "the prompt encodes to no tokens");
    let opts = GenerateOptions {
        max_new_tokens: args.tokens.max(2),
        sampling: Sampling::Greedy,
        stop_ids: vec![],
        prefill_chunk: 256,
    };
    let plain = |m: &dyn Model| -> Result<deltafin_engine::generate::Generation> {
        Ok(generate_with(
            m,
            &mut m.new_state(),
            &prompt,
            &opts,
            None,
            |_| Flow::Continue,
        )?)
    };
    plain(model.as_ref())?; // warm-up (page cache, expert cache)
    let reference = plain(model.as_ref())?;
    let baseline = reference.stats.decode_tokens_per_second;
    ensure!(baseline > 0.0, "the target-only run measured no decode time");
    let head_dir = tempfile::tempdir()?;
    DSparkSynth::for_target(model.info(), 5).write(head_dir.path())?;
    let head = DSpark::load(head_dir.path())?;
    head.check_target(model.as_ref())?;
    let qwen_dir = args
        .draft_qwen
        .clone()
        .or_else(|| Some(dir.join("drafts/qwen")).filter(|d| d.join("config.json").is_file()));
    let qwen = match qwen_dir {
        Some(d) => Some(Arc::new(QwenDrafter::load(
            &d,
            tok.clone(),
            QwenDraftConfig::default(),
        )?)),
        None => None,
    };
    let mtp = match args.proposers.iter().any(|p| p == "mtp") {
        true => match deltafin_engine::arch::load_mtp(&dir)? {
            Some(module) => {
                let m = Mtp::new(module);
                m.check_target(model.as_ref())?;
                Some(Arc::new(m))
            }
            None => None,
        },
        false => None,
    };
    let bench = Bench {
        model,
        prompt: prompt.clone(),
        opts: opts.clone(),
        reference: Arc::new(reference.output_ids.clone()),
        dspark: Some(Arc::new(head)),
        qwen,
        mtp,
        max_width: args.max_width.max(1),
    };
    let mut rows = Vec::new();
    for name in &args.proposers {
        let rates = std::iter::once(None).chain(args.rates.iter().map(|&r| Some(r)));
        for rate in rates {
            for forced in [false, true] {
                if let Some(row) = bench.measure(name, rate, forced, args.repeat)? {
                    rows.push(row);
                }
            }
        }
    }
    ensure!(
        rows.iter().all(|r| r.identical),
        "a drafted run changed the output: {rows:?}"
    );
    report(&args, &dir, baseline, &rows)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn report(args: &SpecBenchArgs, dir: &Path, baseline: f64, rows: &[Row]) -> Result<()> {
    if args.json {
        let out = serde_json::json!({"model": dir, "memory_budget": args.ooc.memory_budget, "tokens": args.tokens,
            "target_only_tokens_per_second": baseline, "rows": rows});
        println!("{out}");
        return Ok(());
    }
    println!(
        "model: {}  memory budget: {}  target-only: {baseline:.2} tok/s (first run; each row has its own adjacent baselines, {} repetitions, medians)",
        dir.display(),
        args.ooc.memory_budget,
        args.repeat
    );
    println!(
        "{:>8} {:>6} {:>5} {:>9} {:>9} {:>8} {:>7} {:>9} {:>8} {:>9} {:>6} {:>8} {:>8}",
        "proposer",
        "rate",
        "mode",
        "tok/s",
        "base t/s",
        "speedup",
        "drafts",
        "accepted",
        "mean acc",
        "plain st",
        "offs",
        "draft s",
        "verify s"
    );
    for r in rows {
        println!(
            "{:>8} {:>6} {:>5} {:>9.2} {:>9.2} {:>7.2}x {:>7} {:>9} {:>8.2} {:>9} {:>6} {:>8.3} {:>8.3}",
            r.proposer,
            r.rate.map_or("own".into(), |a| format!("{a:.1}")),
            r.mode,
            r.decode_tokens_per_second,
            r.baseline_tokens_per_second,
            r.speedup,
            r.drafts,
            format!("{}/{}", r.accepted_tokens, r.draft_tokens),
            r.mean_accepted,
            r.target_only_steps,
            r.switched_off,
            r.draft_seconds,
            r.verify_seconds
        );
    }
    println!(
        "every run's tokens equal the target-only run's: {}",
        rows.iter().all(|r| r.identical)
    );
    Ok(())
}
