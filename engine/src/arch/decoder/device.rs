//! Whole passes of the shared decoder on a device, for stacks of MLA and KDA layers
//! (DeepSeek-V3, Kimi-K2, Kimi-Linear): activations, latent caches and recurrent states stay on
//! the device; tokens go in, the last row's logits come out (`model::layers::device`). Out of
//! core, routed experts come from the expert store (host cache, then disk) and are uploaded
//! through the device's expert tier. Stacks with other mixers are refused with a typed error
//! (their matrix products still run on the device through `backend::matmul`).

use super::super::Model;
use super::super::layers::device::{self, DeviceKda, DeviceKdaState, DeviceMla, DeviceMlaCache};
use super::super::layers::moe::ExpertProvider;
use super::{Decoder, Ffn, Mixer, Residual, missing_res};
use crate::backend::WeightClass;
use crate::backend::device::DeviceOps;
use crate::cache::ExpertPass;
use crate::error::{Error, Result};

/// One layer's mixer on the device: its constants and the sequence's state.
enum DeviceMixer<B> {
    Mla(DeviceMla<B>, DeviceMlaCache<B>),
    Kda(DeviceKda<B>, DeviceKdaState<B>),
}

impl<B> DeviceMixer<B> {
    /// Upload `mixer`'s constants and make a fresh state of up to `capacity` positions; the
    /// typed refusal of a mixer this path does not run.
    fn new<D: DeviceOps<Buf = B>>(model: &Decoder, dev: &D, mixer: &Mixer, capacity: usize) -> Result<Self> {
        Ok(match mixer {
            Mixer::Mla(m) if m.sparse.is_some() => {
                return Err(Error::InvalidArgument {
                    field: "device",
                    reason: format!(
                        "{}: DeepSeek Sparse Attention has no whole-pass device path yet",
                        model.info().arch
                    ),
                });
            }
            Mixer::Mla(m) => {
                let cache = DeviceMlaCache {
                    latent: dev.zeros_f32(capacity * m.dims.kv_lora)?,
                    rope: dev.zeros_f32(capacity * m.dims.rope)?,
                    len: 0,
                    capacity,
                };
                DeviceMixer::Mla(DeviceMla::new(dev, m)?, cache)
            }
            Mixer::Kda(k) => DeviceMixer::Kda(DeviceKda::new(dev, k)?, DeviceKdaState::new(dev, k)?),
            Mixer::Attention(_) | Mixer::DeltaNet(_) | Mixer::Compressed(_) => {
                return Err(Error::InvalidArgument {
                    field: "device",
                    reason: format!(
                        "{} has no whole-pass device path (stacks of MLA and KDA layers do)",
                        model.info().arch
                    ),
                });
            }
        })
    }

    /// `mixer` over `n` normalised rows, advancing the state.
    fn run<D: DeviceOps<Buf = B>>(&mut self, dev: &D, mixer: &Mixer, x: &B, n: usize) -> Result<B> {
        match (mixer, self) {
            (Mixer::Mla(m), DeviceMixer::Mla(c, cache)) => device::mla(dev, (m, c), x, n, cache),
            (Mixer::Kda(k), DeviceMixer::Kda(c, st)) => device::kda(dev, (k, c), x, n, st),
            _ => Err(Error::InvalidArgument {
                field: "device",
                reason: "a layer's mixer differs from the one its device session was opened on".into(),
            }),
        }
    }
}

/// One decoder layer's device-resident constants.
struct DeviceLayer<B> {
    input_norm: B,
    post_norm: B,
    mixer: DeviceMixer<B>,
    bias: Option<B>,
    /// The AttnRes queries before the mixer and the FFN (Block Attention Residuals).
    res: Option<[B; 2]>,
}

/// A decoder running whole passes of one sequence on a device.
pub struct DeviceSession<'m, D: DeviceOps> {
    model: &'m Decoder,
    dev: &'m D,
    layers: Vec<DeviceLayer<D::Buf>>,
    norm: D::Buf,
    /// The AttnRes query before the final norm (Block Attention Residuals).
    output_res: Option<D::Buf>,
    len: usize,
}

impl Decoder {
    /// A device session of up to `capacity` positions (its caches are allocated now); a typed
    /// refusal unless every layer is MLA or KDA.
    pub fn device_session<'m, D: DeviceOps>(
        &'m self,
        dev: &'m D,
        capacity: usize,
    ) -> Result<DeviceSession<'m, D>> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in 0..self.layers.len() {
            let layer = self.layers.get(l)?;
            let bias = match &layer.ffn {
                Ffn::Moe(m) if !m.bias.is_empty() => Some(dev.upload_f32(&m.bias)?),
                _ => None,
            };
            let res = match layer.res.as_ref().and_then(super::Sites::attn_res) {
                Some([a, m]) => Some([dev.upload_f32(&a.query)?, dev.upload_f32(&m.query)?]),
                None => None,
            };
            layers.push(DeviceLayer {
                input_norm: dev.upload_f32(&layer.input_norm)?,
                post_norm: dev.upload_f32(&layer.post_norm)?,
                mixer: DeviceMixer::new(self, dev, &layer.mixer, capacity)?,
                bias,
                res,
            });
        }
        Ok(DeviceSession {
            model: self,
            dev,
            layers,
            norm: dev.upload_f32(&self.norm)?,
            output_res: self
                .output_res
                .as_ref()
                .and_then(super::Tail::attn_res)
                .map(|r| dev.upload_f32(&r.query))
                .transpose()?,
            len: 0,
        })
    }
}

impl<D: DeviceOps> std::fmt::Debug for DeviceSession<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceSession({} layers, {} positions)",
            self.layers.len(),
            self.len()
        )
    }
}

impl<D: DeviceOps> DeviceSession<'_, D> {
    /// Positions run so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Run `tokens` (the sequence's next positions) through every layer on the device; the last
    /// row's logits.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if let Residual::AttnRes { block } = self.model.plan.residual {
            return self.forward_attn_res(tokens, block);
        }
        let (m, dev, n) = (self.model, self.dev, tokens.len());
        let (h, eps) = (m.plan.hidden_size, m.plan.rms_norm_eps);
        let mut x = dev.upload_f32(&super::super::embed_tokens(&m.embed, tokens)?)?;
        let pass = ExpertPass::open(m.experts.as_deref());
        for (l, k) in self.layers.iter_mut().enumerate() {
            let layer = m.layers.get(l)?;
            let xn = device::rms_norm(dev, &x, &k.input_norm, n, h, eps)?;
            let a = k.mixer.run(dev, &layer.mixer, &xn, n)?;
            x = device::add(dev, &x, &a, n * h)?;
            let xn = device::rms_norm(dev, &x, &k.post_norm, n, h, eps)?;
            if pass.is_out_of_core() {
                pass.hint_next(l, &dev.download_f32(&x)?, n);
            }
            let f = run_ffn(dev, &layer.ffn, (&pass, l), k.bias.as_ref(), &xn, n)?;
            x = device::add(dev, &x, &f, n * h)?;
        }
        pass.finish()?;
        self.len += n;
        device::last_row_logits(dev, &x, (n, h), (&self.norm, eps), &m.lm_head)
    }

    /// [`DeviceSession::forward`] in the Block Attention Residuals form, as
    /// `Decoder::forward_attn_res` (anchors every `block` layers, each sub-layer's input mixed
    /// over them).
    fn forward_attn_res(&mut self, tokens: &[u32], block: usize) -> Result<Vec<f32>> {
        let (m, dev, n) = (self.model, self.dev, tokens.len());
        let (h, eps) = (m.plan.hidden_size, m.plan.rms_norm_eps);
        let stack = dev.zeros_f32((self.layers.len().div_ceil(block) + 1) * n * h)?;
        let mut anchors = 0;
        let mut run = dev.upload_f32(&super::super::embed_tokens(&m.embed, tokens)?)?;
        let mix = |site: (&D::Buf, f32), anchors: usize, last: &D::Buf| -> Result<D::Buf> {
            device::stack_rows(dev, last, &stack, anchors, (n, h))?;
            device::attn_res(dev, site, &stack, anchors + 1, (n, h))
        };
        let pass = ExpertPass::open(m.experts.as_deref());
        for (l, k) in self.layers.iter_mut().enumerate() {
            let layer = m.layers.get(l)?;
            let (Some([attn_q, mlp_q]), Some([attn_res, mlp_res])) =
                (&k.res, layer.res.as_ref().and_then(super::Sites::attn_res))
            else {
                return Err(missing_res());
            };
            let u = match anchors {
                0 => None,
                _ => Some(mix((attn_q, attn_res.eps), anchors, &run)?),
            };
            let xn = device::rms_norm(dev, u.as_ref().unwrap_or(&run), &k.input_norm, n, h, eps)?;
            let a = k.mixer.run(dev, &layer.mixer, &xn, n)?;
            let p = if l % block == 0 {
                device::stack_rows(dev, &run, &stack, anchors, (n, h))?;
                anchors += 1;
                a
            } else {
                device::add(dev, &run, &a, n * h)?
            };
            let mixed = mix((mlp_q, mlp_res.eps), anchors, &p)?;
            if pass.is_out_of_core() {
                pass.hint_next(l, &dev.download_f32(&mixed)?, n);
            }
            let xn = device::rms_norm(dev, &mixed, &k.post_norm, n, h, eps)?;
            let f = run_ffn(dev, &layer.ffn, (&pass, l), k.bias.as_ref(), &xn, n)?;
            run = device::add(dev, &p, &f, n * h)?;
        }
        pass.finish()?;
        self.len += n;
        let (Some(out_q), Some(out_res)) = (
            &self.output_res,
            m.output_res.as_ref().and_then(super::Tail::attn_res),
        ) else {
            return Err(missing_res());
        };
        let z = mix((out_q, out_res.eps), anchors, &run)?;
        device::last_row_logits(dev, &z, (n, h), (&self.norm, eps), &m.lm_head)
    }
}

/// Layer `l`'s FFN over `n` normalised rows on the device.
fn run_ffn<D: DeviceOps>(
    dev: &D,
    ffn: &Ffn,
    (pass, l): (&ExpertPass<'_>, usize),
    bias: Option<&D::Buf>,
    x: &D::Buf,
    n: usize,
) -> Result<D::Buf> {
    let experts = pass.layer(l);
    let provider = experts.as_ref().map(|e| e as &dyn ExpertProvider);
    match ffn {
        Ffn::Dense(mlp) => device::mlp(dev, mlp, WeightClass::Spine, x, n),
        Ffn::Moe(moe) => device::moe(dev, (moe, provider), bias, x, n),
    }
}
