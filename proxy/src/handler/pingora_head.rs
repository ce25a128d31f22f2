//! Pingora's parsed request head, read through the request layer's `Head`.

use crate::request::{Head, Version};
use crate::router::Headers;
use pingora::http::RequestHeader;

/// Pingora's parsed request as the request layer reads it.
pub(super) struct PingoraHead<'a>(pub(super) &'a RequestHeader);

impl Headers for PingoraHead<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Head for PingoraHead<'_> {
    fn method(&self) -> &str {
        self.0.method.as_str()
    }

    fn target(&self) -> &[u8] {
        self.0.raw_path()
    }

    fn version(&self) -> Version {
        match self.0.version {
            pingora::http::Version::HTTP_10 | pingora::http::Version::HTTP_09 => Version::Http10,
            pingora::http::Version::HTTP_2 | pingora::http::Version::HTTP_3 => Version::Http2,
            _ => Version::Http11,
        }
    }

    fn authority(&self) -> Option<&[u8]> {
        // HTTP/1 carries it in the target (absolute-form) or Host; HTTP/2 in :authority.
        (self.version() == Version::Http2)
            .then(|| self.0.uri.authority().map(|a| a.as_str().as_bytes()))
            .flatten()
    }

    fn each_header<'s>(&'s self, f: &mut dyn FnMut(&'s [u8], &'s [u8])) {
        for (name, value) in &self.0.headers {
            f(name.as_str().as_bytes(), value.as_bytes());
        }
    }
}
