//! HTTP/2's wire (RFC 9113) as the fast path speaks it to clients (`fastpath::h2` drives
//! it): frames, the connection's settings and flow-control windows, and request heads.
//! Header compression is [`crate::hpack`].

pub mod conn;
pub mod flow;
pub mod frame;
pub mod request;

pub use flow::Window;

/// The connection preface a client sends first (section 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Error codes of section 7, as RST_STREAM and GOAWAY carry them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorCode {
    NoError = 0x0,
    Protocol = 0x1,
    Internal = 0x2,
    FlowControl = 0x3,
    SettingsTimeout = 0x4,
    StreamClosed = 0x5,
    FrameSize = 0x6,
    RefusedStream = 0x7,
    Cancel = 0x8,
    Compression = 0x9,
    Connect = 0xa,
    EnhanceYourCalm = 0xb,
    InadequateSecurity = 0xc,
    Http11Required = 0xd,
}

/// One side's SETTINGS (section 6.5.2), starting from the protocol's initial values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub header_table_size: u32,
    pub max_concurrent_streams: u32,
    pub initial_window_size: u32,
    pub max_frame_size: u32,
    pub max_header_list_size: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            header_table_size: 4096,
            // Unlimited until announced.
            max_concurrent_streams: u32::MAX,
            initial_window_size: flow::DEFAULT_WINDOW,
            max_frame_size: frame::DEFAULT_MAX_FRAME_SIZE,
            max_header_list_size: u32::MAX,
        }
    }
}

#[cfg(test)]
mod tests;
