//! Building and running the CPU emulators of the CUDA sources (`tests/cuda_emulator/*.cpp`):
//! compiled once per test run with g++ (C++20, IEEE single precision without contraction), fed
//! requests on stdin, each answered on stdout.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Compile `tests/cuda_emulator/{source}` to `{name}` in the test's temporary directory.
/// `None` when there is no g++ (the tests then skip, unless `DELTAFIN_REQUIRE_SERVICES=1`).
pub fn compile(source: &str, name: &str) -> Option<PathBuf> {
    // From the engine's tests and from the server's (which include this file) alike.
    let src = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../engine/tests/cuda_emulator"
    ))
    .join(source);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let status = Command::new("g++")
        .args([
            "-std=c++20",
            "-O2",
            "-ffp-contract=off",
            "-fno-fast-math",
            "-pthread",
        ])
        .args(["-Wall", "-Wno-unknown-pragmas", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .status();
    match status {
        Ok(s) if s.success() => Some(out),
        Ok(s) => panic!("the CUDA source does not compile in the emulator ({source}): {s}"),
        Err(e) => {
            let required = std::env::var_os("DELTAFIN_REQUIRE_SERVICES").is_some_and(|v| v == "1");
            assert!(!required, "g++ is required (DELTAFIN_REQUIRE_SERVICES=1): {e}");
            eprintln!("skipping: no g++ ({e})");
            None
        }
    }
}

/// Run `bin` on `input`; its stdout.
pub fn run(bin: &Path, input: &[u8]) -> Vec<u8> {
    let mut child = Command::new(bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "emulator failed: {}", out.status);
    out.stdout
}

/// A device whose memory is host memory and whose kernels run in the emulator
/// (`emulate_layers.cpp`): the CUDA sources' arithmetic behind [`DeviceOps`], so a
/// device-resident pass is checked on machines without a GPU. One emulator process serves every
/// launch in turn; each launch ships its buffers to it and back, in slot order (so an output
/// slot that aliases an input slot ends with the output). Shareable between threads, as a GPU
/// backend is (the server's engine thread, the expert store's threads): a launch holds the
/// emulator from reading its buffers to writing them back, so launches from several threads
/// are each whole, as on a stream.
pub struct EmuDevice {
    pub launches: std::sync::atomic::AtomicUsize,
    /// Routed experts' matrix products, by the weights' key: what a device tier would keep.
    pub expert_products: std::sync::Mutex<std::collections::HashMap<ExpertMatrix, usize>>,
    process: std::sync::Mutex<Emulator>,
}

/// The keys of a matrix's bytes and scales.
pub type ExpertMatrix = (
    deltafin_engine::weights::BlobKey,
    Option<deltafin_engine::weights::BlobKey>,
);

/// A running emulator and its pipes.
struct Emulator {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::process::ChildStdout,
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub type EmuBuf = std::sync::Arc<std::sync::Mutex<Vec<u8>>>;

/// A new buffer holding `bytes`.
fn buf(bytes: Vec<u8>) -> EmuBuf {
    std::sync::Arc::new(std::sync::Mutex::new(bytes))
}

impl EmuDevice {
    /// A device served by the emulator binary `bin` (from [`compile`]).
    pub fn new(bin: &Path) -> EmuDevice {
        let mut child = Command::new(bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
        EmuDevice {
            launches: Default::default(),
            expert_products: Default::default(),
            process: std::sync::Mutex::new(Emulator { child, stdin, stdout }),
        }
    }

    /// Ship `bufs` (None: a null address) through one launch.
    fn launch(&self, name: &str, grid: [u32; 6], bufs: &[Option<&EmuBuf>], ints: &[i32], floats: &[f32]) {
        use deltafin_engine::backend::abi::{LAYER_FLOATS, LAYER_INTS};
        use std::io::Read;
        self.launches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut p = self.process.lock().unwrap();
        let mut input = Vec::new();
        input.extend(0u32.to_le_bytes());
        input.extend((name.len() as u32).to_le_bytes());
        input.extend(name.as_bytes());
        grid.iter().for_each(|d| input.extend(d.to_le_bytes()));
        input.extend((bufs.len() as u32).to_le_bytes());
        for b in bufs {
            let b = b.map(|b| b.lock().unwrap().clone());
            let bytes = b.as_deref().unwrap_or(&[]);
            input.extend((bytes.len() as u64).to_le_bytes());
            input.extend_from_slice(bytes);
        }
        let mut i = [0i32; LAYER_INTS];
        i[..ints.len()].copy_from_slice(ints);
        let mut f = [0f32; LAYER_FLOATS];
        f[..floats.len()].copy_from_slice(floats);
        input.extend(i.iter().flat_map(|v| v.to_le_bytes()));
        input.extend(f.iter().flat_map(|v| v.to_le_bytes()));
        p.stdin.write_all(&input).unwrap();
        p.stdin.flush().unwrap();
        for b in bufs {
            let mut scratch = Vec::new();
            let mut held = b.map(|b| b.lock().unwrap());
            let out = held.as_mut().map_or(&mut scratch, |b| &mut **b);
            if let Err(e) = p.stdout.read_exact(out) {
                let status = p.child.wait();
                panic!("emulator failed on {name}: {e} ({status:?})");
            }
        }
    }
}

impl deltafin_engine::backend::device::DeviceOps for EmuDevice {
    type Buf = EmuBuf;

    fn upload(&self, bytes: &[u8]) -> deltafin_engine::Result<EmuBuf> {
        Ok(buf(bytes.to_vec()))
    }

    fn zeros(&self, len: usize) -> deltafin_engine::Result<EmuBuf> {
        Ok(buf(vec![0; len]))
    }

    fn download(&self, buf: &EmuBuf) -> deltafin_engine::Result<Vec<u8>> {
        Ok(buf.lock().unwrap().clone())
    }

    fn layer(
        &self,
        l: &deltafin_engine::backend::abi::LayerLaunch,
        bufs: &[Option<&EmuBuf>],
    ) -> deltafin_engine::Result<()> {
        let g = [
            l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2],
        ];
        self.launch(l.name, g, bufs, &l.int, &l.float);
        Ok(())
    }

    fn matmul(
        &self,
        m: &deltafin_engine::kernels::Matrix,
        class: deltafin_engine::backend::WeightClass,
        x: &EmuBuf,
        n: usize,
        y: &EmuBuf,
    ) -> deltafin_engine::Result<()> {
        if class == deltafin_engine::backend::WeightClass::Expert {
            let key = (m.data.key(), m.scales.as_ref().map(|s| s.key()));
            *self.expert_products.lock().unwrap().entry(key).or_default() += 1;
        }
        let a = deltafin_engine::backend::abi::kernel_args(m.format);
        let data = buf(m.data[..].to_vec());
        let scales = m.scales.as_ref().map(|s| buf(s[..].to_vec()));
        let ints = [
            m.rows as i32,
            m.cols as i32,
            n as i32,
            a.code,
            a.p0,
            a.p1,
            a.scale_dtype,
        ];
        let bufs = [Some(&data), scales.as_ref(), Some(x), Some(y)];
        self.launch("deltafin_matmul", [1; 6], &bufs, &ints, &[]);
        Ok(())
    }
}
