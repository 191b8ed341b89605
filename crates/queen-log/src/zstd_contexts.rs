//! zstd on contexts kept per thread.
//!
//! Making a zstd context probes the CPU's features (`cpuid`), an instruction a virtual machine
//! traps to its hypervisor: under `push-b1` on the development machine, `ZSTD_createCCtx` and
//! `ZSTD_createDCtx`, one of each per segment, were about 8 % of the broker's samples each. A
//! context kept by its thread is made once. It keeps the tables sized for the largest input it
//! has met (well under a megabyte at level 1), and the broker compresses and decompresses on its
//! few worker threads only.

use std::cell::RefCell;
use std::io;

use zstd::bulk::{Compressor, Decompressor};

use crate::segment::SEGMENT_ZSTD_LEVEL;

thread_local! {
    static COMPRESSOR: RefCell<Option<Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<Decompressor<'static>>> = const { RefCell::new(None) };
}

/// `raw` as one zstd frame at [`SEGMENT_ZSTD_LEVEL`] that declares its content size.
pub fn compress_segment(raw: &[u8]) -> io::Result<Vec<u8>> {
    COMPRESSOR.with(|slot| {
        let mut slot = slot.borrow_mut();
        let compressor = match slot.as_mut() {
            Some(compressor) => compressor,
            None => slot.insert(Compressor::new(SEGMENT_ZSTD_LEVEL)?),
        };
        compressor.compress(raw)
    })
}

/// The content of zstd frames, at most `capacity` bytes of it (an error past that).
pub fn decompress(compressed: &[u8], capacity: usize) -> io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|slot| {
        let mut slot = slot.borrow_mut();
        let decompressor = match slot.as_mut() {
            Some(decompressor) => decompressor,
            None => slot.insert(Decompressor::new()?),
        };
        decompressor.decompress(compressed, capacity)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_context_round_trips_inputs_of_every_size_and_declares_the_size() {
        for len in [0, 1, 100, 200_000, 10, 3_000_000, 5] {
            let raw: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let compressed = compress_segment(&raw).expect("compressed");
            let declared = zstd::zstd_safe::get_frame_content_size(&compressed).expect("a frame");
            assert_eq!(declared, Some(len as u64));
            assert_eq!(decompress(&compressed, len).expect("decompressed"), raw);
            assert_eq!(zstd::bulk::decompress(&compressed, len).expect("by a fresh context"), raw);
        }
    }

    #[test]
    fn a_kept_context_recovers_from_a_bad_frame() {
        let good = compress_segment(b"after the bad one").expect("compressed");
        assert!(decompress(b"not zstd at all", 100).is_err());
        let mut truncated = good.clone();
        truncated.truncate(good.len() - 3);
        assert!(decompress(&truncated, 100).is_err());
        assert!(decompress(&good, 5).is_err(), "more than the capacity");
        assert_eq!(decompress(&good, 100).expect("the next frame"), b"after the bad one");
    }
}
