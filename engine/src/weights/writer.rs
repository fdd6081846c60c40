//! Writing safetensors files atomically: the header is computed from the tensor list, data is
//! streamed tensor by tensor from a callback (so multi-GB files never sit in memory), and the
//! file appears under its final name only after it is complete and fsynced. Files of at least
//! [`STREAM_MIN_BYTES`] go through a [`StreamWriter`] (a background thread writing large
//! aligned buffers, `O_DIRECT` where possible) so producing the data overlaps writing it.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::{Map, Value, json};

use super::Dtype;
use super::stream::StreamWriter;
use crate::error::{Error, Result};

/// Files at least this large are written through a [`StreamWriter`].
pub const STREAM_MIN_BYTES: usize = 64 << 20;

/// Bytes per write of the [`StreamWriter`].
const STREAM_CHUNK: usize = 8 << 20;

/// Name, dtype and shape of a tensor to write.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: &[usize]) -> Self {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    /// Bytes of data.
    pub fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// Write `tensors` to `path`; `fill(i, out)` must write exactly `tensors[i].nbytes()` bytes.
pub fn write_safetensors(
    path: &Path,
    tensors: &[TensorSpec],
    metadata: &[(&str, &str)],
    mut fill: impl FnMut(usize, &mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let mut header = Map::new();
    if !metadata.is_empty() {
        let meta: Map<String, Value> = metadata.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        header.insert("__metadata__".into(), Value::Object(meta));
    }
    let mut offset = 0usize;
    for t in tensors {
        let end = offset + t.nbytes();
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut text = serde_json::to_string(&Value::Object(header)).expect("serialisable header");
    while !(8 + text.len()).is_multiple_of(8) {
        text.push(' ');
    }
    let tmp = path.with_extension("safetensors.partial");
    let io = |e| Error::io(&tmp, e);
    if 8 + text.len() + offset >= STREAM_MIN_BYTES {
        let mut out = StreamWriter::create(&tmp, STREAM_CHUNK).map_err(io)?;
        write_body(&mut out, &text, tensors, &mut fill).map_err(|e| e.with_path(&tmp))?;
        out.finish().map_err(io)?;
    } else {
        let file = File::create(&tmp).map_err(io)?;
        let mut out = BufWriter::with_capacity(8 << 20, file);
        write_body(&mut out, &text, tensors, &mut fill).map_err(|e| e.with_path(&tmp))?;
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    sync_dir(path);
    Ok(())
}

/// Why writing the body failed.
enum BodyError {
    Io(std::io::Error),
    Size(Error),
}

impl BodyError {
    fn with_path(self, path: &Path) -> Error {
        match self {
            BodyError::Io(e) => Error::io(path, e),
            BodyError::Size(e) => e,
        }
    }
}

/// Header length, header, then every tensor's bytes from `fill`, checking each one's size.
fn write_body(
    out: &mut dyn Write,
    header: &str,
    tensors: &[TensorSpec],
    fill: &mut impl FnMut(usize, &mut dyn Write) -> std::io::Result<()>,
) -> std::result::Result<(), BodyError> {
    out.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(BodyError::Io)?;
    out.write_all(header.as_bytes()).map_err(BodyError::Io)?;
    for (i, t) in tensors.iter().enumerate() {
        let mut counted = CountingWriter {
            inner: &mut *out,
            written: 0,
        };
        fill(i, &mut counted).map_err(BodyError::Io)?;
        if counted.written != t.nbytes() {
            return Err(BodyError::Size(Error::InvalidArgument {
                field: "tensor data",
                reason: format!(
                    "`{}`: wrote {} bytes, expected {}",
                    t.name,
                    counted.written,
                    t.nbytes()
                ),
            }));
        }
    }
    Ok(())
}

/// Write a small file atomically (temp file, fsync, rename, fsync directory).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("partial");
    let mut file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    file.write_all(bytes)
        .and_then(|_| file.sync_all())
        .map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    sync_dir(path);
    Ok(())
}

fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent()
        && let Ok(d) = File::open(dir)
    {
        // Best effort: some filesystems refuse fsync on directories.
        let _ = d.sync_all();
    }
}

struct CountingWriter<'a, W: Write + ?Sized> {
    inner: &'a mut W,
    written: usize,
}

impl<W: Write + ?Sized> Write for CountingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
