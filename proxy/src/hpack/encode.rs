//! Header block encoding for answers (RFC 7541 sections 5 and 6), without the dynamic table.

use super::huffman;
use super::table::static_name;

/// One connection's encoding state.
#[derive(Debug, Default)]
pub struct Encoder {
    /// Whether the size update to 0 has been sent (in the connection's first block).
    announced: bool,
    /// A lowercased copy of a name that arrived with capitals (HTTP/1 backends send them;
    /// HTTP/2 forbids them, RFC 9113 section 8.2.1).
    lowered: Vec<u8>,
}

impl Encoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a header block. The connection's first says the table is 0 octets, so that no
    /// SETTINGS_HEADER_TABLE_SIZE the client sends later changes anything for it.
    pub fn begin(&mut self, out: &mut Vec<u8>) {
        if !self.announced {
            integer(0, 5, 0x20, out);
            self.announced = true;
        }
    }

    /// Encodes :status.
    pub fn status(&mut self, code: u16, out: &mut Vec<u8>) {
        let indexed = match code {
            200 => 8,
            204 => 9,
            206 => 10,
            304 => 11,
            400 => 12,
            404 => 13,
            500 => 14,
            _ => 0,
        };
        if indexed != 0 {
            integer(indexed, 7, 0x80, out);
            return;
        }
        // Literal without indexing, name :status (8); the code is three digits (100-999) on
        // every path that reaches here, and anything else is still sent as its digits.
        integer(8, 4, 0x00, out);
        let mut digits = [0u8; 5];
        let mut n = code;
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        string(&digits[at..], out);
    }

    /// Encodes a field as a literal without indexing, its name lowercased.
    pub fn field(&mut self, name: &[u8], value: &[u8], out: &mut Vec<u8>) {
        let name = if name.iter().any(u8::is_ascii_uppercase) {
            self.lowered.clear();
            self.lowered.extend(name.iter().map(u8::to_ascii_lowercase));
            &self.lowered[..]
        } else {
            name
        };
        match static_name(name) {
            Some(index) => integer(index, 4, 0x00, out),
            None => {
                out.push(0x00);
                string(name, out);
            }
        }
        string(value, out);
    }
}

/// Writes `value` with a `prefix`-bit prefix, the first octet's other bits `flags` (5.1).
fn integer(value: usize, prefix: u32, flags: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Writes a string literal, Huffman-coded when that is shorter (5.2).
fn string(s: &[u8], out: &mut Vec<u8>) {
    let coded = huffman::encoded_len(s);
    if coded < s.len() {
        integer(coded, 7, 0x80, out);
        huffman::encode(s, out);
    } else {
        integer(s.len(), 7, 0x00, out);
        out.extend_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_as_the_rfc_writes_them() {
        let mut out = Vec::new();
        integer(10, 5, 0, &mut out);
        integer(1337, 5, 0, &mut out);
        integer(42, 8, 0, &mut out);
        assert_eq!(out, [0x0a, 0x1f, 0x9a, 0x0a, 0x2a]);
    }

    #[test]
    fn the_first_block_announces_an_empty_table_once() {
        let mut encoder = Encoder::new();
        let mut out = Vec::new();
        encoder.begin(&mut out);
        encoder.status(200, &mut out);
        encoder.begin(&mut out);
        encoder.status(404, &mut out);
        assert_eq!(out, [0x20, 0x88, 0x8d]);
    }
}
