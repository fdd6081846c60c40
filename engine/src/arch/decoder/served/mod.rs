//! The server's passes on a device: [`DeviceModel`] is a [`Model`] whose batched passes run the
//! decoder's written-once layer loops (`stack.rs`) through [`OnDevice`], so `deltafin serve
//! --device cuda` keeps the activations of every row of a batch, the attention caches and the
//! attention itself on the device.
//!
//! The host [`SeqState`] stays the state of record. Each pass copies the rows it adds to a
//! device attention cache (keys and values, or MLA latents and rotated keys: a few KB per row
//! and layer) back into the host state, so commits, rollbacks, checkpoints, the reuse cache and
//! the memory accounting of the scheduler work unchanged and bit for bit as on the CPU. The
//! device's caches are mirrors in a pool of slots, one sequence per slot ([`Slots`]): a mirror
//! is current while its state's identity and pass count match ([`SeqState::passes`]); a stale
//! or evicted one is uploaded again from the host.
//!
//! Recurrent layers (KDA, gated DeltaNet) project on the device and keep their state of record
//! on the host (their staged passes, replays and checkpoints live there): the convolution and
//! gates run there, and the delta rule of a sequence with [`DEVICE_RECURRENCE_ROWS`] rows or
//! more in the pass (a prefill chunk, a wide verify pass) runs on the device, its state up and
//! back down; a decode row's stays on the host, where it costs less than moving the state.
//! DeepSeek-V4's attention keeps its windows and pools entries on the host state; its indexer
//! keys and entries are mirrored per slot on the device, where the indexer and the attention
//! run (`layers::device_v4`).
//!
//! A device that cannot hold the whole spine runs the first layers only
//! ([`DeviceModel::split`], planned by [`crate::backend::residency::device_layers`]): the pass
//! carries its residual stream to the host, and the CPU runs the rest against the host states,
//! which are complete since the device only mirrors them.

use std::sync::Mutex;

use super::super::layers::compressed::{CompressedAttention, CompressedRows};
use super::super::layers::device::{
    self, CacheRows, DEVICE_RECURRENCE_ROWS, DeviceMla, DeviceRecurrence, IndexPool, OnDevice,
};
use super::super::layers::device_v4::{V4Pool, V4Pools, v4_core};
use super::super::layers::dsa::{Selection, Sparse};
use super::super::layers::kda::{DeltaLayer, KdaProjected, KdaRows};
use super::super::layers::mla::{MlaProjected, MlaRows};
use super::super::layers::ops::Host;
use super::super::layers::ops::Ops;
use super::super::{Model, ModelInfo, RowPlan, SeqInput, Trace, compressed_caches, kda_caches, mla_caches};
use super::device::{LayerConsts, upload_output_query};
use super::stack::{self, Span, Stack, Stream};
use super::{Decoder, HostStack, Layer, Mixer, missing_res, row_tokens, settle};
use crate::backend::device::DeviceOps;
use crate::cache::ExpertPass;
use crate::error::{Error, Result};
use crate::state::{LayerState, SeqState};
use std::any::Any;
use std::cell::RefCell;

mod slots;

use slots::{Placed, Seq, Slots};

/// A decoder served on a device (see the module doc).
pub struct DeviceModel<D: DeviceOps> {
    model: Box<dyn Model>,
    info: ModelInfo,
    dev: D,
    /// Positions of each slot of the device caches.
    capacity: usize,
    resident: Mutex<Resident<D::Buf>>,
}

/// What stays on the device between passes.
struct Resident<B> {
    layers: Vec<ServedLayer<B>>,
    /// The AttnRes query before the final norm (Block Attention Residuals).
    output_res: Option<B>,
    slots: Slots,
}

/// One layer's device constants and pooled cache.
struct ServedLayer<B> {
    consts: LayerConsts<B>,
    mixer: ServedMixer<B>,
}

/// A layer's mixer on the served device.
enum ServedMixer<B> {
    /// Grouped-query attention: keys and values, `slots × capacity` rows each.
    Attention([B; 2]),
    /// MLA: its decoded `kv_b_proj`, latents and rotated keys of every slot, and with a DSA
    /// indexer its keys of every slot.
    Mla(DeviceMla<B>, [B; 2], Option<B>),
    /// KDA or gated DeltaNet: projections on the device, the state of record on the host, the
    /// delta rule of long sequences on the device (`recurrent`).
    Recurrent,
    /// DeepSeek-V4's attention: projections and attention on the device, the windows and the
    /// pooling of entries on the host state; a compressed layer's entries (and its indexer's
    /// keys) of every slot mirrored on the device.
    Compressed(Option<V4Rows<B>>),
}

/// A compressed V4 layer's per-window rows on the served device: `per_slot` rows a slot (one
/// per closed window of `ratio` positions), the entries and, with an indexer, its keys.
struct V4Rows<B> {
    entries: B,
    keys: Option<B>,
    per_slot: usize,
    ratio: usize,
}

/// The typed refusal of a model this path does not serve.
fn refused(arch: &str, what: &str) -> Error {
    Error::InvalidArgument {
        field: "device",
        reason: format!("{arch}: {what} has no served device path yet"),
    }
}

impl<B> ServedMixer<B> {
    /// `mixer`'s constants and an empty pool of `rows` cache rows.
    fn new<D: DeviceOps<Buf = B>>(dev: &D, mixer: &Mixer, (slots, capacity): (usize, usize)) -> Result<Self> {
        let rows = slots * capacity;
        Ok(match mixer {
            Mixer::Attention(g) => {
                let kw = g.dims().kv_heads * g.dims().head_dim;
                ServedMixer::Attention([dev.zeros_f32(rows * kw)?, dev.zeros_f32(rows * kw)?])
            }
            Mixer::Mla(m) => {
                let (c, r) = (m.dims.kv_lora, m.dims.rope);
                let pool = [dev.zeros_f32(rows * c)?, dev.zeros_f32(rows * r)?];
                let index = match &m.sparse {
                    Some(Sparse::Index(ix)) => Some(dev.zeros_f32(rows * ix.dims().head_dim)?),
                    _ => None,
                };
                ServedMixer::Mla(DeviceMla::new(dev, m)?, pool, index)
            }
            Mixer::Kda(_) | Mixer::DeltaNet(_) => ServedMixer::Recurrent,
            Mixer::Compressed(c) => ServedMixer::Compressed(match c.kind.ratio() {
                0 => None,
                ratio => {
                    let per_slot = capacity / ratio + 1;
                    let keys = c
                        .indexer
                        .as_ref()
                        .map(|ix| dev.zeros_f32(slots * per_slot * ix.dims.head_dim));
                    Some(V4Rows {
                        entries: dev.zeros_f32(slots * per_slot * c.dims.head_dim)?,
                        keys: keys.transpose()?,
                        per_slot,
                        ratio,
                    })
                }
            }),
        })
    }
}

impl<D: DeviceOps> DeviceModel<D> {
    /// Whether `model` has a served device path (a typed refusal saying why not).
    pub fn supports(model: &dyn Model) -> Result<()> {
        let arch = model.info().arch;
        match model.as_any().downcast_ref::<Decoder>() {
            Some(_) => Ok(()),
            None => Err(refused(arch, "this architecture")),
        }
    }

    /// `model` served on `dev` with `slots` cache slots of `capacity` positions each (the
    /// caches are allocated now); the context limit it reports is `capacity`.
    pub fn new(model: Box<dyn Model>, dev: D, slots: (usize, usize)) -> Result<Self> {
        Self::split(model, dev, slots, usize::MAX)
    }

    /// [`DeviceModel::new`] with only the first `on_device` layers on the device (their spine,
    /// caches and activations); the pass carries its stream to the host for the rest, which
    /// run on the CPU against the host states (see [`crate::backend::residency::device_layers`] for the plan).
    pub fn split(
        model: Box<dyn Model>,
        dev: D,
        (slots, capacity): (usize, usize),
        on_device: usize,
    ) -> Result<Self> {
        Self::supports(model.as_ref())?;
        let m = model
            .as_any()
            .downcast_ref::<Decoder>()
            .expect("supports checked");
        let capacity = capacity.clamp(1, m.info.max_context.max(1));
        let slots = slots.max(1);
        let on_device = on_device.min(m.layers.len());
        let mut layers = Vec::with_capacity(on_device);
        for l in 0..on_device {
            let layer = m.layers.get(l)?;
            layers.push(ServedLayer {
                consts: LayerConsts::upload(&dev, &layer)?,
                mixer: ServedMixer::new(&dev, &layer.mixer, (slots, capacity))?,
            });
        }
        let output_res = upload_output_query(&dev, m)?;
        let mut info = m.info.clone();
        info.max_context = capacity;
        Ok(DeviceModel {
            model,
            info,
            dev,
            capacity,
            resident: Mutex::new(Resident {
                layers,
                output_res,
                slots: Slots::new(slots),
            }),
        })
    }

    fn decoder(&self) -> &Decoder {
        self.model
            .as_any()
            .downcast_ref()
            .expect("checked at construction")
    }

    /// Every layer over the pass's rows `x` (in place): the batch placed in slots, stale
    /// mirrors brought up to date, the device pass, and the slots' bookkeeping after it.
    fn layers(
        &self,
        res: &mut Resident<D::Buf>,
        (batch, plan): (&mut [SeqInput<'_>], &RowPlan),
        x: &mut [f32],
        trace: Option<&mut Trace>,
    ) -> Result<()> {
        if let Some(b) = batch.iter().find(|b| b.state.len() > self.capacity) {
            return Err(Error::ContextOverflow {
                needed: b.state.len(),
                limit: self.capacity,
            });
        }
        let seqs: Vec<Seq> = batch
            .iter()
            .map(|b| Seq {
                state: b.state.id(),
                passes: b.state.passes() - 1,
                committed: b.state.committed_len(),
            })
            .collect();
        let placed = res.slots.place(&seqs)?;
        let Resident {
            layers, output_res, ..
        } = &*res;
        let run = self
            .sync(layers, batch, &placed)
            .and_then(|()| self.run((layers, output_res.as_ref()), (batch, plan), &placed, x, trace));
        match run {
            Ok(()) => {
                let now: Vec<Seq> = batch
                    .iter()
                    .map(|b| Seq {
                        state: b.state.id(),
                        passes: b.state.passes(),
                        committed: b.state.len(),
                    })
                    .collect();
                res.slots.record(&placed, &now);
            }
            Err(_) => res.slots.forget(&placed),
        }
        run
    }

    /// Upload each sequence's host cache rows its slot does not hold yet.
    fn sync(&self, layers: &[ServedLayer<D::Buf>], batch: &[SeqInput<'_>], placed: &[Placed]) -> Result<()> {
        for (b, p) in batch.iter().zip(placed) {
            let (from, to) = (p.current, b.state.committed_len());
            if from == to {
                continue;
            }
            let at: Vec<usize> = (from..to).map(|j| p.slot * self.capacity + j).collect();
            for (layer, host) in layers.iter().zip(&b.state.layers) {
                if let (ServedMixer::Compressed(Some(v)), LayerState::Compressed(c)) = (&layer.mixer, host) {
                    let (from, to) = (from / v.ratio, to / v.ratio);
                    let at: Vec<usize> = (from..to).map(|e| p.slot * v.per_slot + e).collect();
                    let parts = [(Some(&v.entries), &c.entries), (v.keys.as_ref(), &c.index_keys)];
                    for (buf, part) in parts {
                        let Some(buf) = buf else { continue };
                        let rows: Vec<f32> = (from..to).flat_map(|e| part.row(e).iter().copied()).collect();
                        device::write_rows(&self.dev, &rows, part.width(), (buf, &at))?;
                    }
                    continue;
                }
                let (pool, parts): (Vec<&D::Buf>, Vec<_>) = match (&layer.mixer, host) {
                    (ServedMixer::Attention([k, v]), LayerState::Kv(c)) => (vec![k, v], vec![&c.k, &c.v]),
                    (ServedMixer::Mla(_, [l, r], index), LayerState::Mla(c)) => {
                        let mut pool = vec![l, r];
                        pool.extend(index);
                        (pool, vec![&c.latent, &c.k_rope, &c.index_keys])
                    }
                    _ => continue,
                };
                for (buf, part) in pool.into_iter().zip(parts) {
                    let rows: Vec<f32> = (from..to).flat_map(|j| part.row(j).iter().copied()).collect();
                    device::write_rows(&self.dev, &rows, part.width(), (buf, &at))?;
                }
            }
        }
        Ok(())
    }

    /// The device pass proper: the rows up, the decoder's loop over the device's layers, then
    /// (split) the stream carried to the host for the rest, and the final rows into `x` (see
    /// `settle`) for the head.
    fn run(
        &self,
        (layers, output_res): (&[ServedLayer<D::Buf>], Option<&D::Buf>),
        (batch, plan): (&mut [SeqInput<'_>], &RowPlan),
        placed: &[Placed],
        x: &mut [f32],
        trace: Option<&mut Trace>,
    ) -> Result<()> {
        let (m, o) = (self.decoder(), OnDevice(&self.dev));
        let (h, n, tokens) = (m.plan.hidden_size, plan.len(), row_tokens(batch));
        let mut stack = ServedStack {
            layers,
            output_res,
            base: plan.seq.iter().map(|&s| placed[s].slot * self.capacity).collect(),
            slots: placed.iter().map(|p| p.slot).collect(),
            batch,
            plan,
            selection: Selection::new(),
            trace,
        };
        let pass = ExpertPass::open(m.experts.as_deref()).with_tokens(&tokens);
        let span = |layers| Span { layers, pass: &pass };
        let stream = Stream::start(&o, m, o.input(x.to_vec())?, n)?;
        let stream = stack::layers(m, (&o, &mut stack), stream, (n, &tokens), span(0..layers.len()))?;
        if layers.len() == m.layers.len() {
            pass.finish()?;
            let (run, z) = stack::finish(m, (&o, &stack), stream, n)?;
            let (run, z) = (
                o.host(&run)?,
                z.map(|z| o.host(&z).map(|z| z.into_owned())).transpose()?,
            );
            settle(x, (&run, z.as_deref()), &plan.logit_rows(stack.batch), h);
            return Ok(());
        }
        let ServedStack {
            batch,
            trace,
            selection,
            ..
        } = stack;
        let mut host = HostStack::new(batch, plan, trace);
        host.selection = selection; // a shared DSA layer past the split reads it
        let stream = stream.moved(&o, &Host)?;
        let rest = span(layers.len()..m.layers.len());
        let stream = stack::layers(m, (&Host, &mut host), stream, (n, &tokens), rest)?;
        pass.finish()?;
        let (run, z) = stack::finish(m, (&Host, &host), stream, n)?;
        settle(x, (&run, z.as_deref()), &plan.logit_rows(host.batch), h);
        Ok(())
    }
}

impl<D: DeviceOps> std::fmt::Debug for DeviceModel<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceModel({}, {} positions per slot)",
            self.info.arch, self.capacity
        )
    }
}

impl<D> Model for DeviceModel<D>
where
    D: DeviceOps + Send + Sync,
    D::Buf: Send,
{
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn as_any(&self) -> &dyn Any {
        self.model.as_any()
    }

    fn new_state(&self) -> SeqState {
        self.model.new_state()
    }

    fn forward(&self, batch: &mut [SeqInput<'_>], trace: Option<&mut Trace>) -> Result<Vec<f32>> {
        let mut res = self.resident.lock().unwrap_or_else(|poisoned| {
            // A pass panicked half way: no slot's rows can be trusted.
            let mut res = poisoned.into_inner();
            res.slots.clear();
            res
        });
        self.decoder().pass(batch, trace, |batch, plan, x, trace| {
            self.layers(&mut res, (batch, plan), x, trace)
        })
    }

    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.model.embed(tokens)
    }

    fn head(&self, normed: &[f32], rows: usize) -> Result<Vec<f32>> {
        self.model.head(normed, rows)
    }
}

/// The served device's [`Stack`]: its uploaded constants, the pooled caches at each row's slot,
/// and the batch's host states.
struct ServedStack<'a, 'b, 's, 't, B> {
    layers: &'a [ServedLayer<B>],
    output_res: Option<&'a B>,
    /// Each row's slot base (the first cache row of its sequence's slot).
    base: Vec<usize>,
    /// Each sequence's slot.
    slots: Vec<usize>,
    batch: &'b mut [SeqInput<'s>],
    plan: &'b RowPlan,
    /// The last full DSA layer's choice, for the layers that share it.
    selection: Selection,
    trace: Option<&'t mut Trace>,
}

impl<D: DeviceOps> Stack<OnDevice<'_, D>> for ServedStack<'_, '_, '_, '_, D::Buf> {
    fn norms<'a>(&'a self, l: usize, _: &'a Layer) -> [&'a D::Buf; 2] {
        self.layers[l].consts.norms()
    }

    fn res_queries<'a>(&'a self, l: usize, _: &'a Layer) -> Result<[&'a D::Buf; 2]> {
        self.layers[l].consts.res_queries()
    }

    fn output_query<'a>(&'a self, _: &'a Decoder) -> Result<&'a D::Buf> {
        self.output_res.ok_or_else(missing_res)
    }

    fn mixer(
        &mut self,
        o: &OnDevice<'_, D>,
        (l, layer): (usize, &Layer),
        xn: &D::Buf,
        n: usize,
    ) -> Result<D::Buf> {
        let (dev, plan, batch) = (o.0, self.plan, &mut *self.batch);
        match (&layer.mixer, &self.layers[l].mixer) {
            (Mixer::Attention(g), ServedMixer::Attention([k, v])) => {
                let rows = CacheRows::new(&plan.pos, &self.base, |p| g.seen(p));
                let mut keep = |new: [&D::Buf; 2]| {
                    keep_rows(dev, new, plan, |s, [k, v]| {
                        let c = batch[s].state.layers[l]
                            .kv_mut()
                            .expect("state checked: KV layer");
                        c.k.push(k);
                        c.v.push(v);
                    })
                };
                device::gqa(dev, g, (xn, n), (&rows, [k, v]), &mut keep)
            }
            (Mixer::Mla(m), ServedMixer::Mla(c, [latent, rope], index)) => {
                let cache_rows = CacheRows::new(&plan.pos, &self.base, |p| (0, p + 1));
                let (batch, selection) = (RefCell::new(batch), &mut self.selection);
                let mut keep = |new: [&D::Buf; 2]| {
                    keep_rows(dev, new, plan, |s, [a, b]| {
                        let mut batch = batch.borrow_mut();
                        let cache = batch[s].state.layers[l]
                            .mla_mut()
                            .expect("state checked: MLA layer");
                        m.push_row(cache, (a, b), 0);
                    })
                };
                let mut choose = |p: &MlaProjected<D::Buf>| {
                    let mut batch = batch.borrow_mut();
                    let mut caches = mla_caches(&mut batch, l);
                    let rows = &mut MlaRows {
                        caches: &mut caches,
                        seq: &plan.seq,
                        pos: &plan.pos,
                        selection: &mut *selection,
                    };
                    let pool = index.as_ref().map(|keys| IndexPool {
                        keys,
                        rows: &cache_rows,
                    });
                    device::choose_dsa(dev, m, (xn, n, p), pool, rows)
                };
                let cores = (&mut keep as _, &mut choose as _);
                device::mla(dev, (m, c), (xn, n), (&cache_rows, [latent, rope]), cores)
            }
            (Mixer::Kda(k), ServedMixer::Recurrent) => recurrent(o, k, (xn, n), (batch, plan, l)),
            (Mixer::DeltaNet(g), ServedMixer::Recurrent) => recurrent(o, g, (xn, n), (batch, plan, l)),
            (Mixer::Compressed(c), ServedMixer::Compressed(v4)) => {
                let at = (batch, plan, l, &self.slots[..]);
                compressed(o, (c, v4.as_ref()), (xn, n), at)
            }
            _ => Err(Error::InvalidArgument {
                field: "device",
                reason: "a layer's mixer differs from the one its device model was built on".into(),
            }),
        }
    }

    fn record(&mut self, o: &OnDevice<'_, D>, l: usize, x: &D::Buf, width: usize) -> Result<()> {
        let name = format!("layers.{l}");
        if let Some(t) = self.trace.as_deref_mut().filter(|t| t.wants(&name)) {
            t.record_rows(name, &o.host(x)?, width);
        }
        Ok(())
    }
}

/// The rows a core wrote to a device cache (`new`: two parts of the pass's rows), each row's
/// pair handed to `push` with the row's sequence, in row order (the host cache's order).
fn keep_rows<D: DeviceOps>(
    dev: &D,
    new: [&D::Buf; 2],
    plan: &RowPlan,
    mut push: impl FnMut(usize, [&[f32]; 2]),
) -> Result<()> {
    let [a, b] = new.map(|buf| dev.download_f32(buf));
    let (a, b, n) = (a?, b?, plan.len().max(1));
    let (wa, wb) = (a.len() / n, b.len() / n);
    for (i, &s) in plan.seq.iter().enumerate() {
        push(s, [&a[i * wa..(i + 1) * wa], &b[i * wb..(i + 1) * wb]]);
    }
    Ok(())
}

/// A DeepSeek-V4 attention layer of the pass (layer `l`; `slots`: each sequence's slot): its
/// projections, indexer and attention on the device around the host part over the host states
/// (`layers::device_v4`), its entries and keys from the slots' pools.
fn compressed<D: DeviceOps>(
    o: &OnDevice<'_, D>,
    (c, v4): (&CompressedAttention, Option<&V4Rows<D::Buf>>),
    (xn, n): (&D::Buf, usize),
    (batch, plan, l, slots): (&mut [SeqInput<'_>], &RowPlan, usize, &[usize]),
) -> Result<D::Buf> {
    let dev = o.0;
    c.run(o, xn, n, |p| {
        let ratio = v4.map_or(0, |v| v.ratio);
        let held: Vec<usize> = match ratio {
            0 => Vec::new(),
            r => batch.iter().map(|b| b.state.committed_len() / r).collect(),
        };
        let base: Vec<usize> = match v4 {
            Some(v) => slots.iter().map(|&s| s * v.per_slot).collect(),
            None => Vec::new(),
        };
        let pool = |rows| V4Pool {
            rows,
            base: &base,
            held: &held,
        };
        let pools = V4Pools {
            keys: v4.and_then(|v| v.keys.as_ref()).map(pool),
            entries: v4.map(|v| pool(&v.entries)),
            ratio,
        };
        let mut caches = compressed_caches(batch, l);
        let rows = &mut CompressedRows {
            caches: &mut caches,
            seq: &plan.seq,
            pos: &plan.pos,
        };
        v4_core(dev, c, (p, n), rows, pools)
    })
}

/// A recurrent layer of the pass: projections on the device, then its core over the host states
/// of layer `l` (the projections down, the read-out up), the delta rule of a sequence with
/// [`DEVICE_RECURRENCE_ROWS`] rows or more on the device (its state up and down).
fn recurrent<D: DeviceOps>(
    o: &OnDevice<'_, D>,
    layer: &impl DeltaLayer,
    (xn, n): (&D::Buf, usize),
    (batch, plan, l): (&mut [SeqInput<'_>], &RowPlan, usize),
) -> Result<D::Buf> {
    let dev = o.0;
    layer.run(o, xn, n, |p| {
        let host = KdaProjected {
            qkv: dev.download_f32(&p.qkv)?,
            f: dev.download_f32(&p.f)?,
            beta: dev.download_f32(&p.beta)?,
            gate: dev.download_f32(&p.gate)?,
        };
        let mut caches = kda_caches(batch, l);
        let mut elsewhere = DeviceRecurrence {
            dev,
            shape: layer.state_shape(),
            min_rows: DEVICE_RECURRENCE_ROWS,
        };
        let rows = &mut KdaRows {
            caches: &mut caches,
            seq: &plan.seq,
            elsewhere: Some(&mut elsewhere),
        };
        dev.upload_f32(&layer.host_core(host, n, rows)?)
    })
}
