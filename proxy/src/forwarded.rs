//! Who the client is, and what the backend is told about it.
//!
//! Every proxied request carries X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host,
//! X-Forwarded-Port and X-Real-IP, as ingress-nginx sets them. What a peer sent in those
//! fields (and in `Forwarded`) is believed only when the peer is a trusted proxy
//! (`--trusted-proxies`); from anyone else it is dropped and replaced, so a client cannot
//! choose the address a backend or an allowlist sees.
//!
//! From a trusted peer, X-Forwarded-For is appended to, the peer's X-Forwarded-Proto, -Host
//! and -Port are kept, and the client is the right-most X-Forwarded-For address that is not
//! itself a trusted proxy (ingress-nginx's `real_ip_recursive`). That client address is
//! what route allowlists, access logs and X-Real-IP use.
//!
//! The peer is the TCP peer, or the source address of a PROXY protocol header when the
//! listener takes one (`proxy_protocol`).
//!
//! With tracing on (`trace`), the backend is also told the request's trace context: a
//! `traceparent` naming this proxy's span replaces the one received.

use crate::addresses::AddressSet;
use crate::head::Head;
use std::borrow::Cow;
use std::fmt::Write as _;
use std::net::IpAddr;

/// How the proxy learns the client's address.
#[derive(Debug, Clone, Default)]
pub struct ClientAddress {
    /// Peers whose forwarded headers are believed.
    pub trusted: AddressSet,
    /// Every connection starts with a PROXY protocol (v1 or v2) header, which names the
    /// client; a connection without a valid one is closed.
    pub proxy_protocol: bool,
}

impl ClientAddress {
    pub fn trusts(&self, ip: IpAddr) -> bool {
        !self.trusted.is_empty() && self.trusted.allows(ip)
    }
}

/// The request fields this module reads and rewrites (lower case).
pub const FIELDS: [&str; 6] = [
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-real-ip",
    "forwarded",
];

/// Whether `name` is one of [`FIELDS`]; the engines drop these from the request and send
/// [`Forwarded::each`] instead (`forwarded` is kept from a trusted peer, see there).
pub fn is_field(name: &[u8]) -> bool {
    name.len() >= 9
        && (name[..2].eq_ignore_ascii_case(b"x-") || name.eq_ignore_ascii_case(b"forwarded"))
        && FIELDS
            .iter()
            .any(|f| name.eq_ignore_ascii_case(f.as_bytes()))
}

/// What one request tells its backend about the client, decided from the head once. It
/// borrows from the head, so the fast path sends it without allocating.
#[derive(Debug)]
pub struct Forwarded<'h> {
    /// The client: the peer, or, behind trusted proxies, what they say.
    pub client: Option<IpAddr>,
    /// The peer is a trusted proxy: its fields were believed.
    pub trusted_peer: bool,
    peer: Option<IpAddr>,
    /// X-Forwarded-For from a trusted peer (several fields joined with ", ").
    prior: Cow<'h, str>,
    proto: &'h str,
    host: &'h str,
    /// A trusted peer's X-Forwarded-Port, else the listener's port.
    port: Result<&'h str, u16>,
    /// The request's trace context, when tracing is on (set by `request::forwarded`).
    pub trace: Option<crate::trace::Begun>,
}

impl<'h> Forwarded<'h> {
    /// `peer`: who sent this request (None when not known: nothing is appended then);
    /// `host`: the host the request was routed on; `https` and `port`: the listener's.
    pub fn resolve<H: Head + ?Sized>(
        head: &'h H,
        peer: Option<IpAddr>,
        host: &'h str,
        https: bool,
        port: u16,
        trust: &ClientAddress,
    ) -> Self {
        let peer = peer.map(canonical);
        let trusted_peer = peer.is_some_and(|p| trust.trusts(p));
        let mut prior: Cow<'h, str> = Cow::Borrowed("");
        let (mut proto, mut fwd_host, mut fwd_port) = (None, None, None);
        if trusted_peer {
            head.each_header(&mut |name, value| {
                let Some(value) = std::str::from_utf8(value)
                    .ok()
                    .map(str::trim)
                    .filter(|v| !v.is_empty() && printable(v))
                else {
                    return;
                };
                if name.eq_ignore_ascii_case(b"x-forwarded-for") {
                    if prior.is_empty() {
                        prior = Cow::Borrowed(value);
                    } else {
                        let joined = prior.to_mut();
                        joined.push_str(", ");
                        joined.push_str(value);
                    }
                } else if name.eq_ignore_ascii_case(b"x-forwarded-proto") {
                    proto.get_or_insert(value);
                } else if name.eq_ignore_ascii_case(b"x-forwarded-host") {
                    fwd_host.get_or_insert(value);
                } else if name.eq_ignore_ascii_case(b"x-forwarded-port") {
                    fwd_port.get_or_insert(value);
                }
            });
        }
        let client = match peer {
            Some(p) if trusted_peer => Some(client_behind(&prior, p, trust)),
            p => p,
        };
        Self {
            client,
            trusted_peer,
            peer,
            prior,
            proto: proto.unwrap_or(if https { "https" } else { "http" }),
            host: fwd_host.unwrap_or(host),
            port: fwd_port.ok_or(port),
            trace: None,
        }
    }

    /// The most fields [`Forwarded::each`] sends: X-Forwarded-For, -Proto, -Host and -Port,
    /// X-Real-IP and traceparent, each once at most.
    pub const MOST_FIELDS: usize = 6;

    /// Calls `f` with each field to send, in a fixed order, at most `MOST_FIELDS` times; a
    /// value comes in parts that are sent one after the other.
    pub fn each(&self, f: &mut dyn FnMut(&'static str, &[&str])) {
        let mut peer = Text::new();
        if let Some(p) = self.peer {
            let _ = write!(peer, "{p}");
            if self.prior.is_empty() {
                f("x-forwarded-for", &[peer.as_str()]);
            } else {
                f("x-forwarded-for", &[&self.prior, ", ", peer.as_str()]);
            }
        } else if !self.prior.is_empty() {
            f("x-forwarded-for", &[&self.prior]);
        }
        f("x-forwarded-proto", &[self.proto]);
        f("x-forwarded-host", &[self.host]);
        let mut port = Text::new();
        match self.port {
            Ok(p) => f("x-forwarded-port", &[p]),
            Err(n) => {
                let _ = write!(port, "{n}");
                f("x-forwarded-port", &[port.as_str()]);
            }
        }
        if let Some(c) = self.client {
            let mut ip = Text::new();
            let _ = write!(ip, "{c}");
            f("x-real-ip", &[ip.as_str()]);
        }
        if let Some(t) = &self.trace {
            f(
                crate::trace::TRACEPARENT,
                &[t.context.traceparent().as_str()],
            );
        }
    }

    /// Whether a received field is left out of the request sent upstream, because
    /// [`Forwarded::each`] sends it instead: the forwarded fields (less a kept `Forwarded`),
    /// and `traceparent` when tracing is on.
    pub fn replaces(&self, name: &[u8]) -> bool {
        (is_field(name) && !self.keeps(name))
            || (self.trace.is_some() && name.eq_ignore_ascii_case(b"traceparent"))
    }

    /// Whether a received field is passed on as it came: only `Forwarded` from a trusted
    /// peer (the X- fields are always sent from [`Forwarded::each`]).
    pub fn keeps(&self, name: &[u8]) -> bool {
        self.trusted_peer && name.eq_ignore_ascii_case(b"forwarded")
    }
}

/// A request's one `traceparent` value; None when it has none or several (a context that
/// cannot be told apart starts a new trace).
pub fn traceparent<H: Head + ?Sized>(head: &H) -> Option<&[u8]> {
    let mut found = None;
    let mut count = 0;
    head.each_header(&mut |name, value| {
        if name.eq_ignore_ascii_case(b"traceparent") {
            count += 1;
            found = Some(value);
        }
    });
    found.filter(|_| count == 1)
}

/// Room for an address or a port on the stack (the longest IPv6 text is 45 bytes).
struct Text {
    buf: [u8; 48],
    len: usize,
}

impl Text {
    fn new() -> Self {
        Self {
            buf: [0; 48],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        // Only `write_str` fills it, with whole strs.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl std::fmt::Write for Text {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let room = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        room.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// An IPv4 client on a dual-stack socket shows up as ::ffff:a.b.c.d; it is a.b.c.d.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Header values the engines can carry as they are (what `http::HeaderValue` takes).
fn printable(v: &str) -> bool {
    v.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
}

/// The client behind a chain of proxies that ends at the trusted `peer`: walking
/// X-Forwarded-For from the right, the first address that is not a trusted proxy. When
/// every address is trusted, the left-most; at a value that is not an address, the last
/// trusted hop before it (what it was told cannot be believed).
fn client_behind(for_list: &str, peer: IpAddr, trust: &ClientAddress) -> IpAddr {
    let mut client = peer;
    for entry in for_list.rsplit(',') {
        let Some(ip) = parse_entry(entry.trim()) else {
            return client;
        };
        client = canonical(ip);
        if !trust.trusts(client) {
            return client;
        }
    }
    client
}

/// "203.0.113.7", "203.0.113.7:4711", "2001:db8::1" or "[2001:db8::1]:4711".
fn parse_entry(entry: &str) -> Option<IpAddr> {
    if let Ok(ip) = entry.parse() {
        return Some(ip);
    }
    if let Some(rest) = entry.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    let (ip, port) = entry.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    ip.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests;
