//! Per-request token selection around the sampler: logit bias, presence / frequency /
//! repetition penalties, a grammar constraint (a mask over the vocabulary), and log-probabilities.
//!
//! One [`Decoder`] belongs to one sequence. For every row the order is fixed: copy the target's
//! logits, add `logit_bias`, apply the penalties (presence and frequency over the generated
//! tokens, repetition over prompt and generated tokens, as vLLM does), mask what the constraint
//! forbids (`-inf`), then [`Sampling::pick`]. Log-probabilities are the fp32 log-softmax of that
//! processed row at temperature 1 (after the mask when constrained), computed with a fixed
//! summation order. Nothing here depends on the batch or on drafts: the decoder sees the rows of
//! its own sequence in position order and [`Decoder::accept`] advances it only by tokens that are
//! emitted, so verification of drafted rows reproduces plain decoding exactly.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

use super::sampling::Sampling;
use crate::error::{Error, Result};

/// A grammar-style restriction on which token may come next.
pub trait TokenConstraint: Send + Debug {
    /// Set the logit of every token that may not come next to `-inf`. Fails when nothing may.
    fn mask(&mut self, logits: &mut [f32]) -> Result<()>;
    /// Advance past `token` (one the mask allowed).
    fn accept(&mut self, token: u32) -> Result<()>;
    /// Whether `token` may come next, if that can be told without a whole mask (`None`: it
    /// cannot; compute the mask). Lets greedy decoding skip the mask when the model's own
    /// choice is allowed: the masked argmax is then that same token.
    fn allows(&mut self, _token: u32) -> Result<Option<bool>> {
        Ok(None)
    }
}

/// Starts a fresh [`TokenConstraint`] per sequence (a request with `n` choices starts `n`).
pub trait ConstraintFactory: Send + Sync + Debug {
    fn start(&self) -> Result<Box<dyn TokenConstraint>>;
}

/// The neutral value of every field changes nothing: [`DecodeOptions::default`].
#[derive(Debug, Clone, Default)]
pub struct DecodeOptions {
    /// Added to the logit of each listed id (ids inside the vocabulary).
    pub logit_bias: Vec<(u32, f32)>,
    /// Subtracted once from the logit of every token already generated.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every token already generated.
    pub frequency_penalty: f32,
    /// HF-style: positive logits of seen tokens (prompt or output) divided by it, negative ones
    /// multiplied. `0` or `1` is neutral.
    pub repetition_penalty: f32,
    /// `Some(k)`: report the chosen token's log-probability and the `k` most likely tokens.
    pub logprobs: Option<usize>,
    /// A grammar the output must follow.
    pub constraint: Option<Arc<dyn ConstraintFactory>>,
}

impl DecodeOptions {
    /// Whether every setting is neutral (the decoder then only samples).
    pub fn is_neutral(&self) -> bool {
        self.logit_bias.is_empty()
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
            && !self.repetition_active()
            && self.logprobs.is_none()
            && self.constraint.is_none()
    }

    fn repetition_active(&self) -> bool {
        self.repetition_penalty != 0.0 && self.repetition_penalty != 1.0
    }

    /// Check ranges against a vocabulary of `vocab` ids.
    pub fn validate(&self, vocab: usize) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(Error::InvalidArgument { field, reason });
        if let Some(&(id, _)) = self.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
            return bad(
                "logit_bias",
                format!("token id {id} is outside the vocabulary ({vocab})"),
            );
        }
        if self.logit_bias.iter().any(|(_, b)| !b.is_finite()) {
            return bad("logit_bias", "biases must be finite".into());
        }
        for (field, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !v.is_finite() {
                return bad(field, format!("must be finite, got {v}"));
            }
        }
        let r = self.repetition_penalty;
        if !r.is_finite() || r < 0.0 {
            return bad("repetition_penalty", format!("must be > 0, got {r}"));
        }
        Ok(())
    }
}

/// The log-probabilities of one chosen token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// The most likely tokens, most likely first (lowest id first on ties); tokens a constraint
    /// forbids are never among them, so there may be fewer than asked for.
    pub top: Vec<(u32, f32)>,
}

/// One decision of a [`Decoder`].
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    pub token: u32,
    pub logprobs: Option<TokenLogprobs>,
}

/// The token-selection state of one sequence.
#[derive(Debug)]
pub struct Decoder {
    sampling: Sampling,
    opts: DecodeOptions,
    constraint: Option<Box<dyn TokenConstraint>>,
    /// Occurrences of each generated token.
    generated: HashMap<u32, u32>,
    /// Tokens of the prompt and of the output (for the repetition penalty), each once.
    seen: HashSet<u32>,
    scratch: Vec<f32>,
    mask_nanos: u64,
    masked_rows: u64,
}

impl Decoder {
    /// A decoder for a sequence whose prompt is `prompt`.
    pub fn new(sampling: Sampling, opts: DecodeOptions, prompt: &[u32]) -> Result<Decoder> {
        let constraint = match &opts.constraint {
            Some(f) => Some(f.start()?),
            None => None,
        };
        let seen = if opts.repetition_active() {
            prompt.iter().copied().collect()
        } else {
            HashSet::new()
        };
        Ok(Decoder {
            sampling,
            opts,
            constraint,
            generated: HashMap::new(),
            seen,
            scratch: Vec::new(),
            mask_nanos: 0,
            masked_rows: 0,
        })
    }

    /// The sampling settings.
    pub fn sampling(&self) -> Sampling {
        self.sampling
    }

    /// Nanoseconds spent computing constraint masks, and rows masked.
    pub fn mask_time(&self) -> (u64, u64) {
        (self.mask_nanos, self.masked_rows)
    }

    /// Choose the token at absolute `position` from the target's `logits` row. Does not advance
    /// the decoder: call [`Decoder::accept`] with the token once it is emitted.
    pub fn pick(&mut self, logits: &[f32], position: usize) -> Result<Pick> {
        if self.opts.is_neutral() {
            return Ok(Pick {
                token: self.sampling.pick(logits, position),
                logprobs: None,
            });
        }
        let mut row = std::mem::take(&mut self.scratch);
        row.clear();
        row.extend_from_slice(logits);
        self.adjust(&mut row);
        if let Some(token) = self.greedy_fast_path(&row)? {
            self.scratch = row;
            return Ok(Pick {
                token,
                logprobs: None,
            });
        }
        self.apply_mask(&mut row)?;
        let token = self.sampling.pick(&row, position);
        let logprobs = self.opts.logprobs.map(|k| logprobs_of(&row, token, k));
        self.scratch = row;
        Ok(Pick { token, logprobs })
    }

    /// Greedy without log-probabilities under a constraint: the argmax of the adjusted but
    /// unmasked row, if the constraint allows it, is the masked argmax too (the highest logit,
    /// lowest id on ties, of the whole row is also that of any subset containing it), so the mask
    /// is skipped. `None`: the mask decides.
    fn greedy_fast_path(&mut self, row: &[f32]) -> Result<Option<u32>> {
        if self.sampling != Sampling::Greedy || self.opts.logprobs.is_some() {
            return Ok(None);
        }
        let Some(c) = self.constraint.as_mut() else {
            return Ok(None);
        };
        let token = crate::kernels::ops::argmax(row) as u32;
        let started = Instant::now();
        let allowed = c.allows(token)?;
        self.mask_nanos += started.elapsed().as_nanos() as u64;
        if allowed == Some(true) {
            self.masked_rows += 1;
            return Ok(Some(token));
        }
        Ok(None)
    }

    /// The constraint's mask, timed.
    fn apply_mask(&mut self, row: &mut [f32]) -> Result<()> {
        if let Some(c) = self.constraint.as_mut() {
            let started = Instant::now();
            let masked = c.mask(row);
            self.mask_nanos += started.elapsed().as_nanos() as u64;
            self.masked_rows += 1;
            masked?;
        }
        Ok(())
    }

    /// Bias and penalties.
    fn adjust(&self, row: &mut [f32]) {
        for &(id, bias) in &self.opts.logit_bias {
            row[id as usize] += bias;
        }
        let (presence, frequency) = (self.opts.presence_penalty, self.opts.frequency_penalty);
        if presence != 0.0 || frequency != 0.0 {
            for (&id, &count) in &self.generated {
                if let Some(x) = row.get_mut(id as usize) {
                    *x -= presence + frequency * count as f32;
                }
            }
        }
        if self.opts.repetition_active() {
            let r = self.opts.repetition_penalty;
            for &id in &self.seen {
                if let Some(x) = row.get_mut(id as usize) {
                    *x = if *x > 0.0 { *x / r } else { *x * r };
                }
            }
        }
    }

    /// Advance past an emitted `token`.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        if let Some(c) = self.constraint.as_mut() {
            c.accept(token)?;
        }
        if self.opts.presence_penalty != 0.0 || self.opts.frequency_penalty != 0.0 {
            *self.generated.entry(token).or_insert(0) += 1;
        }
        if self.opts.repetition_active() {
            self.seen.insert(token);
        }
        Ok(())
    }
}

/// Log-softmax of `row` at `token`, and the `k` most likely entries (pure; fixed order: the
/// maximum, then the sum of `exp(x - max)` in index order, in f64).
pub fn logprobs_of(row: &[f32], token: u32, k: usize) -> TokenLogprobs {
    let max = row
        .iter()
        .copied()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| ((x - max) as f64).exp())
        .sum();
    let log_z = max as f64 + sum.ln();
    let lp = |x: f32| (x as f64 - log_z) as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k);
    if k > 0 {
        // Masked (-inf) tokens are impossible, not merely unlikely: they are never listed.
        let mut order: Vec<usize> = (0..row.len())
            .filter(|&i| !row[i].is_nan() && row[i] != f32::NEG_INFINITY)
            .collect();
        let cut = k.min(order.len());
        let cmp = |a: &usize, b: &usize| row[*b].total_cmp(&row[*a]).then(a.cmp(b));
        if cut < order.len() {
            order.select_nth_unstable_by(cut, cmp);
            order.truncate(cut);
        }
        order.sort_by(cmp);
        top = order.into_iter().map(|i| (i as u32, lp(row[i]))).collect();
    }
    TokenLogprobs {
        token,
        logprob: row.get(token as usize).map_or(f32::NEG_INFINITY, |&x| lp(x)),
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct OnlyEven;
    impl TokenConstraint for OnlyEven {
        fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
            logits
                .iter_mut()
                .skip(1)
                .step_by(2)
                .for_each(|x| *x = f32::NEG_INFINITY);
            Ok(())
        }
        fn accept(&mut self, token: u32) -> Result<()> {
            assert_eq!(token % 2, 0, "the mask allowed only even ids");
            Ok(())
        }
    }
    #[derive(Debug)]
    struct Even;
    impl ConstraintFactory for Even {
        fn start(&self) -> Result<Box<dyn TokenConstraint>> {
            Ok(Box::new(OnlyEven))
        }
    }

    fn decoder(opts: DecodeOptions) -> Decoder {
        Decoder::new(Sampling::Greedy, opts, &[3]).unwrap()
    }

    #[test]
    fn neutral_options_are_plain_sampling() {
        let mut d = decoder(DecodeOptions::default());
        let p = d.pick(&[0.0, 2.0, 1.0], 0).unwrap();
        assert_eq!(
            p,
            Pick {
                token: 1,
                logprobs: None
            }
        );
    }

    #[test]
    fn bias_penalties_and_mask_apply_in_order() {
        let opts = DecodeOptions {
            logit_bias: vec![(2, 5.0)],
            ..Default::default()
        };
        assert_eq!(decoder(opts).pick(&[0.0, 2.0, 1.0], 0).unwrap().token, 2);
        let opts = DecodeOptions {
            frequency_penalty: 1.5,
            ..Default::default()
        };
        let mut d = decoder(opts);
        d.accept(1).unwrap();
        assert_eq!(d.pick(&[0.0, 2.0, 1.0], 1).unwrap().token, 2);
        d.accept(1).unwrap();
        // 2 - 3.0 = -1 < 0.0
        assert_eq!(d.pick(&[0.0, 2.0, 1.0], 2).unwrap().token, 2);
        let opts = DecodeOptions {
            repetition_penalty: 4.0,
            ..Default::default()
        };
        // prompt token 3: 4.0 / 4 = 1.0 < 1.5
        assert_eq!(decoder(opts).pick(&[0.0, 0.5, 1.5, 4.0], 0).unwrap().token, 2);
        let opts = DecodeOptions {
            constraint: Some(Arc::new(Even)),
            ..Default::default()
        };
        let mut d = decoder(opts);
        let p = d.pick(&[0.0, 9.0, 1.0, 8.0], 0).unwrap();
        assert_eq!(p.token, 2);
        d.accept(p.token).unwrap();
    }

    #[test]
    fn logprobs_are_the_log_softmax_of_the_processed_row() {
        let row = [1.0f32, 3.0, 3.0, f32::NEG_INFINITY];
        let lp = logprobs_of(&row, 2, 3);
        let z = (1f64.exp() + 2.0 * 3f64.exp()).ln();
        assert!((lp.logprob as f64 - (3.0 - z)).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2, 0]);
        let opts = DecodeOptions {
            logprobs: Some(2),
            constraint: Some(Arc::new(Even)),
            ..Default::default()
        };
        let p = decoder(opts).pick(&[0.0, 9.0, 1.0, 8.0], 0).unwrap();
        let lp = p.logprobs.unwrap();
        assert_eq!(lp.top[0].0, p.token);
        assert_eq!(lp.top.len(), 2);
        assert!(lp.top.iter().all(|t| t.0 % 2 == 0));
        let only_one = logprobs_of(&[f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY], 1, 5);
        assert_eq!(only_one.top, vec![(1, 0.0)]);
    }

    #[test]
    fn validation_names_the_field() {
        let bad = DecodeOptions {
            logit_bias: vec![(10, 1.0)],
            ..Default::default()
        };
        assert!(bad.validate(10).unwrap_err().to_string().contains("logit_bias"));
        assert!(DecodeOptions::default().validate(10).is_ok());
    }
}
