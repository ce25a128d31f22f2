//! HPACK's Huffman code (RFC 7541 section 5.2 and appendix B).
//!
//! The code is canonical: ordering the symbols by code length, then by value, and counting up
//! gives every code. So only the lengths are written down here; the codes, and the tables
//! the decoder reads, are computed from them at compile time.

/// Code length in bits of each symbol: the 256 byte values, then EOS (256).
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, // 0..
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, // 16..
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, // 32..
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, // 48..
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, // 64..
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, // 80..
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, // 96..
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, // 112..
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, // 128..
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, // 144..
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, // 160..
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, // 176..
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, // 192..
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, // 208..
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, // 224..
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, // 240..
    30, // EOS
];

const EOS: u16 = 256;
const MAX_LENGTH: usize = 30;

/// The canonical code: per length, how many symbols have it; the symbols in code order; and
/// each symbol's code.
struct Canonical {
    count: [u32; MAX_LENGTH + 1],
    symbols: [u16; 257],
    codes: [u32; 257],
}

const fn canonical() -> Canonical {
    let mut count = [0u32; MAX_LENGTH + 1];
    let mut s = 0;
    while s < 257 {
        count[LENGTHS[s] as usize] += 1;
        s += 1;
    }
    let mut first = [0u32; MAX_LENGTH + 1];
    let mut start = [0usize; MAX_LENGTH + 1];
    let mut code = 0u32;
    let mut index = 0usize;
    let mut len = 1;
    while len <= MAX_LENGTH {
        first[len] = code;
        start[len] = index;
        code = (code + count[len]) << 1;
        index += count[len] as usize;
        len += 1;
    }
    let mut symbols = [0u16; 257];
    let mut codes = [0u32; 257];
    let mut next = start;
    let mut s = 0;
    while s < 257 {
        let len = LENGTHS[s] as usize;
        let rank = next[len];
        symbols[rank] = s as u16;
        codes[s] = first[len] + (rank - start[len]) as u32;
        next[len] += 1;
        s += 1;
    }
    Canonical {
        count,
        symbols,
        codes,
    }
}

const CODE: Canonical = canonical();

/// For each value of the next 8 input bits: the symbol whose code of at most 8 bits they
/// start with, and that length (`symbol | length << 9`), or 0 when the code is longer. Most
/// bytes of header fields have codes of 5 to 8 bits, so most symbols take one lookup.
const SHORT: [u16; 256] = short_codes();

const fn short_codes() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut s = 0;
    while s < 256 {
        let len = LENGTHS[s] as u32;
        if len <= 8 {
            let base = (CODE.codes[s] << (8 - len)) as usize;
            let mut fill = 0;
            while fill < (1 << (8 - len)) {
                table[base + fill] = s as u16 | (len as u16) << 9;
                fill += 1;
            }
        }
        s += 1;
    }
    table
}

/// A Huffman-coded string that does not decode: a code for EOS, or padding longer than 7 bits
/// or not all ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidHuffman;

/// Decodes `input`, appending the bytes to `out`.
pub fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), InvalidHuffman> {
    out.reserve(input.len() * 8 / 5 + 1);
    // Bits not yet decoded, the oldest at the top of the low `bits` bits.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    let mut rest = input.iter();
    loop {
        while bits <= 56 {
            match rest.next() {
                Some(&b) => {
                    acc = acc << 8 | u64::from(b);
                    bits += 8;
                }
                None => break,
            }
        }
        if bits == 0 {
            return Ok(());
        }
        // The next 8 bits, padded with ones past the end as the encoder pads.
        let window = if bits >= 8 {
            (acc >> (bits - 8)) as u8
        } else {
            ((acc << (8 - bits)) as u8) | (0xff >> bits)
        };
        let short = SHORT[usize::from(window)];
        if short != 0 && u32::from(short >> 9) <= bits {
            out.push(short as u8);
            bits -= u32::from(short >> 9);
            acc &= mask(bits);
            continue;
        }
        if bits < 8 {
            // What is left is padding: fewer than 8 bits, and all ones.
            return if acc == mask(bits) {
                Ok(())
            } else {
                Err(InvalidHuffman)
            };
        }
        let (symbol, len) = long_code(acc, bits)?;
        if symbol == EOS {
            return Err(InvalidHuffman);
        }
        out.push(symbol as u8);
        bits -= len;
        acc &= mask(bits);
    }
}

fn mask(bits: u32) -> u64 {
    if bits == 0 {
        0
    } else {
        u64::MAX >> (64 - bits)
    }
}

/// Walks the canonical code one bit at a time over the `bits` bits in `acc`: for codes longer
/// than 8 bits, which are rare in header fields.
fn long_code(acc: u64, bits: u32) -> Result<(u16, u32), InvalidHuffman> {
    let mut code = 0u32;
    let mut first = 0u32;
    let mut index = 0u32;
    for len in 1..=MAX_LENGTH as u32 {
        if len > bits {
            // Input ended inside a code: more than 7 bits of padding, or a truncated code.
            return Err(InvalidHuffman);
        }
        code |= ((acc >> (bits - len)) & 1) as u32;
        let count = CODE.count[len as usize];
        if code.wrapping_sub(first) < count {
            return Ok((CODE.symbols[(index + code - first) as usize], len));
        }
        index += count;
        first = (first + count) << 1;
        code <<= 1;
    }
    Err(InvalidHuffman)
}

/// Bytes `input` takes Huffman-coded.
pub fn encoded_len(input: &[u8]) -> usize {
    let bits: usize = input
        .iter()
        .map(|&b| usize::from(LENGTHS[usize::from(b)]))
        .sum();
    bits.div_ceil(8)
}

/// Appends `input` Huffman-coded to `out`, padded with ones to a whole byte.
pub fn encode(input: &[u8], out: &mut Vec<u8>) {
    out.reserve(encoded_len(input));
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    for &b in input {
        let len = u32::from(LENGTHS[usize::from(b)]);
        acc = acc << len | u64::from(CODE.codes[usize::from(b)]);
        bits += len;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
        acc &= mask(bits);
    }
    if bits > 0 {
        out.push((acc << (8 - bits)) as u8 | (0xff >> bits));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_those_of_the_rfc() {
        // A few codes as RFC 7541 appendix B prints them, from each end of the lengths.
        for (symbol, code, len) in [
            (b'0' as usize, 0x0, 5),
            (b'a' as usize, 0x3, 5),
            (b' ' as usize, 0x14, 6),
            (b'&' as usize, 0xf8, 8),
            (0, 0x1ff8, 13),
            (255, 0x3ffffee, 26),
            (10, 0x3ffffffc, 30),
        ] {
            assert_eq!(
                (CODE.codes[symbol], LENGTHS[symbol]),
                (code, len),
                "{symbol}"
            );
        }
        assert_eq!(CODE.codes[EOS as usize], 0x3fffffff);
    }

    #[test]
    fn every_byte_round_trips_alone_and_together() {
        let all: Vec<u8> = (0..=255).collect();
        for b in &all {
            let mut coded = Vec::new();
            encode(std::slice::from_ref(b), &mut coded);
            assert_eq!(coded.len(), encoded_len(std::slice::from_ref(b)));
            let mut back = Vec::new();
            decode(&coded, &mut back).expect("decodes");
            assert_eq!(back, [*b]);
        }
        let mut coded = Vec::new();
        encode(&all, &mut coded);
        let mut back = Vec::new();
        decode(&coded, &mut back).expect("decodes");
        assert_eq!(back, all);
    }

    #[test]
    fn rfc_example_strings() {
        // RFC 7541 C.4.1: "www.example.com".
        let coded = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        let mut out = Vec::new();
        decode(&coded, &mut out).expect("decodes");
        assert_eq!(out, b"www.example.com");
        let mut again = Vec::new();
        encode(b"www.example.com", &mut again);
        assert_eq!(again, coded);
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        let mut out = Vec::new();
        // 'a' (00011) then 3 bits of padding that are not all ones.
        assert_eq!(decode(&[0b0001_1010], &mut out), Err(InvalidHuffman));
        // 'a' then a whole byte of ones: padding longer than 7 bits.
        assert_eq!(decode(&[0b0001_1111, 0xff], &mut out), Err(InvalidHuffman));
        // EOS itself (30 ones) with 2 bits of padding.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], &mut out),
            Err(InvalidHuffman)
        );
        // An empty string and a lone short padding are fine.
        out.clear();
        assert_eq!(decode(&[], &mut out), Ok(()));
        assert_eq!(decode(&[0b0001_1111], &mut out), Ok(()));
        assert_eq!(out, b"a");
    }
}
