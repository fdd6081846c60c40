//! Sessions, sampling, prefill and decode.
