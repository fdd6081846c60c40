//! Tests of the reader pool: chunked reads in every mode, cancellation, the page-cache policy,
//! short reads of files changed underneath, and checksum verification.

use super::*;

/// A buffered pool of two threads reading 4 KiB chunks of `path`.
fn buffered_pool(path: &Path) -> ReaderPool {
    let config = ReaderConfig {
        mode: ReadMode::Buffered,
        threads: 2,
        chunk_bytes: 4096,
    };
    ReaderPool::new(&[path.to_path_buf()], &config).unwrap()
}

fn file_with(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.bin");
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

#[test]
fn reads_segments_in_chunks_in_every_mode() {
    let data: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (_d, path) = file_with(&data);
    for mode in [ReadMode::Auto, ReadMode::Buffered] {
        let pool = ReaderPool::new(
            std::slice::from_ref(&path),
            &ReaderConfig {
                mode,
                threads: 3,
                chunk_bytes: 4096,
            },
        )
        .unwrap();
        let buf = Arc::new(AlignedBuf::new(3 * 4096 + 40_960).unwrap());
        let segs = [
            Segment {
                shard: 0,
                offset: 8192,
                len: 12288,
                dest: 0,
            },
            Segment {
                shard: 0,
                offset: 0,
                len: 40960,
                dest: 12288,
            },
        ];
        pool.read_now(buf.clone(), &segs).unwrap();
        let b = (*buf).as_ref();
        assert_eq!(&b[..12288], &data[8192..20480]);
        assert_eq!(&b[12288..12288 + 40_000], &data[..]);
        let s = pool.stats();
        assert_eq!(s.reads, 3 + 10);
        assert!(s.bytes >= 12288 + 40_000);
    }
}

#[test]
fn queued_requests_can_be_cancelled_and_callbacks_run_once() {
    let (_d, path) = file_with(&vec![1u8; 1 << 20]);
    let pool = ReaderPool::new(
        &[path],
        &ReaderConfig {
            mode: ReadMode::Buffered,
            threads: 1,
            chunk_bytes: 4096,
        },
    )
    .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tickets = Vec::new();
    for _ in 0..64 {
        let buf = Arc::new(AlignedBuf::new(1 << 20).unwrap());
        let c = calls.clone();
        let cb: Callback = Box::new(move |r, _| {
            assert!(r.is_ok());
            c.fetch_add(1, Ordering::SeqCst);
        });
        tickets.push(pool.submit(
            buf,
            &[Segment {
                shard: 0,
                offset: 0,
                len: 1 << 20,
                dest: 0,
            }],
            Priority::Prefetch,
            Some(cb),
        ));
    }
    let cancelled = tickets.iter().filter(|t| pool.cancel(t)).count();
    assert!(cancelled > 0, "one worker cannot have started all 64 requests");
    for t in &tickets {
        let r = t.wait();
        assert!(r.is_ok() || r == Err(ReadError::Cancelled));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 64 - cancelled);
    assert_eq!(pool.stats().cancelled, cancelled as u64);
}

/// Pages of `path` in the page cache (`mincore` over a map of the file).
fn resident_pages(path: &Path) -> usize {
    let file = File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    // SAFETY: the test's own file, not modified while mapped.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let page = 4096;
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `map` covers `len` bytes and stays alive for the call; `vec` holds one byte
    // per page of that range.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|&&b| b & 1 == 1).count()
}

fn evict(path: &Path) {
    let f = File::open(path).unwrap();
    f.sync_all().unwrap();
    drop_pages(&f, 0, 0);
}

#[test]
fn auto_mode_buffered_reads_leave_nothing_in_the_page_cache() {
    let len = 1 << 20;
    // Beside the test binary, on the build's disk (not a tmpfs /tmp, whose pages are the
    // file itself and cannot be dropped).
    let exe = std::env::current_exe().unwrap();
    let dir = tempfile::tempdir_in(exe.parent().unwrap()).unwrap();
    let path = dir.path().join("f.bin");
    std::fs::write(&path, vec![7u8; len]).unwrap();
    let whole = [Segment {
        shard: 0,
        offset: 0,
        len,
        dest: 0,
    }];
    let read = |mode| {
        evict(&path);
        let pool = ReaderPool::new(
            std::slice::from_ref(&path),
            &ReaderConfig {
                mode,
                threads: 2,
                chunk_bytes: 64 << 10,
            },
        )
        .unwrap();
        // Buffered reads even where the filesystem allows O_DIRECT (as where it does not).
        pool.set_direct(false);
        pool.read_now(Arc::new(AlignedBuf::new(len).unwrap()), &whole)
            .unwrap();
        (resident_pages(&path), pool.decision())
    };
    let (kept, decision) = read(ReadMode::Buffered);
    assert!(kept >= len / 4096 / 2, "buffered reads keep their pages: {kept}");
    assert!(!decision.drop_pages);
    let (left, decision) = read(ReadMode::Auto);
    assert!(decision.drop_pages);
    assert!(
        left < len / 4096 / 8,
        "auto left {left} of {} pages cached",
        len / 4096
    );
}

#[test]
fn a_truncated_file_is_a_short_read_until_it_is_whole_again() {
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 253) as u8).collect();
    let (dir, path) = file_with(&data);
    let pool = buffered_pool(&path);
    let tail = [Segment {
        shard: 0,
        offset: 32 * 1024,
        len: 32 * 1024,
        dest: 0,
    }];
    let read = || {
        let buf = Arc::new(AlignedBuf::new(32 * 1024).unwrap());
        pool.read_now(buf.clone(), &tail)
            .map(|()| (*buf).as_ref().to_vec())
    };
    assert_eq!(read().unwrap(), data[32 * 1024..]);
    assert!(pool.health().is_ok());

    // Truncated in place under the pool: the read fails, naming the file and why.
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(40 * 1024)
        .unwrap();
    let err = read().unwrap_err();
    assert_eq!(err.kind(), "weights_unavailable");
    let msg = err.to_string();
    assert!(
        msg.contains("f.bin") && msg.contains("short read") && msg.contains("truncated to 40960"),
        "{msg}"
    );
    assert!(pool.health().unwrap_err().to_string().contains("truncated"));
    assert!(pool.read_errors()[0].1 >= 1);

    // Restored by rename (a new inode): reopened, and the bytes are the checkpoint's again.
    let whole = dir.path().join("whole.bin");
    std::fs::write(&whole, &data).unwrap();
    std::fs::rename(&whole, &path).unwrap();
    assert!(pool.health().is_ok());
    assert_eq!(read().unwrap(), data[32 * 1024..]);

    // Aligned reads past the end of a whole file are still fine.
    let past = [Segment {
        shard: 0,
        offset: 60 * 1024,
        len: 8 * 1024,
        dest: 0,
    }];
    pool.read_now(Arc::new(AlignedBuf::new(8 * 1024).unwrap()), &past)
        .unwrap();
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let err = ReaderPool::new(
        &[PathBuf::from("/nonexistent/x.safetensors")],
        &ReaderConfig::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/x.safetensors"));
}

#[test]
fn checksums_verify_the_tensors_read_and_name_a_mismatch() {
    use crate::weights::checksums::{ShardSums, TensorSum, checksum};
    let data: Vec<u8> = (0..32 * 1024u32).map(|i| (i % 241) as u8).collect();
    let (_d, path) = file_with(&data);
    let pool = buffered_pool(&path);
    let tensor = |name: &str, r: std::ops::Range<usize>| TensorSum {
        offset: r.start as u64,
        len: r.len() as u64,
        hash: checksum(&data[r]),
        name: name.into(),
        slice: false,
    };
    pool.set_checksums(ShardSums(vec![vec![
        tensor("experts.0.w", 100..9000),
        tensor("experts.1.w", 9000..20000),
    ]]));
    let whole = [Segment {
        shard: 0,
        offset: 0,
        len: 32 * 1024,
        dest: 0,
    }];
    pool.read_now(Arc::new(AlignedBuf::new(32 * 1024).unwrap()), &whole)
        .unwrap();
    assert_eq!(pool.checksums(), Some(2));
    let flip = |at: u64| {
        use std::os::unix::fs::FileExt;
        let f = File::options().read(true).write(true).open(&path).unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 1], at).unwrap();
    };
    flip(12345);
    let err = pool
        .read_now(Arc::new(AlignedBuf::new(32 * 1024).unwrap()), &whole)
        .unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.kind(), "weights_unavailable");
    assert!(msg.contains("`experts.1.w`") && msg.contains("checksum"), "{msg}");
    assert!(
        pool.health().is_err(),
        "the mismatch stays a fault until it reads cleanly"
    );
    assert_eq!(pool.read_errors()[0].1, 1);
    flip(12345);
    assert!(pool.health().is_ok());
    pool.read_now(Arc::new(AlignedBuf::new(32 * 1024).unwrap()), &whole)
        .unwrap();
}

#[test]
fn an_io_error_under_one_expert_fails_its_reads_until_the_range_reads_again() {
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 239) as u8).collect();
    let (_d, path) = file_with(&data);
    let pool = buffered_pool(&path);
    let expert = |at: u64| {
        [Segment {
            shard: 0,
            offset: at,
            len: 16 * 1024,
            dest: 0,
        }]
    };
    let read = |at: u64| {
        let buf = Arc::new(AlignedBuf::new(16 * 1024).unwrap());
        pool.read_now(buf.clone(), &expert(at))
            .map(|()| (*buf).as_ref().to_vec())
    };
    // A bad sector under the second "expert" only.
    pool.inject_eio(0, 20_000..20_001);
    assert_eq!(read(0).unwrap(), data[..16 * 1024], "the other expert reads fine");
    let err = read(16 * 1024).unwrap_err();
    assert_eq!(err.kind(), "weights_unavailable");
    assert!(
        err.to_string().contains("f.bin") && err.to_string().contains("error 5"),
        "{err}"
    );
    assert!(
        pool.health().is_err(),
        "the failed range is re-read by the health check"
    );
    assert_eq!(pool.read_errors()[0].1, 1);
    pool.clear_injected();
    assert!(pool.health().is_ok(), "it reads cleanly again");
    assert_eq!(read(16 * 1024).unwrap(), data[16 * 1024..32 * 1024]);
}
