//! Header block decoding (RFC 7541 sections 5 and 6).

use super::table::{Dynamic, STATIC};
use super::{DecodeError, Fields, huffman};

/// Continuation octets an integer may take past its prefix: 2^28 is far beyond any index,
/// length or table size a header block can carry.
const MAX_INTEGER_SHIFT: u32 = 28;

/// One connection's decoding state: its dynamic table.
#[derive(Debug)]
pub struct Decoder {
    table: Dynamic,
    /// The table size we announced (SETTINGS_HEADER_TABLE_SIZE): no size update may exceed it.
    limit: usize,
}

impl Decoder {
    /// A decoder whose table may hold `limit` octets (4,096 unless SETTINGS said otherwise).
    pub fn new(limit: usize) -> Self {
        Self {
            table: Dynamic::new(limit),
            limit,
        }
    }

    /// Octets in the dynamic table now.
    pub fn table_size(&self) -> usize {
        self.table.size()
    }

    /// Decodes one whole header block (HEADERS and its CONTINUATIONs, joined) into `out`,
    /// which is cleared first. Past `max_list_size` the block is still decoded, to keep the
    /// table in step, but its fields are dropped and `ListTooLarge` returned.
    pub fn decode(
        &mut self,
        block: &[u8],
        max_list_size: usize,
        out: &mut Fields,
    ) -> Result<(), DecodeError> {
        out.clear();
        let mut pos = 0;
        let mut fields_seen = false;
        let mut over = false;
        while let Some(&first) = block.get(pos) {
            let start = out.bytes.len();
            if first & 0x80 != 0 {
                // Indexed field (6.1).
                let index = integer(block, &mut pos, 7)?;
                let (name, value) = self.entry(index)?;
                out.push(name, value);
            } else if first & 0xc0 == 0x40 {
                // Literal with incremental indexing (6.2.1).
                self.literal(block, &mut pos, 6, out)?;
                if let Some((name, value)) = out.get(out.len() - 1) {
                    self.table.insert(name, value);
                }
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update (6.3): only before the block's first field.
                if fields_seen {
                    return Err(DecodeError::LateTableSizeUpdate);
                }
                let size = integer(block, &mut pos, 5)?;
                if size > self.limit {
                    return Err(DecodeError::TableSizeOverLimit {
                        size,
                        limit: self.limit,
                    });
                }
                self.table.set_max(size);
                continue;
            } else {
                // Literal without indexing (6.2.2) or never indexed (6.2.3): the same to a
                // decoder that forwards nothing compressed.
                self.literal(block, &mut pos, 4, out)?;
            }
            fields_seen = true;
            if over || out.size > max_list_size {
                // Keep memory to the bound: the field just read goes again.
                over = true;
                out.size -= out.bytes.len() - start + 32;
                out.bytes.truncate(start);
                out.spans.pop();
            }
        }
        if over {
            return Err(DecodeError::ListTooLarge {
                limit: max_list_size,
            });
        }
        Ok(())
    }

    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), DecodeError> {
        match index {
            0 => Err(DecodeError::BadIndex(0)),
            1..=61 => Ok(STATIC[index - 1]),
            _ => self
                .table
                .get(index - 62)
                .ok_or(DecodeError::BadIndex(index)),
        }
    }

    /// A literal field whose name index has a `prefix`-bit prefix: name (indexed or a
    /// string), then the value string, appended to `out`.
    fn literal(
        &self,
        block: &[u8],
        pos: &mut usize,
        prefix: u32,
        out: &mut Fields,
    ) -> Result<(), DecodeError> {
        let start = out.bytes.len();
        let name_index = integer(block, pos, prefix)?;
        if name_index == 0 {
            string(block, pos, &mut out.bytes)?;
        } else {
            let (name, _) = self.entry(name_index)?;
            out.bytes.extend_from_slice(name);
        }
        let name_end = out.bytes.len();
        string(block, pos, &mut out.bytes)?;
        out.close(start, name_end);
        Ok(())
    }
}

/// Reads an integer whose first octet keeps `prefix` bits for it (5.1).
fn integer(block: &[u8], pos: &mut usize, prefix: u32) -> Result<usize, DecodeError> {
    let first = *block.get(*pos).ok_or(DecodeError::Truncated)?;
    *pos += 1;
    let max = (1usize << prefix) - 1;
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let octet = *block.get(*pos).ok_or(DecodeError::Truncated)?;
        *pos += 1;
        if shift > MAX_INTEGER_SHIFT {
            return Err(DecodeError::IntegerOverflow);
        }
        value = (usize::from(octet & 0x7f) << shift)
            .checked_add(value)
            .ok_or(DecodeError::IntegerOverflow)?;
        if octet & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
    }
}

/// Reads a string literal (5.2), Huffman-coded or not, appending its octets to `out`.
fn string(block: &[u8], pos: &mut usize, out: &mut Vec<u8>) -> Result<(), DecodeError> {
    let coded = block.get(*pos).ok_or(DecodeError::Truncated)? & 0x80 != 0;
    let len = integer(block, pos, 7)?;
    let raw = pos
        .checked_add(len)
        .and_then(|end| block.get(*pos..end))
        .ok_or(DecodeError::Truncated)?;
    *pos += len;
    if coded {
        huffman::decode(raw, out).map_err(|_| DecodeError::Huffman)
    } else {
        out.extend_from_slice(raw);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_of_the_rfc_examples() {
        // C.1.1: 10 in a 5-bit prefix; C.1.2: 1337 in a 5-bit prefix; C.1.3: 42 at an octet.
        let mut pos = 0;
        assert_eq!(integer(&[0b0000_1010], &mut pos, 5), Ok(10));
        pos = 0;
        assert_eq!(integer(&[0b0001_1111, 0x9a, 0x0a], &mut pos, 5), Ok(1337));
        assert_eq!(pos, 3);
        pos = 0;
        assert_eq!(integer(&[42], &mut pos, 8), Ok(42));
    }

    #[test]
    fn integers_too_long_or_cut_short_are_refused() {
        let mut pos = 0;
        let endless = [0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(
            integer(&endless, &mut pos, 5),
            Err(DecodeError::IntegerOverflow)
        );
        pos = 0;
        assert_eq!(
            integer(&[0x1f, 0x9a], &mut pos, 5),
            Err(DecodeError::Truncated)
        );
    }
}
