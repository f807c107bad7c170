//! CRC32C helpers: per-page checksum tables and the whole-content CRC
//! computed in the same single pass over the data.
//!
//! `combine(a, b, n) = Z_n(a) ^ b` where `Z_n` (appending `n` zero bytes to
//! the CRC register) is multiplication by `x^(8n)` modulo the CRC
//! polynomial. For a full page, `Z_page` is applied with four 256-entry
//! tables built once per page size, so folding page CRCs into the
//! whole-content CRC costs a few table lookups per page instead of a second
//! pass over the data. For any other length (an append that fills part of
//! a page), [`combine`] builds `x^(8n) mod P` from a table of
//! `x^(8·2^k) mod P` (one multiplication per set bit of `n`, each 32 shifts
//! and xors): well under a microsecond, where the `crc32c` crate's
//! matrix-squaring `crc32c_combine` took 15 % of a storage node's CPU under
//! 1 KiB appends (docs/BENCHMARKS.md).

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
                *slot = combine((b as u32) << (8 * k), 0, page_bytes as u64);
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

/// CRC-32C's polynomial, bit-reflected: bit 31 holds the coefficient of
/// `x^0`, bit 0 that of `x^31` (the order the CRC register keeps).
const POLY_REFLECTED: u32 = 0x82F6_3B78;

/// `a · b mod P` for polynomials in the reflected representation.
const fn mul_mod_p(a: u32, mut b: u32) -> u32 {
    let mut product = 0u32;
    let mut bit = 1u32 << 31;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        bit >>= 1;
        // b · x: one place towards x^31, reduced by P when it leaves.
        b = if b & 1 != 0 { (b >> 1) ^ POLY_REFLECTED } else { b >> 1 };
    }
    product
}

/// `X8_POW2[k] = x^(8 · 2^k) mod P`: appending `2^k` zero bytes.
static X8_POW2: [u32; 64] = {
    let mut t = [0u32; 64];
    t[0] = 1 << (31 - 8);
    let mut k = 1;
    while k < 64 {
        t[k] = mul_mod_p(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// CRC32C of `a ‖ b` from `crc(a)`, `crc(b)` and `len(b)`.
pub fn combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    let mut shift = 1u32 << 31;
    let mut n = len_b;
    let mut k = 0;
    while n != 0 {
        if n & 1 != 0 {
            shift = mul_mod_p(X8_POW2[k], shift);
        }
        n >>= 1;
        k += 1;
    }
    mul_mod_p(shift, crc_a) ^ crc_b
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
        _ => combine(crc_a, crc_b, len_b as u64),
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
        pages.push(combine(last, piece, fill as u64));
        whole = combine(whole, piece, fill as u64);
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
    fn combine_is_the_crc_of_the_concatenation() {
        let d = data(70_000);
        for split in [0usize, 1, 7, 8, 255, 1024, 4095, 4096, 4097, 33_333, 69_999, 70_000] {
            let (a, b) = d.split_at(split);
            let want = crc32c::crc32c(&d);
            assert_eq!(combine(crc32c::crc32c(a), crc32c::crc32c(b), b.len() as u64), want, "split {split}");
            assert_eq!(
                combine(crc32c::crc32c(a), crc32c::crc32c(b), b.len() as u64),
                crc32c::crc32c_combine(crc32c::crc32c(a), crc32c::crc32c(b), b.len())
            );
        }
        // Lengths past what a chunk holds, against the crate's matrix method.
        for (i, len) in [1u64 << 20, (1 << 32) + 5, u64::MAX >> 3].into_iter().enumerate() {
            let (x, y) = (0x1234_5678u32.rotate_left(i as u32), 0x9abc_def0u32);
            assert_eq!(combine(x, y, len), crc32c::crc32c_combine(x, y, len as usize), "len {len}");
        }
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
