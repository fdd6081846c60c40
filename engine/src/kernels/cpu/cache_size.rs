//! The CPU's cache sizes as Linux reports them (`/sys/devices/system/cpu/cpu0/cache`), for the
//! kernels' blocking decisions. A size never changes a result, only where data is read from.

/// Padded input bytes per input-row block of the multi-row path: half of this CPU's L2 cache
/// per core (the rest holds the panel, accumulators and the streamed weights), 512 KiB where
/// the size is not reported. Blocking never changes a result, only where the inputs are read
/// from.
pub(crate) fn x_block_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| l2_bytes().map_or(512 << 10, |b| (b / 2).clamp(128 << 10, 4 << 20)))
}

/// The L2 cache of CPU 0 as Linux reports it (`/sys/devices/system/cpu/cpu0/cache`).
pub(crate) fn l2_bytes() -> Option<usize> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    (0..8).find_map(|i| {
        let idx = dir.join(format!("index{i}"));
        let level = std::fs::read_to_string(idx.join("level")).ok()?;
        if level.trim() != "2" {
            return None;
        }
        parse_cache_size(&std::fs::read_to_string(idx.join("size")).ok()?)
    })
}

/// A sysfs cache size (`2048K`, `1M`, `512`) in bytes.
fn parse_cache_size(size: &str) -> Option<usize> {
    let size = size.trim();
    let (digits, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit()).unwrap_or(size.len()));
    let mult = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        _ => return None,
    };
    digits.parse::<usize>().ok().map(|d| d * mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_cache_sizes_parse() {
        assert_eq!(parse_cache_size("2048K\n"), Some(2 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("2G"), None);
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size(""), None);
    }
}
