//! HPACK (RFC 7541): HTTP/2's header compression, decoded and encoded for the fast path's
//! own HTTP/2 framing.
//!
//! - [`Decoder`] reads a client's header blocks into [`Fields`], one buffer per block rather
//!   than an allocation per name and value, and keeps the connection's dynamic table. Every
//!   bound is the caller's: the table's size (our SETTINGS_HEADER_TABLE_SIZE) and the list's
//!   (SETTINGS_MAX_HEADER_LIST_SIZE). A block over the list bound is still decoded to the
//!   end, so the table stays in step with the client's and only that stream is refused.
//! - [`Encoder`] writes answers' header blocks. It never adds to the dynamic table: an
//!   answer's fields rarely repeat within a connection often enough to pay for the table's
//!   upkeep, and a table of size 0, announced once, leaves the client's SETTINGS nothing to
//!   change.
//!
//! Decoding errors other than an oversized list are COMPRESSION_ERROR: the connection's
//! table can no longer be trusted, so the connection ends (RFC 9113 section 4.3).

mod decode;
mod encode;
pub mod huffman;
mod table;

pub use decode::Decoder;
pub use encode::Encoder;
pub use table::STATIC;

/// A decoding failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the header block ends inside a field")]
    Truncated,
    #[error("an integer in the header block does not fit")]
    IntegerOverflow,
    #[error("index {0} is in neither table")]
    BadIndex(usize),
    #[error("a table size update to {size} is over the limit of {limit}")]
    TableSizeOverLimit { size: usize, limit: usize },
    #[error("a table size update follows a field")]
    LateTableSizeUpdate,
    #[error("a Huffman-coded string does not decode")]
    Huffman,
    #[error("the header list is over {limit} bytes")]
    ListTooLarge { limit: usize },
}

impl DecodeError {
    /// Whether the connection must end: every error but an oversized list leaves the
    /// dynamic table out of step with the peer's.
    pub fn is_connection_error(&self) -> bool {
        !matches!(self, DecodeError::ListTooLarge { .. })
    }
}

/// A decoded header list: names and values in one buffer, in the order received.
#[derive(Debug, Default, Clone)]
pub struct Fields {
    bytes: Vec<u8>,
    spans: Vec<Span>,
    /// The list's size as SETTINGS_MAX_HEADER_LIST_SIZE counts it (RFC 9113 section 6.5.2).
    size: usize,
}

#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    name_end: usize,
    end: usize,
}

impl Fields {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.spans.clear();
        self.size = 0;
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Empties the list and gives its buffers back to the allocator.
    pub fn free(&mut self) {
        self.bytes = Vec::new();
        self.spans = Vec::new();
        self.size = 0;
    }

    /// Octets held on the heap, for memory accounting.
    pub fn heap_size(&self) -> usize {
        self.bytes.capacity() + self.spans.capacity() * std::mem::size_of::<Span>()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The list's size: each field's name and value plus 32.
    pub fn list_size(&self) -> usize {
        self.size
    }

    /// Field `i` as (name, value).
    pub fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        self.spans.get(i).map(|s| self.field(s))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans.iter().map(|s| self.field(s))
    }

    /// Adds a field.
    pub fn push(&mut self, name: &[u8], value: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(name);
        let name_end = self.bytes.len();
        self.bytes.extend_from_slice(value);
        self.close(start, name_end);
    }

    fn field(&self, s: &Span) -> (&[u8], &[u8]) {
        (
            &self.bytes[s.start..s.name_end],
            &self.bytes[s.name_end..s.end],
        )
    }

    /// Records the field whose name and value were just written at `start..`.
    fn close(&mut self, start: usize, name_end: usize) {
        let end = self.bytes.len();
        self.size += end - start + 32;
        self.spans.push(Span {
            start,
            name_end,
            end,
        });
    }
}

#[cfg(test)]
mod tests;
