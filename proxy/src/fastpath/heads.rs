//! The heads the fast path sends on: the request head it writes upstream and, when header
//! modifiers or framing ask for it, the response head it writes to the client.

use super::MAX_RESPONSE_HEADERS;
use crate::forwarded::Forwarded;
use crate::head::joined_cookies;
use crate::policy::{FieldOp, PolicyField};
use crate::request::Head;
use coxswain_api::snapshot as snap;
use std::io::Write;

/// An edit a route or backend filter makes to the fields of the request sent upstream.
pub(super) enum RequestEdit<'m> {
    Fields(&'m snap::HeaderModifier),
    /// A URL rewrite's hostname: the Host sent.
    Host(&'m str),
}

/// The head sent upstream: the request line with `target` (normalised, then rewritten), `host`
/// as a Host field (an HTTP/2 request's :authority), the received fields less the forwarded
/// ones and this hop's (`this_hop`), then the forwarded fields this proxy sets; then the
/// route's and the backend's edits, in that order, as Pingora applies them.
pub(super) fn write_upstream_head<'m, H: Head + ?Sized>(
    out: &mut Vec<u8>,
    head: &H,
    host: Option<&str>,
    target: &str,
    forwarded: &Forwarded<'_>,
    edits: impl Iterator<Item = RequestEdit<'m>>,
) {
    out.clear();
    out.extend_from_slice(head.method().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let cookie = joined_cookies(head);
    let crumb = |name: &[u8]| cookie.is_some() && name.eq_ignore_ascii_case(b"cookie");
    let mut edits = edits.peekable();
    if edits.peek().is_some() {
        // The forwarded fields' values, rendered one after another into one buffer that the
        // list borrows: one allocation, not one per field.
        let mut rendered = Vec::with_capacity(256);
        let mut spans = [("", 0, 0); Forwarded::MOST_FIELDS];
        let mut count = 0;
        forwarded.each(&mut |name, parts| {
            let start = rendered.len();
            for p in parts {
                rendered.extend_from_slice(p.as_bytes());
            }
            debug_assert!(
                count < spans.len(),
                "more forwarded fields than MOST_FIELDS"
            );
            if let Some(span) = spans.get_mut(count) {
                *span = (name, start, rendered.len());
                count += 1;
            }
        });
        let mut fields = Fields(Vec::with_capacity(24));
        if let Some(host) = host {
            fields.0.push((b"host", host.as_bytes()));
        }
        head.each_header(&mut |name, value| {
            if !(forwarded.replaces(name) || this_hop(name) || crumb(name)) {
                fields.0.push((name, value));
            }
        });
        if let Some(cookie) = &cookie {
            fields.0.push((b"cookie", cookie));
        }
        for &(name, start, end) in &spans[..count] {
            fields.0.push((name.as_bytes(), &rendered[start..end]));
        }
        for edit in edits {
            match edit {
                RequestEdit::Fields(m) => crate::filters::modify_headers(&mut fields, m),
                RequestEdit::Host(name) => {
                    use crate::filters::EditHeaders;
                    fields.set("host", name);
                }
            }
        }
        fields.write(out);
        out.extend_from_slice(b"\r\n");
        return;
    }
    if let Some(host) = host {
        out.extend_from_slice(b"host: ");
        out.extend_from_slice(host.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    head.each_header(&mut |name, value| {
        if forwarded.replaces(name) || this_hop(name) || crumb(name) {
            return;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    });
    if let Some(cookie) = &cookie {
        out.extend_from_slice(b"cookie: ");
        out.extend_from_slice(cookie);
        out.extend_from_slice(b"\r\n");
    }
    forwarded.each(&mut |name, parts| {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        for p in parts {
            out.extend_from_slice(p.as_bytes());
        }
        out.extend_from_slice(b"\r\n");
    });
    out.extend_from_slice(b"\r\n");
}

/// The target a route's URL rewrites make of `target` (the normalised one), applied in the
/// order Pingora applies them (`handler::edits`): a prefix or full-path rewrite works on what
/// the ones before it left, a regex one renders the route's template from the client's
/// target. A result that is not a valid target is dropped with a warning, as there. None: no
/// rewrite.
pub(super) fn rewritten<'f>(
    route: &crate::router::CompiledRoute,
    filters: impl Iterator<Item = &'f snap::Filter>,
    target: &str,
) -> Option<String> {
    let mut out: Option<String> = None;
    for f in filters {
        let Some(snap::filter::Kind::UrlRewrite(snap::UrlRewrite { path: Some(m), .. })) = &f.kind
        else {
            continue;
        };
        let new = match &m.kind {
            Some(snap::path_modifier::Kind::ReplaceRegexMatch(_)) => route.regex_rewrite(target),
            _ => Some(crate::filters::rewrite_path(
                out.as_deref().unwrap_or(target),
                route.matched_prefix(),
                m,
            )),
        };
        match new {
            Some(new) if new.parse::<hyper::Uri>().is_ok() => out = Some(new),
            Some(new) => tracing::warn!(path = %new, "rewritten path is not a valid URI"),
            None => {}
        }
    }
    out
}

/// Adds a field at the end of the request head in `head` (which ends with its empty line).
pub(super) fn append_field(head: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    debug_assert!(head.ends_with(b"\r\n\r\n"));
    head.truncate(head.len() - 2);
    head.extend_from_slice(name);
    head.extend_from_slice(b": ");
    head.extend_from_slice(value);
    head.extend_from_slice(b"\r\n\r\n");
}

/// The fields about the client's hop that Pingora's request policy takes off before a
/// request goes upstream (RFC 9110 section 7.6.1), taken off here too so both engines send
/// the same head: Connection (only ever `close` or `keep-alive` on this path, naming no
/// field), Keep-Alive, Proxy-Connection, the proxy's own credentials, and the upgrade fields,
/// which requests with them never reach this path with. A Transfer-Encoding stays: on this
/// path it is a lone `chunked`, true of the body as it goes upstream (framed again, but
/// chunked still). Sorted out by length first: most fields are none of these.
fn this_hop(name: &[u8]) -> bool {
    let is = |hop: &str| name.eq_ignore_ascii_case(hop.as_bytes());
    match name.len() {
        2 => is("te"),
        7 => is("trailer") || is("upgrade"),
        10 => is("connection") || is("keep-alive"),
        14 => is("http2-settings"),
        16 => is("proxy-connection"),
        18 => is("proxy-authenticate"),
        19 => is("proxy-authorization"),
        _ => false,
    }
}

/// Header fields being edited by header modifiers, all borrowed: from the received head,
/// the proxy's rendered values and the snapshot's modifiers. Only routes with modifiers pay
/// for the list.
struct Fields<'a>(Vec<Field<'a>>);

/// A field's name and value.
type Field<'a> = (&'a [u8], &'a [u8]);

impl Fields<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        for (name, value) in &self.0 {
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// The semantics of Pingora's header maps, which the other engine edits: set replaces every
/// field of that name, add appends one, remove drops them all; names compare without case.
impl<'a> crate::filters::EditHeaders<'a> for Fields<'a> {
    fn set(&mut self, name: &'a str, value: &'a str) {
        self.remove(name);
        self.add(name, value);
    }
    fn add(&mut self, name: &'a str, value: &'a str) {
        self.0.push((name.as_bytes(), value.as_bytes()));
    }
    fn remove(&mut self, name: &str) {
        self.0
            .retain(|(n, _)| !n.eq_ignore_ascii_case(name.as_bytes()));
    }
}

/// The response head as it goes to the client: the status line, then the fields less any
/// Content-Length beside a Transfer-Encoding (`drop_length`), with the route policy's fields
/// (`added`: CORS) and then the header modifiers' `edits`, in the order Pingora's response
/// filter applies them; with `close`, its connection fields replaced by `connection: close`
/// (after the edits, as Pingora sets the field when it writes the head).
pub(super) fn edited_response_head(
    head: &[u8],
    drop_length: bool,
    (added, edits): (&[PolicyField], &[snap::HeaderModifier]),
    close: bool,
) -> Option<Vec<u8>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut parsed = httparse::Response::new(&mut headers);
    parsed.parse(head).ok()?;
    // A backend may end its lines with a bare LF; the head goes on with CRLF.
    let line_end = head.iter().position(|b| *b == b'\n')?;
    let status_line = head[..line_end]
        .strip_suffix(b"\r")
        .unwrap_or(&head[..line_end]);
    let mut fields = Fields(Vec::with_capacity(
        parsed.headers.len() + added.len() + edits.len(),
    ));
    for h in parsed.headers.iter() {
        if !(drop_length && h.name.eq_ignore_ascii_case("content-length")) {
            fields.0.push((h.name.as_bytes(), h.value));
        }
    }
    for (name, value, op) in added {
        use crate::filters::EditHeaders;
        match op {
            FieldOp::Set => fields.set(name.as_ref(), value),
            FieldOp::Add => fields.add(name.as_ref(), value),
        }
    }
    for m in edits {
        crate::filters::modify_headers(&mut fields, m);
    }
    if close {
        use crate::filters::EditHeaders;
        fields.remove("keep-alive");
        fields.set("connection", "close");
    }
    let mut out = Vec::with_capacity(head.len() + 64);
    out.extend_from_slice(status_line);
    out.extend_from_slice(b"\r\n");
    fields.write(&mut out);
    out.extend_from_slice(b"\r\n");
    Some(out)
}

/// A response head without its Content-Length lines (a Transfer-Encoding frames the body).
pub(super) fn without_content_length(head: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len());
    for line in head.split_inclusive(|b| *b == b'\n') {
        let is_length = line
            .get(..15)
            .is_some_and(|n| n.eq_ignore_ascii_case(b"content-length:"));
        if !is_length {
            out.extend_from_slice(line);
        }
    }
    out
}

/// The head of an answer with no body, which keeps the connection open unless the client
/// asked to close it.
pub(super) fn answer_head(status: u16, fields: &[PolicyField], close: bool) -> Vec<u8> {
    let reason = hyper::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let mut out = Vec::with_capacity(128);
    let _ = write!(out, "HTTP/1.1 {status} {reason}\r\n");
    for (name, value, _) in fields {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    out.extend_from_slice(b"content-length: 0\r\n");
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The answers this path writes itself; the connection closes after each.
pub fn status_response(status: u16) -> &'static [u8] {
    match status {
        400 => b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        405 => b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        408 => b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        431 => b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        500 => b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\ncache-control: private, no-store\r\nconnection: close\r\n\r\n",
        503 => b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\ncache-control: private, no-store\r\nconnection: close\r\n\r\n",
        504 => b"HTTP/1.1 504 Gateway Timeout\r\ncontent-length: 0\r\ncache-control: private, no-store\r\nconnection: close\r\n\r\n",
        _ => b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\ncache-control: private, no-store\r\nconnection: close\r\n\r\n",
    }
}
