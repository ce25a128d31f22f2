//! A decoded request head checked against RFC 9113 sections 8.2 and 8.3, and read by the
//! request layer as any engine's head is ([`Head`]).
//!
//! A malformed head is its stream's PROTOCOL_ERROR (section 8.1.1): the connection goes on.

use crate::head::{Head, Version};
use crate::hpack::Fields;
use crate::router::Headers;

/// Why a head is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("field name {0:?} has a character HTTP/2 forbids (capitals, controls, spaces)")]
    Name(&'static str),
    #[error("a field value has NUL, CR or LF, or starts or ends with whitespace")]
    Value,
    #[error("pseudo-field after a regular field")]
    LatePseudo,
    #[error("pseudo-field {0} is unknown here or repeated")]
    Pseudo(&'static str),
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("connection-specific field {0} (section 8.2.2)")]
    ConnectionSpecific(&'static str),
    #[error("te other than \"trailers\"")]
    Te,
    #[error("content-length is not one number")]
    ContentLength,
}

/// A checked request head borrowing its fields.
#[derive(Debug, Clone, Copy)]
pub struct Request<'f> {
    fields: &'f Fields,
    method: &'f str,
    path: &'f [u8],
    authority: Option<&'f [u8]>,
    scheme: Option<&'f [u8]>,
    /// Index of the first regular field.
    regular: usize,
    /// The body's announced length, which its DATA must add up to (section 8.1.1).
    pub content_length: Option<u64>,
}

impl<'f> Request<'f> {
    pub fn scheme(&self) -> Option<&'f [u8]> {
        self.scheme
    }

    pub fn is_connect(&self) -> bool {
        self.method == "CONNECT"
    }

    /// The regular fields, pseudo-fields left out.
    pub fn fields(&self) -> impl Iterator<Item = (&'f [u8], &'f [u8])> + 'f {
        self.fields.iter().skip(self.regular)
    }
}

/// Checks a request head.
pub fn request(fields: &Fields) -> Result<Request<'_>, Malformed> {
    let mut method = None;
    let mut path = None;
    let mut authority = None;
    let mut scheme = None;
    let mut regular = fields.len();
    let mut content_length = None;
    for (i, (name, value)) in fields.iter().enumerate() {
        check_value(value)?;
        if let Some(pseudo) = name.strip_prefix(b":") {
            if regular < i {
                return Err(Malformed::LatePseudo);
            }
            let (slot, label) = match pseudo {
                b"method" => (&mut method, ":method"),
                b"path" => (&mut path, ":path"),
                b"authority" => (&mut authority, ":authority"),
                b"scheme" => (&mut scheme, ":scheme"),
                // :status, :protocol (we do not offer extended CONNECT), anything else.
                _ => return Err(Malformed::Pseudo("other")),
            };
            if slot.replace(value).is_some() {
                return Err(Malformed::Pseudo(label));
            }
            continue;
        }
        regular = regular.min(i);
        check_name(name)?;
        match name {
            b"connection" => return Err(Malformed::ConnectionSpecific("connection")),
            b"proxy-connection" => return Err(Malformed::ConnectionSpecific("proxy-connection")),
            b"keep-alive" => return Err(Malformed::ConnectionSpecific("keep-alive")),
            b"transfer-encoding" => {
                return Err(Malformed::ConnectionSpecific("transfer-encoding"));
            }
            b"upgrade" => return Err(Malformed::ConnectionSpecific("upgrade")),
            b"te" if value != b"trailers" => return Err(Malformed::Te),
            b"content-length" => {
                let n = length(value).ok_or(Malformed::ContentLength)?;
                if content_length.replace(n).is_some_and(|m| m != n) {
                    return Err(Malformed::ContentLength);
                }
            }
            _ => {}
        }
    }
    let method = method.ok_or(Malformed::Missing(":method"))?;
    let method = std::str::from_utf8(method)
        .ok()
        .filter(|m| !m.is_empty() && m.bytes().all(is_token))
        .ok_or(Malformed::Pseudo(":method"))?;
    let path = if method == "CONNECT" {
        // Section 8.5: only :authority names the tunnel's end.
        if path.is_some() || scheme.is_some() {
            return Err(Malformed::Pseudo(":path"));
        }
        authority.ok_or(Malformed::Missing(":authority"))?;
        &b""[..]
    } else {
        scheme.ok_or(Malformed::Missing(":scheme"))?;
        let path = path
            .filter(|p| !p.is_empty())
            .ok_or(Malformed::Missing(":path"))?;
        if path == b"*" && method != "OPTIONS" {
            return Err(Malformed::Pseudo(":path"));
        }
        path
    };
    Ok(Request {
        fields,
        method,
        path,
        authority,
        scheme,
        regular,
        content_length,
    })
}

/// Checks a trailer section: regular fields only.
pub fn trailers(fields: &Fields) -> Result<(), Malformed> {
    for (name, value) in fields.iter() {
        if name.starts_with(b":") {
            return Err(Malformed::Pseudo("in trailers"));
        }
        check_name(name)?;
        check_value(value)?;
    }
    Ok(())
}

/// Section 8.2.1: no capitals, controls, space or octets past ASCII; an empty name is no name.
fn check_name(name: &[u8]) -> Result<(), Malformed> {
    if name.is_empty() {
        return Err(Malformed::Name("empty"));
    }
    for &b in name {
        if b.is_ascii_uppercase() {
            return Err(Malformed::Name("capital"));
        }
        if b <= 0x20 || b >= 0x7f || b == b':' {
            return Err(Malformed::Name("control, space, colon or non-ASCII"));
        }
    }
    Ok(())
}

/// Section 8.2.1: no NUL, CR or LF, and no whitespace at either end.
fn check_value(value: &[u8]) -> Result<(), Malformed> {
    let edge = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    if edge(value.first())
        || edge(value.last())
        || value.iter().any(|&b| matches!(b, 0 | b'\r' | b'\n'))
    {
        return Err(Malformed::Value);
    }
    Ok(())
}

fn length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// RFC 9110's tchar.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

impl Headers for Request<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.fields()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .and_then(|(_, v)| crate::head::visible(v))
    }
}

impl Head for Request<'_> {
    fn method(&self) -> &str {
        self.method
    }

    fn target(&self) -> &[u8] {
        self.path
    }

    fn version(&self) -> Version {
        Version::Http2
    }

    fn authority(&self) -> Option<&[u8]> {
        self.authority
    }

    fn each_header<'s>(&'s self, f: &mut dyn FnMut(&'s [u8], &'s [u8])) {
        for (name, value) in self.fields() {
            f(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(list: &[(&str, &str)]) -> Fields {
        let mut f = Fields::new();
        for (n, v) in list {
            f.push(n.as_bytes(), v.as_bytes());
        }
        f
    }

    const GET: [(&str, &str); 4] = [
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/a?b"),
        (":authority", "a.example"),
    ];

    fn with(extra: &[(&str, &str)]) -> Fields {
        let mut list = GET.to_vec();
        list.extend_from_slice(extra);
        fields(&list)
    }

    #[test]
    fn a_good_head_reads_as_any_engines() {
        let f = with(&[
            ("accept", "*/*"),
            ("content-length", "12"),
            ("te", "trailers"),
        ]);
        let r = request(&f).expect("well formed");
        assert_eq!(r.method(), "GET");
        assert_eq!(r.target(), b"/a?b");
        assert_eq!(r.authority(), Some(&b"a.example"[..]));
        assert_eq!(r.scheme(), Some(&b"https"[..]));
        assert_eq!(r.version(), Version::Http2);
        assert_eq!(r.content_length, Some(12));
        assert_eq!(Headers::get(&r, "accept"), Some("*/*"));
        assert_eq!(Headers::get(&r, ":method"), None);
        let mut seen = Vec::new();
        r.each_header(&mut |n, _| seen.push(String::from_utf8_lossy(n).into_owned()));
        assert_eq!(seen, ["accept", "content-length", "te"]);
    }

    #[test]
    fn malformed_heads_say_why() {
        let cases: [(Fields, Malformed); 14] = [
            (with(&[("Accept", "x")]), Malformed::Name("capital")),
            (
                with(&[("a b", "x")]),
                Malformed::Name("control, space, colon or non-ASCII"),
            ),
            (with(&[("x", "a\r\nb")]), Malformed::Value),
            (with(&[("x", " padded")]), Malformed::Value),
            (
                with(&[("x", "y"), (":path", "/late")]),
                Malformed::LatePseudo,
            ),
            (with(&[(":path", "/again")]), Malformed::Pseudo(":path")),
            (with(&[(":status", "200")]), Malformed::Pseudo("other")),
            (
                with(&[("connection", "close")]),
                Malformed::ConnectionSpecific("connection"),
            ),
            (
                with(&[("transfer-encoding", "chunked")]),
                Malformed::ConnectionSpecific("transfer-encoding"),
            ),
            (with(&[("te", "gzip")]), Malformed::Te),
            (
                with(&[("content-length", "1"), ("content-length", "2")]),
                Malformed::ContentLength,
            ),
            (with(&[("content-length", "+1")]), Malformed::ContentLength),
            (fields(&GET[1..]), Malformed::Missing(":method")),
            (
                fields(&[(":method", "GET"), (":scheme", "https"), (":path", "")]),
                Malformed::Missing(":path"),
            ),
        ];
        for (f, why) in cases {
            assert_eq!(request(&f).map(|_| ()), Err(why), "{f:?}");
        }
    }

    #[test]
    fn connect_names_only_an_authority() {
        let ok = fields(&[(":method", "CONNECT"), (":authority", "db.internal:5432")]);
        let r = request(&ok).expect("CONNECT");
        assert!(r.is_connect());
        assert_eq!(r.target(), b"");
        let with_path = fields(&[
            (":method", "CONNECT"),
            (":authority", "a:1"),
            (":path", "/"),
        ]);
        assert_eq!(
            request(&with_path).map(|_| ()),
            Err(Malformed::Pseudo(":path"))
        );
        let star = fields(&[(":method", "GET"), (":scheme", "https"), (":path", "*")]);
        assert_eq!(request(&star).map(|_| ()), Err(Malformed::Pseudo(":path")));
        let options = fields(&[(":method", "OPTIONS"), (":scheme", "https"), (":path", "*")]);
        assert!(request(&options).is_ok());
    }

    #[test]
    fn trailers_carry_no_pseudo_fields() {
        assert_eq!(trailers(&fields(&[("x-sum", "1")])), Ok(()));
        assert_eq!(
            trailers(&fields(&[(":path", "/")])),
            Err(Malformed::Pseudo("in trailers"))
        );
    }
}
