//! HPACK's two tables (RFC 7541 section 2.3): the static one of appendix A and the dynamic
//! one a connection's header blocks fill.

use std::collections::VecDeque;

/// RFC 7541 appendix A, index 1 first.
pub const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The static index of `name` (its first entry), for literals that reuse a static name.
pub fn static_name(name: &[u8]) -> Option<usize> {
    // Names are distinct past :status, and the pseudo-fields all start with ':'; comparing
    // the length first keeps the scan cheap.
    STATIC
        .iter()
        .position(|(n, _)| n.len() == name.len() && *n == name)
        .map(|i| i + 1)
}

/// What an entry counts for against the table's size: its octets plus 32 (section 4.1).
pub fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

/// The dynamic table: newest entry first (index 62), evicted from the oldest when an
/// insertion or a smaller maximum needs the room.
#[derive(Debug, Default)]
pub struct Dynamic {
    /// Name and value in one allocation, split at `name_len`.
    entries: VecDeque<(Box<[u8]>, usize)>,
    size: usize,
    max: usize,
}

impl Dynamic {
    pub fn new(max: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            size: 0,
            max,
        }
    }

    pub fn size(&self) -> usize {
        self.size
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entry `i`, 0 the newest.
    pub fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        self.entries
            .get(i)
            .map(|(bytes, name_len)| bytes.split_at(*name_len))
    }

    pub fn set_max(&mut self, max: usize) {
        self.max = max;
        self.evict_to(max);
    }

    /// Adds an entry. One larger than the whole table empties it and is not kept
    /// (section 4.4).
    pub fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = entry_size(name, value);
        if size > self.max {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max - size);
        let mut bytes = Vec::with_capacity(name.len() + value.len());
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(value);
        self.entries
            .push_front((bytes.into_boxed_slice(), name.len()));
        self.size += size;
    }

    fn evict_to(&mut self, room: usize) {
        while self.size > room {
            match self.entries.pop_back() {
                Some((bytes, _)) => self.size -= bytes.len() + 32,
                None => {
                    self.size = 0;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_names_are_found_by_their_first_index() {
        assert_eq!(static_name(b":status"), Some(8));
        assert_eq!(static_name(b"content-type"), Some(31));
        assert_eq!(static_name(b"www-authenticate"), Some(61));
        assert_eq!(static_name(b"x-custom"), None);
    }

    #[test]
    fn eviction_keeps_the_size_under_the_maximum() {
        // Each entry here is 1 + 1 + 32 = 34 octets: three fit in 110, not four.
        let mut table = Dynamic::new(110);
        for (n, v) in [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4")] {
            table.insert(n, v);
        }
        assert_eq!(table.len(), 3);
        assert_eq!(table.size(), 102);
        assert_eq!(table.get(0), Some((&b"d"[..], &b"4"[..])));
        assert_eq!(table.get(2), Some((&b"b"[..], &b"2"[..])));
        table.set_max(40);
        assert_eq!(table.len(), 1);
        table.insert(b"too-long-for-forty", b"octets");
        assert!(table.is_empty());
        assert_eq!(table.size(), 0);
    }
}
