//! Whole passes of the shared decoder on a device, for stacks of MLA and KDA layers
//! (DeepSeek-V3, Kimi-K2, Kimi-Linear): activations, latent caches and recurrent states stay on
//! the device; tokens go in, the last row's logits come out (`model::layers::device`). Out of
//! core, routed experts come from the expert store (host cache, then disk) and are uploaded
//! through the device's expert tier. Stacks with other mixers are refused with a typed error
//! (their matrix products still run on the device through `backend::matmul`).

use super::Model;
use super::decoder::{Decoder, Ffn, Mixer};
use super::layers::device::{self, DeviceKda, DeviceKdaState, DeviceMla, DeviceMlaCache};
use super::layers::moe::ExpertProvider;
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
            Mixer::Attention(_) | Mixer::DeltaNet(_) => {
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
}

/// A decoder running whole passes of one sequence on a device.
pub struct DeviceSession<'m, D: DeviceOps> {
    model: &'m Decoder,
    dev: &'m D,
    layers: Vec<DeviceLayer<D::Buf>>,
    norm: D::Buf,
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
            layers.push(DeviceLayer {
                input_norm: dev.upload_f32(&layer.input_norm)?,
                post_norm: dev.upload_f32(&layer.post_norm)?,
                mixer: DeviceMixer::new(self, dev, &layer.mixer, capacity)?,
                bias,
            });
        }
        Ok(DeviceSession {
            model: self,
            dev,
            layers,
            norm: dev.upload_f32(&self.norm)?,
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
        let (m, dev, n) = (self.model, self.dev, tokens.len());
        let (h, eps) = (m.plan.hidden_size, m.plan.rms_norm_eps);
        let mut x = dev.upload_f32(&super::embed_tokens(&m.embed, tokens)?)?;
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
            let experts = pass.layer(l);
            let provider = experts.as_ref().map(|e| e as &dyn ExpertProvider);
            let f = match &layer.ffn {
                Ffn::Dense(mlp) => device::mlp(dev, mlp, WeightClass::Spine, &xn, n)?,
                Ffn::Moe(moe) => device::moe(dev, (moe, provider), k.bias.as_ref(), &xn, n)?,
            };
            x = device::add(dev, &x, &f, n * h)?;
        }
        pass.finish()?;
        self.len += n;
        device::last_row_logits(dev, &x, (n, h), (&self.norm, eps), &m.lm_head)
    }
}
