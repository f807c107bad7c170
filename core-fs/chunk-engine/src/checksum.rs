//! CRC32C helpers: per-page checksum tables and the whole-content CRC
//! computed in the same single pass over the data.
//!
//! `crc32c_combine(a, b, n) = Z_n(a) ^ b` where `Z_n` (appending `n` zero
//! bytes to the CRC register) is linear over GF(2). For a full page, `Z_page`
//! is applied with four 256-entry tables built once per page size, so folding
//! page CRCs into the whole-content CRC costs a few table lookups per page
//! instead of a second pass over the data.

use std::sync::OnceLock;

/// Page sizes used by the size classes: 4 KiB .. 64 KiB.
const PAGE_SIZES: usize = 5;

struct ShiftTable {
    t: [[u32; 256]; 4],
}

impl ShiftTable {
    fn build(page_bytes: usize) -> ShiftTable {
        let mut t = [[0u32; 256]; 4];
        for (k, row) in t.iter_mut().enumerate() {
            for (b, slot) in row.iter_mut().enumerate() {
                *slot = crc32c::crc32c_combine((b as u32) << (8 * k), 0, page_bytes);
            }
        }
        ShiftTable { t }
    }

    fn shift(&self, crc: u32) -> u32 {
        self.t[0][(crc & 0xff) as usize]
            ^ self.t[1][((crc >> 8) & 0xff) as usize]
            ^ self.t[2][((crc >> 16) & 0xff) as usize]
            ^ self.t[3][(crc >> 24) as usize]
    }
}

fn shift_table(page_bytes: usize) -> Option<&'static ShiftTable> {
    static TABLES: [OnceLock<ShiftTable>; PAGE_SIZES] = [const { OnceLock::new() }; PAGE_SIZES];
    if !page_bytes.is_power_of_two() || page_bytes < 4096 {
        return None;
    }
    let slot = TABLES.get((page_bytes / 4096).trailing_zeros() as usize)?;
    Some(slot.get_or_init(|| ShiftTable::build(page_bytes)))
}

/// CRC32C of `data`: `crc-fast` (carry-less multiply folding, VPCLMULQDQ and
/// AVX-512 where the CPU has them, detected at run time), ~60 GB/s here
/// against ~28 GB/s for the `crc32c` crate's SSE 4.2 loop. Same values.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// CRC of `a ‖ b` from `crc(a)`, `crc(b)` and `len(b)`.
fn concat(crc_a: u32, crc_b: u32, len_b: usize, page_bytes: usize) -> u32 {
    match shift_table(page_bytes) {
        Some(t) if len_b == page_bytes => t.shift(crc_a) ^ crc_b,
        _ => crc32c::crc32c_combine(crc_a, crc_b, len_b),
    }
}

/// Appends `data` to content of `old_len_bytes` whose page table is `pages`
/// and whole CRC is `whole`; updates `pages` and returns the new whole CRC.
/// One pass over `data`.
pub fn extend(pages: &mut Vec<u32>, whole: u32, old_len_bytes: u64, data: &[u8], page_bytes: u64) -> u32 {
    extend_and_crc(pages, whole, old_len_bytes, data, page_bytes).0
}

/// `extend`, also returning the CRC32C of `data` itself (folded from the
/// same page CRCs, so still one pass over `data`): `(whole, crc(data))`.
pub fn extend_and_crc(pages: &mut Vec<u32>, whole: u32, old_len_bytes: u64, data: &[u8], page_bytes: u64) -> (u32, u32) {
    let page = page_bytes as usize;
    let partial = (old_len_bytes % page_bytes) as usize;
    let mut whole = whole;
    let mut data_crc = 0u32;
    let mut rest = data;
    if partial != 0 && !rest.is_empty() {
        let fill = (page - partial).min(rest.len());
        let piece = crc32c(&rest[..fill]);
        // The table has a (partial) last page whenever old_len % page != 0.
        debug_assert!(!pages.is_empty());
        let last = pages.pop().unwrap_or(0);
        pages.push(crc32c::crc32c_combine(last, piece, fill));
        whole = crc32c::crc32c_combine(whole, piece, fill);
        data_crc = piece;
        rest = &rest[fill..];
    }
    for p in rest.chunks(page) {
        let c = crc32c(p);
        pages.push(c);
        whole = concat(whole, c, p.len(), page);
        data_crc = concat(data_crc, c, p.len(), page);
    }
    (whole, data_crc)
}

/// Page table and whole CRC of `data`.
pub fn of(data: &[u8], page_bytes: u64) -> (Vec<u32>, u32) {
    let mut pages = Vec::with_capacity(data.len().div_ceil(page_bytes as usize));
    let whole = extend(&mut pages, 0, 0, data, page_bytes);
    (pages, whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 13) as u8).collect()
    }

    #[test]
    fn whole_crc_matches_direct_crc() {
        for page in [4096u64, 8192, 65536] {
            for len in [0usize, 1, 4095, 4096, 4097, 100_000, 300_001] {
                let d = data(len);
                let (pages, whole) = of(&d, page);
                assert_eq!(whole, crc32c::crc32c(&d), "page {page} len {len}");
                let direct: Vec<u32> = d.chunks(page as usize).map(crc32c::crc32c).collect();
                assert_eq!(pages, direct);
            }
        }
    }

    #[test]
    fn extend_also_gives_the_crc_of_the_appended_data() {
        let d = data(50_000);
        for split in [0usize, 1, 4096, 5000, 49_999, 50_000] {
            let (mut pages, whole) = of(&d[..split], 4096);
            let (_, data_crc) = extend_and_crc(&mut pages, whole, split as u64, &d[split..], 4096);
            assert_eq!(data_crc, crc32c::crc32c(&d[split..]), "split {split}");
        }
    }

    #[test]
    fn extend_matches_recomputation() {
        let d = data(50_000);
        for split in [0usize, 1, 4096, 5000, 49_999] {
            let (mut pages, whole) = of(&d[..split], 4096);
            let whole = extend(&mut pages, whole, split as u64, &d[split..], 4096);
            assert_eq!((pages, whole), of(&d, 4096), "split {split}");
        }
    }
}
