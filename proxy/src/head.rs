//! A request head as the engines parsed it: the one view the request layer, the router and
//! the forwarded fields read, whichever engine holds the bytes.

use crate::router::Headers;

/// The protocol version a request arrived with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
    Http2,
}

/// A request head, however an engine parsed it.
pub trait Head: Headers {
    fn method(&self) -> &str;
    /// The request target as received (origin-form "/a?b", absolute-form, ...).
    fn target(&self) -> &[u8];
    fn version(&self) -> Version;
    /// HTTP/2's :authority (HTTP/1 carries the host in the target or the Host header).
    fn authority(&self) -> Option<&[u8]> {
        None
    }
    /// Calls `f` with every header field, in order; names in any case.
    fn each_header<'s>(&'s self, f: &mut dyn FnMut(&'s [u8], &'s [u8]));
}
