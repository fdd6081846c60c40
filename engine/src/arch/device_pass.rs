//! Whole passes on a device behind one object-safe face: [`DeviceSequence`] is a sequence whose
//! activations and caches live on a device (each architecture's `DeviceSession`), and
//! [`device_sequence`] opens one for a loaded [`Model`] when its architecture has a device pass
//! (the decoder's stacks of MLA and KDA layers — DeepSeek-V3, Kimi-K2, Kimi-Linear — and Kimi K3). Generation over it is
//! `generate::generate_on_device`.

use std::any::Any;

use super::Model;
use super::decoder::{self, Decoder};
use crate::backend::device::DeviceOps;
use crate::error::{Error, Result};

/// One sequence running whole passes on a device: tokens in, the last row's logits out.
pub trait DeviceSequence {
    /// Positions run so far.
    fn len(&self) -> usize;

    /// Whether nothing has run yet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Run `tokens` (the sequence's next positions) through every layer; the last row's logits.
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
}

macro_rules! device_sequence_impl {
    ($session:ty) => {
        impl<D: DeviceOps> DeviceSequence for $session {
            fn len(&self) -> usize {
                <$session>::len(self)
            }

            fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
                <$session>::forward(self, tokens)
            }
        }
    };
}

device_sequence_impl!(decoder::DeviceSession<'_, D>);

/// A device sequence of up to `capacity` positions for `model` on `dev` (caches allocated now).
/// Architectures without a device pass, and out-of-core models, get a typed refusal; their
/// matrix products can still run on the device through [`crate::backend::matmul`].
pub fn device_sequence<'m, D: DeviceOps>(
    model: &'m dyn Model,
    dev: &'m D,
    capacity: usize,
) -> Result<Box<dyn DeviceSequence + 'm>> {
    let any: &dyn Any = model.as_any();
    if let Some(m) = any.downcast_ref::<Decoder>() {
        return Ok(Box::new(m.device_session(dev, capacity)?));
    }
    Err(Error::InvalidArgument {
        field: "device",
        reason: format!(
            "{} has no whole-pass device path (the shared decoder's families do)",
            model.info().arch
        ),
    })
}

/// [`device_sequence`] on the installed backend ([`crate::backend::current`]); `None` when that
/// is the CPU.
pub fn current_device_sequence(
    model: &dyn Model,
    capacity: usize,
) -> Option<Result<Box<dyn DeviceSequence + '_>>> {
    match crate::backend::current() {
        crate::backend::Backend::Cpu => {
            let _ = (model, capacity);
            None
        }
        #[cfg(feature = "cuda")]
        crate::backend::Backend::Cuda(c) => Some(device_sequence(model, c.as_ref(), capacity)),
    }
}

/// Bytes the served device's attention caches may take by default ([`device_cache_positions`]).
pub const DEVICE_CACHE_BYTES: u64 = 4 << 30;

/// Positions per cache slot of a served device (pure): the context limit (the model's when
/// none is set), fewer when `slots` slots of them would take more than `budget` bytes of
/// attention cache (`per_token` bytes a position, every attention layer together).
pub fn device_cache_positions(
    per_token: u64,
    slots: usize,
    (limit, max_context): (Option<usize>, usize),
    budget: u64,
) -> usize {
    let wanted = limit.unwrap_or(max_context).min(max_context).max(1);
    let fit = budget / (per_token.max(1) * slots.max(1) as u64);
    wanted.min(usize::try_from(fit).unwrap_or(usize::MAX)).max(1)
}

/// Device bytes of `slots` attention cache slots of `capacity` positions (`per_token` bytes a
/// position): what a served model takes off the device's weight budget
/// ([`serve_on_current_device`]), and what the split plan leaves aside.
pub fn device_cache_bytes(per_token: u64, slots: usize, capacity: usize) -> u64 {
    per_token
        .saturating_mul(slots as u64)
        .saturating_mul(capacity as u64)
}

/// `model` as the server runs it on the installed backend ([`crate::backend::current`]): on a
/// GPU, a [`super::DeviceModel`] with `slots` cache slots of `capacity` positions and its first
/// `on_device` layers on the device (see [`super::device_layers`]) when the architecture has a
/// served device path, else `model` itself (its matrix products still run on the backend). The
/// caches' bytes ([`device_cache_bytes`]) come off the backend's weight budget first, so weights
/// and caches together stay within it. The line says which, for the log.
pub fn serve_on_current_device(
    model: Box<dyn Model>,
    (slots, capacity): (usize, usize),
    on_device: usize,
) -> Result<(Box<dyn Model>, String)> {
    match crate::backend::current() {
        crate::backend::Backend::Cpu => {
            let _ = (slots, capacity, on_device);
            Ok((model, "cpu".into()))
        }
        #[cfg(feature = "cuda")]
        crate::backend::Backend::Cuda(c) => {
            let dev: &'static crate::backend::cuda::CudaBackend = c.as_ref();
            if let Err(why) =
                super::DeviceModel::<&crate::backend::cuda::CudaBackend>::supports(model.as_ref())
            {
                return Ok((model, format!("matrix products on {} ({why})", c.describe())));
            }
            let (layers, per_token) = (model.info().num_layers, model.info().state.per_token);
            let caches = device_cache_bytes(per_token, slots, capacity);
            dev.reserve(caches);
            let served = super::DeviceModel::split(model, dev, (slots, capacity), on_device)?;
            let split = match on_device.min(layers) {
                n if n == layers => format!("all {layers} layers"),
                n => format!("layers 0..{n} of {layers} (the rest on the CPU: their spine does not fit)"),
            };
            let line = format!(
                "whole passes on {}: {split}; {slots} cache slots of {} positions ({:.2} GiB, off \
                 the weight budget)",
                c.describe(),
                served.info().max_context,
                caches as f64 / (1u64 << 30) as f64
            );
            Ok((Box::new(served), line))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{device_cache_bytes, device_cache_positions};

    #[test]
    fn device_caches_hold_the_context_limit_within_their_budget() {
        // 1 KiB a position, 4 slots, 1 MiB: 256 positions fit.
        assert_eq!(device_cache_positions(1024, 4, (None, 4096), 1 << 20), 256);
        assert_eq!(device_cache_positions(1024, 4, (Some(100), 4096), 1 << 20), 100);
        assert_eq!(device_cache_positions(1024, 4, (Some(9999), 200), 1 << 30), 200);
        // Recurrent-only models have no attention cache: the context limit.
        assert_eq!(device_cache_positions(0, 4, (None, 4096), 1 << 20), 4096);
        assert_eq!(device_cache_bytes(1024, 4, 256), 1 << 20, "what those slots take");
        assert_eq!(device_cache_bytes(u64::MAX, 4, 256), u64::MAX);
    }
}
