//! Whole passes of the shared decoder on a device, for every layer kind: grouped-query
//! attention, MLA (DSA included), KDA, gated DeltaNet and DeepSeek-V4's attention, under the
//! plain residual, Block Attention Residuals or hyper-connections. Activations, latent caches
//! and recurrent states stay on the device; tokens go in, the last row's logits come out
//! (`model::layers::device`). A DSA layer's index scores and attention run on the device, its
//! keys and queries on the host, their top-k on the device (`layers::device::choose_dsa`). A
//! DeepSeek-V4 attention layer keeps its cache of record on the host (windows, entries pooled
//! as windows close) and runs its projections, indexer and attention on the device
//! (`layers::device_v4`). Out of core, routed experts come from the expert store (host cache,
//! then disk) and are uploaded through the device's expert tier.

use super::super::layers::compressed::CompressedRows;
use super::super::layers::device::{
    self, DeviceCache, DeviceDelta, DeviceKdaState, DeviceMla, IndexPool, OnDevice,
};
use super::super::layers::device_v4::{V4Pool, V4Pools, v4_core};
use super::super::layers::dsa::{Selection, Sparse};
use super::super::layers::mla::{MlaProjected, MlaRows};
use super::super::layers::ops::Ops;
use super::stack::{self, Stack};
use super::{Decoder, Layer, Mixer, missing_res};
use crate::backend::device::DeviceOps;
use crate::error::{Error, Result};
use crate::state::{CompressedCache, MlaCache};

/// One layer's mixer on the device: its constants and the sequence's state.
enum DeviceMixer<B> {
    Attention(DeviceCache<B>),
    /// MLA: its constants, latent cache, and with a DSA indexer its keys: on the device (the
    /// scores read them) and on the host (the state `Mla::select` appends to).
    Mla(DeviceMla<B>, DeviceCache<B>, Option<(B, MlaCache)>),
    Kda(DeviceDelta<B>, DeviceKdaState<B>),
    DeltaNet(DeviceDelta<B>, DeviceKdaState<B>),
    /// DeepSeek-V4's attention: its cache of record on the host; its entries (and indexer keys)
    /// also on the device, where the projections, indexer and attention run.
    Compressed(CompressedCache, Option<SessionV4<B>>),
}

impl<B> DeviceMixer<B> {
    /// Upload `mixer`'s constants and make a fresh state of up to `capacity` positions.
    fn new<D: DeviceOps<Buf = B>>(dev: &D, mixer: &Mixer, capacity: usize) -> Result<Self> {
        Ok(match mixer {
            Mixer::Mla(m) => {
                let cache = DeviceCache::new(dev, [m.dims.kv_lora, m.dims.rope], capacity)?;
                let index = match &m.sparse {
                    Some(Sparse::Index(ix)) => {
                        Some((dev.zeros_f32(capacity * ix.dims().head_dim)?, MlaCache::default()))
                    }
                    _ => None,
                };
                DeviceMixer::Mla(DeviceMla::new(dev, m)?, cache, index)
            }
            Mixer::Kda(k) => DeviceMixer::Kda(DeviceDelta::kda(dev, k)?, DeviceKdaState::new(dev, k.shape)?),
            Mixer::DeltaNet(g) => {
                let state = DeviceKdaState::new(dev, g.shape)?;
                DeviceMixer::DeltaNet(DeviceDelta::gated_deltanet(dev, g)?, state)
            }
            Mixer::Attention(g) => {
                let kw = g.dims().kv_heads * g.dims().head_dim;
                DeviceMixer::Attention(DeviceCache::new(dev, [kw, kw], capacity)?)
            }
            Mixer::Compressed(c) => {
                let ratio = c.kind.ratio();
                let windows = capacity / ratio.max(1) + 1;
                let keys = c
                    .indexer
                    .as_ref()
                    .map(|ix| dev.zeros_f32(windows * ix.dims.head_dim));
                let v4 = match ratio {
                    0 => None,
                    _ => Some(SessionV4 {
                        entries: dev.zeros_f32(windows * c.dims.head_dim)?,
                        keys: keys.transpose()?,
                        held: 0,
                        capacity,
                    }),
                };
                DeviceMixer::Compressed(CompressedCache::new(ratio, c.dims.window), v4)
            }
        })
    }

    /// `mixer` over `n` normalised rows, advancing the state; `selection`: the last full DSA
    /// layer's choice, for the layers that share it.
    fn run<D: DeviceOps<Buf = B>>(
        &mut self,
        dev: &D,
        mixer: &Mixer,
        (x, n): (&B, usize),
        selection: &mut Selection,
    ) -> Result<B> {
        match (mixer, self) {
            (Mixer::Attention(g), DeviceMixer::Attention(cache)) => {
                let rows = cache.take(n, |p| g.seen(p))?;
                let [k, v] = &cache.parts;
                device::gqa(dev, g, (x, n), (&rows, [k, v]), &mut |_| Ok(()))
            }
            (Mixer::Mla(m), DeviceMixer::Mla(c, cache, index)) => {
                let rows = cache.take(n, |p| (0, p + 1))?;
                let [latent, rope] = &cache.parts;
                let seq = vec![0; n];
                let mut choose = |p: &MlaProjected<B>| {
                    // Only a layer with an indexer reads or appends keys.
                    let (pool, mut caches) = match index.as_mut() {
                        Some((keys, host)) => (Some(IndexPool { keys, rows: &rows }), vec![host]),
                        None => (None, Vec::new()),
                    };
                    let host = &mut MlaRows {
                        caches: &mut caches,
                        seq: &seq,
                        pos: &rows.pos,
                        selection: &mut *selection,
                    };
                    device::choose_dsa(dev, m, (x, n, p), pool, host)
                };
                let mut keep = |_: [&B; 2]| Ok(());
                let cores = (&mut keep as _, &mut choose as _);
                device::mla(dev, (m, c), (x, n), (&rows, [latent, rope]), cores)
            }
            (Mixer::Kda(k), DeviceMixer::Kda(c, st)) => device::delta(dev, (k, c), x, n, st),
            (Mixer::DeltaNet(g), DeviceMixer::DeltaNet(c, st)) => device::delta(dev, (g, c), x, n, st),
            (Mixer::Compressed(c), DeviceMixer::Compressed(cache, v4)) => {
                let first = cache.kv.len();
                if let Some(v) = v4.as_ref().filter(|v| first + n > v.capacity) {
                    return Err(Error::ContextOverflow {
                        needed: first + n,
                        limit: v.capacity,
                    });
                }
                let pos: Vec<usize> = (first..first + n).collect();
                let held = [v4.as_ref().map_or(0, |v| v.held)];
                let out = c.run(&OnDevice(dev), x, n, |p| {
                    let rows = &mut CompressedRows {
                        caches: &mut [&mut *cache],
                        seq: &vec![0; n],
                        pos: &pos,
                    };
                    let pool = |rows| V4Pool {
                        rows,
                        base: &[0],
                        held: &held,
                    };
                    let pools = V4Pools {
                        keys: v4.as_ref().and_then(|v| v.keys.as_ref()).map(pool),
                        entries: v4.as_ref().map(|v| pool(&v.entries)),
                        ratio: c.kind.ratio(),
                    };
                    v4_core(dev, c, (p, n), rows, pools)
                })?;
                if let Some(v) = v4.as_mut() {
                    v.held = cache.entries.len();
                }
                Ok(out)
            }
            _ => Err(Error::InvalidArgument {
                field: "device",
                reason: "a layer's mixer differs from the one its device session was opened on".into(),
            }),
        }
    }
}

/// A compressed V4 layer's per-window rows in a session: its entries and, with an indexer, its
/// keys, the first `held` of each written.
struct SessionV4<B> {
    entries: B,
    keys: Option<B>,
    held: usize,
    /// Positions the pools have room for.
    capacity: usize,
}

/// A decoder layer's small constants on a device: its input and post-attention norm weights,
/// and its AttnRes queries before the mixer and the FFN (Block Attention Residuals). The
/// session and the served model (`served/`) upload them alike.
pub(super) struct LayerConsts<B> {
    norms: [B; 2],
    res: Option<[B; 2]>,
}

impl<B> LayerConsts<B> {
    /// `layer`'s constants uploaded to `dev`.
    pub(super) fn upload<D: DeviceOps<Buf = B>>(dev: &D, layer: &Layer) -> Result<Self> {
        let res = match &layer.res {
            Some(super::Sites::AttnRes([a, m])) => {
                Some([dev.upload_f32(&a.query)?, dev.upload_f32(&m.query)?])
            }
            Some(super::Sites::Hyper([a, m])) => Some([dev.upload_f32(&a.proj)?, dev.upload_f32(&m.proj)?]),
            None => None,
        };
        let norms = [
            dev.upload_f32(&layer.input_norm)?,
            dev.upload_f32(&layer.post_norm)?,
        ];
        Ok(LayerConsts { norms, res })
    }

    /// The norm weights ([`Stack::norms`]).
    pub(super) fn norms(&self) -> [&B; 2] {
        let [a, b] = &self.norms;
        [a, b]
    }

    /// The AttnRes queries or hyper-connection projections ([`Stack::res_queries`]).
    pub(super) fn res_queries(&self) -> Result<[&B; 2]> {
        let [a, b] = self.res.as_ref().ok_or_else(missing_res)?;
        Ok([a, b])
    }
}

/// The tail's vector before `m`'s final norm on `dev`: the AttnRes query or the hyper head's
/// projection (`None` with the plain residual).
pub(super) fn upload_output_query<D: DeviceOps>(dev: &D, m: &Decoder) -> Result<Option<D::Buf>> {
    match &m.output_res {
        Some(super::Tail::AttnRes(r)) => dev.upload_f32(&r.query).map(Some),
        Some(super::Tail::Hyper(head)) => dev.upload_f32(&head.proj).map(Some),
        None => Ok(None),
    }
}

/// One decoder layer's device-resident constants and state.
struct DeviceLayer<B> {
    consts: LayerConsts<B>,
    mixer: DeviceMixer<B>,
}

/// The device's [`Stack`]: the layers' uploaded constants and device states.
struct DeviceLayers<B> {
    layers: Vec<DeviceLayer<B>>,
    /// The AttnRes query before the final norm (Block Attention Residuals).
    output_res: Option<B>,
    /// The last full DSA layer's choice of this pass, for the layers that share it.
    selection: Selection,
}

impl<D: DeviceOps> Stack<OnDevice<'_, D>> for DeviceLayers<D::Buf> {
    fn norms<'a>(&'a self, l: usize, _: &'a Layer) -> [&'a D::Buf; 2] {
        self.layers[l].consts.norms()
    }

    fn res_queries<'a>(&'a self, l: usize, _: &'a Layer) -> Result<[&'a D::Buf; 2]> {
        self.layers[l].consts.res_queries()
    }

    fn output_query<'a>(&'a self, _: &'a Decoder) -> Result<&'a D::Buf> {
        self.output_res.as_ref().ok_or_else(missing_res)
    }

    fn mixer(
        &mut self,
        o: &OnDevice<'_, D>,
        (l, layer): (usize, &Layer),
        xn: &D::Buf,
        n: usize,
    ) -> Result<D::Buf> {
        self.layers[l]
            .mixer
            .run(o.0, &layer.mixer, (xn, n), &mut self.selection)
    }

    fn record(&mut self, _: &OnDevice<'_, D>, _: usize, _: &D::Buf, _: usize) -> Result<()> {
        Ok(())
    }
}

/// A decoder running whole passes of one sequence on a device.
pub struct DeviceSession<'m, D: DeviceOps> {
    model: &'m Decoder,
    dev: &'m D,
    stack: DeviceLayers<D::Buf>,
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
            layers.push(DeviceLayer {
                consts: LayerConsts::upload(dev, &layer)?,
                mixer: DeviceMixer::new(dev, &layer.mixer, capacity)?,
            });
        }
        Ok(DeviceSession {
            model: self,
            dev,
            stack: DeviceLayers {
                layers,
                output_res: upload_output_query(dev, self)?,
                selection: Selection::new(),
            },
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
            self.stack.layers.len(),
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

    /// Run `tokens` (the sequence's next positions) through every layer on the device (the
    /// decoder's written-once loops, `stack.rs`); the last row's logits.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let (m, o, n) = (self.model, OnDevice(self.dev), tokens.len());
        let (h, eps) = (m.plan.hidden_size, m.plan.rms_norm_eps);
        let x = o.input(super::super::embed_tokens(&m.embed, tokens)?)?;
        let (run, z) = stack::whole(m, (&o, &mut self.stack), x, (n, tokens))?;
        self.len += n;
        let last = z.as_ref().unwrap_or(&run);
        device::last_row_logits(self.dev, last, (n, h), (&self.norm, eps), &m.lm_head)
    }
}
