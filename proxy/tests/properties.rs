//! Property tests of the parsers that read untrusted bytes: the request target's
//! normalisation, the chunk scanner, response heads, the TLS ClientHello's SNI and PROXY
//! protocol headers. Random
//! and hostile inputs must never panic, and each parser must keep its promises.
//! `make fuzz` runs these with many more cases (PROPTEST_CASES).
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use coxswain_proxy::http1::{Chunked, Framing, parse_response, reframe};
use coxswain_proxy::proxy_protocol;
use coxswain_proxy::relay::{Hello, client_hello_sni};
use coxswain_proxy::request::normalize;
use proptest::prelude::*;

#[path = "support/proptest_cases.rs"]
mod proptest_cases;
use proptest_cases::cases;

/// A path of plain segments ("/a/b-c/d.e").
fn plain_path() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-zA-Z0-9_~-][a-zA-Z0-9._~-]{0,6}", 1..5).prop_map(|segments| {
        let segments: Vec<String> = segments
            .into_iter()
            .map(|s| if s == "." || s == ".." { "x".into() } else { s })
            .collect();
        format!("/{}", segments.join("/"))
    })
}

/// The same path written the ways an attacker would: extra slashes, "." and "x/.."
/// segments, unreserved characters percent-encoded in either case, a fragment.
fn obfuscate(path: &str, choices: &[u8]) -> String {
    let mut out = String::new();
    let mut c = choices.iter().cycle();
    let mut next = || *c.next().unwrap_or(&0);
    for segment in path.split('/').skip(1) {
        match next() % 5 {
            0 => out.push_str("//"),
            1 => out.push_str("/./"),
            2 => out.push_str("/zz/../"),
            _ => out.push('/'),
        }
        for ch in segment.chars() {
            match next() % 4 {
                0 => out.push_str(&format!("%{:02x}", ch as u32)),
                1 => out.push_str(&format!("%{:02X}", ch as u32)),
                _ => out.push(ch),
            }
        }
    }
    if next() % 3 == 0 {
        out.push_str("#/../frag");
    }
    out
}

/// `chunks` framed as a chunked body: sizes in upper or lower case hex, each with
/// `extension` when given, then the last chunk with a trailer field when `trailer`.
fn chunked_body(
    chunks: &[Vec<u8>],
    upper: bool,
    extension: Option<&str>,
    trailer: bool,
) -> Vec<u8> {
    let mut body = Vec::new();
    for c in chunks {
        let size = if upper {
            format!("{:X}", c.len())
        } else {
            format!("{:x}", c.len())
        };
        body.extend_from_slice(size.as_bytes());
        body.extend_from_slice(extension.unwrap_or_default().as_bytes());
        body.extend_from_slice(b"\r\n");
        body.extend_from_slice(c);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n");
    if trailer {
        body.extend_from_slice(b"x-trailer: 1\r\n");
    }
    body.extend_from_slice(b"\r\n");
    body
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn normalisation_never_panics_and_its_output_is_canonical(target in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(n) = normalize(&target) {
            let path = n.split('?').next().unwrap();
            prop_assert!(path.starts_with('/'));
            prop_assert!(!path.contains("//"), "{n}");
            prop_assert!(!n.contains('#'), "{n}");
            for segment in path.split('/') {
                prop_assert!(segment != "." && segment != "..", "{n}");
            }
            let again = normalize(n.as_bytes()).unwrap().into_owned();
            prop_assert_eq!(again.as_str(), n.as_ref());
        }
    }

    #[test]
    fn every_spelling_of_a_path_routes_as_the_path(path in plain_path(), choices in prop::collection::vec(any::<u8>(), 1..32)) {
        let spelled = obfuscate(&path, &choices);
        let n = normalize(spelled.as_bytes()).unwrap();
        prop_assert_eq!(n.as_ref(), path.as_str(), "{}", spelled);
    }

    #[test]
    fn the_chunk_scanner_finds_the_end_at_any_split(
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..40), 0..6),
        ext in prop::bool::ANY,
        trailer in prop::bool::ANY,
        upper in prop::bool::ANY,
        split in any::<prop::sample::Index>(),
        tail in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let mut body = chunked_body(&chunks, upper, ext.then_some(";name=value"), trailer);
        let end = body.len();
        body.extend_from_slice(&tail);
        let at = split.index(body.len() + 1);
        let mut scanner = Chunked::default();
        // The data ranges it reports (what an HTTP/2 client gets) are the chunks, whole and
        // in order, at any split, and nothing of the framing or the bytes after the end.
        let mut data = Vec::new();
        let first = &body[..at];
        let found = match scanner.feed_data(first, &mut |r| data.extend_from_slice(&first[r])).unwrap() {
            Some(n) => n,
            None => {
                let rest = &body[at..];
                at + scanner.feed_data(rest, &mut |r| data.extend_from_slice(&rest[r])).unwrap().unwrap()
            }
        };
        prop_assert_eq!(found, end);
        prop_assert_eq!(data, chunks.concat());
    }

    #[test]
    fn a_chunked_body_framed_again_keeps_its_data_and_only_canonical_framing(
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..40), 0..6),
        ext in prop::bool::ANY,
        trailer in prop::bool::ANY,
        splits in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
        tail in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let mut body = chunked_body(&chunks, true, ext.then_some(" ;name=value"), trailer);
        let end = body.len();
        body.extend_from_slice(&tail);
        // Fed as reads of any sizes, as a client's bytes arrive.
        let mut cuts: Vec<usize> = splits.iter().map(|i| i.index(body.len() + 1)).collect();
        cuts.push(0);
        cuts.push(body.len());
        cuts.sort_unstable();
        let (mut decoder, mut out, mut found) = (Chunked::default(), Vec::new(), None);
        for w in cuts.windows(2) {
            let piece = &body[w[0]..w[1]];
            if let Some(n) = reframe(&mut decoder, piece, &mut out).unwrap() {
                found = Some(w[0] + n);
                break;
            }
        }
        prop_assert_eq!(found, Some(end));
        // What goes on is a chunked body the scanner reads to its very end, with the same
        // data, no extension and no trailer.
        let mut data = Vec::new();
        let again = Chunked::default()
            .feed_data(&out, &mut |r| data.extend_from_slice(&out[r]))
            .unwrap();
        prop_assert_eq!(again, Some(out.len()));
        prop_assert_eq!(data, chunks.concat());
        prop_assert!(out.ends_with(b"0\r\n\r\n"));
        let text = String::from_utf8_lossy(&out);
        prop_assert!(!text.contains("name=value") && !text.contains("x-trailer"));
    }

    #[test]
    fn the_chunk_scanner_never_panics_and_splits_do_not_change_its_answer(
        bytes in prop::collection::vec(any::<u8>(), 0..128),
        split in any::<prop::sample::Index>(),
    ) {
        // Data ranges stay inside what was fed, whatever the bytes.
        let mut inside = true;
        let whole = Chunked::default().feed_data(&bytes, &mut |r| inside &= r.start < r.end && r.end <= bytes.len());
        prop_assert!(inside);
        let at = split.index(bytes.len() + 1);
        let mut scanner = Chunked::default();
        let pieces = match scanner.feed(&bytes[..at]) {
            Ok(None) => scanner.feed(&bytes[at..]).map(|r| r.map(|n| n + at)),
            other => other,
        };
        prop_assert_eq!(whole, pieces);
    }

    #[test]
    fn response_heads_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256), head_only in prop::bool::ANY) {
        if let Ok(Some(head)) = parse_response(&bytes, head_only, 64) {
            prop_assert!(head.len <= bytes.len());
            prop_assert!((100..1000).contains(&head.status));
            if let Framing::Length(n) = head.framing {
                prop_assert!(!head_only || n == 0);
            }
        }
    }

    #[test]
    fn generated_response_heads_parse_as_written(
        status in 200u16..600,
        length in prop::option::of(0u64..100_000),
        chunked in prop::bool::ANY,
        close in prop::bool::ANY,
    ) {
        let mut head = format!("HTTP/1.1 {status} X\r\n");
        if let Some(n) = length {
            head.push_str(&format!("Content-Length: {n}\r\n"));
        }
        if chunked {
            head.push_str("Transfer-Encoding: chunked\r\n");
        }
        if close {
            head.push_str("Connection: close\r\n");
        }
        head.push_str("\r\n");
        let parsed = parse_response(head.as_bytes(), false, 64).unwrap().unwrap();
        prop_assert_eq!(parsed.status, status);
        prop_assert_eq!(parsed.len, head.len());
        prop_assert_eq!(parsed.drop_length, chunked && length.is_some());
        let bodyless = status == 204 || status == 304;
        match parsed.framing {
            Framing::Chunked(_) => prop_assert!(chunked && !bodyless),
            Framing::Length(n) => prop_assert!(bodyless || (!chunked && Some(n) == length)),
            Framing::UntilClose => prop_assert!(!chunked && length.is_none() && !bodyless),
        }
        let conflicting = chunked && length.is_some();
        let delimited = bodyless || chunked || length.is_some();
        prop_assert_eq!(parsed.reusable, !(close || conflicting) && delimited);
    }

    #[test]
    fn client_hellos_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = client_hello_sni(&bytes);
    }

    #[test]
    fn a_real_client_hello_names_its_server_at_any_length(name in "[a-z]{1,12}(\\.[a-z]{1,8}){1,3}", cut in any::<prop::sample::Index>()) {
        let hello = client_hello_for(&name);
        prop_assert!(matches!(client_hello_sni(&hello), Hello::Complete(Some(ref n)) if *n == name));
        // Every strict prefix is incomplete, never a wrong answer.
        let at = cut.index(hello.len());
        prop_assert!(matches!(client_hello_sni(&hello[..at]), Hello::NeedMore));
    }

    #[test]
    fn proxy_protocol_headers_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        v2 in prop::bool::ANY,
        v1 in prop::bool::ANY,
    ) {
        // Random bytes, and random bytes behind either version's signature.
        let mut input = Vec::new();
        if v2 {
            input.extend_from_slice(&proxy_protocol::V2_SIGNATURE);
        } else if v1 {
            input.extend_from_slice(b"PROXY ");
        }
        input.extend_from_slice(&bytes);
        if let Ok(Some((_, len))) = proxy_protocol::parse(&input) {
            prop_assert!(len <= input.len());
        }
    }

    #[test]
    fn a_proxy_protocol_header_names_its_client_at_any_split(
        ip in any::<[u8; 16]>(),
        v6 in prop::bool::ANY,
        port in any::<u16>(),
        binary in prop::bool::ANY,
        tlv in prop::collection::vec(any::<u8>(), 0..40),
        cut in any::<prop::sample::Index>(),
    ) {
        let source: std::net::SocketAddr = if v6 {
            (std::net::Ipv6Addr::from(ip), port).into()
        } else {
            (std::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]), port).into()
        };
        let header = proxy_protocol_header(source, binary, &tlv);
        let (parsed, len) = proxy_protocol::parse(&header).unwrap().unwrap();
        prop_assert_eq!(parsed, proxy_protocol::Header::Proxied { source });
        prop_assert_eq!(len, header.len());
        // Whatever follows is not part of it; every strict prefix asks for more.
        let mut more = header.clone();
        more.extend_from_slice(b"GET / HTTP/1.1\r\n");
        prop_assert_eq!(proxy_protocol::parse(&more).unwrap().unwrap().1, header.len());
        let at = cut.index(header.len());
        prop_assert_eq!(proxy_protocol::parse(&header[..at]), Ok(None));
    }
}

/// A PROXY protocol header for `source`: v1 text, or v2 binary with `tlv` after the addresses.
fn proxy_protocol_header(source: std::net::SocketAddr, binary: bool, tlv: &[u8]) -> Vec<u8> {
    use std::net::IpAddr;
    if !binary {
        let (family, dst) = if source.is_ipv4() {
            ("TCP4", "10.0.0.1")
        } else {
            ("TCP6", "::1")
        };
        return format!(
            "PROXY {family} {} {dst} {} 80\r\n",
            source.ip(),
            source.port()
        )
        .into_bytes();
    }
    let mut body = Vec::new();
    let family = match source.ip() {
        IpAddr::V4(a) => {
            body.extend_from_slice(&a.octets());
            body.extend_from_slice(&[10, 0, 0, 1]);
            0x11
        }
        IpAddr::V6(a) => {
            body.extend_from_slice(&a.octets());
            body.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
            0x21
        }
    };
    body.extend_from_slice(&source.port().to_be_bytes());
    body.extend_from_slice(&80u16.to_be_bytes());
    body.extend_from_slice(tlv);
    let mut h = proxy_protocol::V2_SIGNATURE.to_vec();
    h.push(0x21);
    h.push(family);
    h.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
    h.extend_from_slice(&body);
    h
}

/// The first flight of a rustls client for `name`: its ClientHello record.
fn client_hello_for(name: &str) -> Vec<u8> {
    use std::sync::Arc;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let server = rustls_pki_types::ServerName::try_from(name.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
    let mut out = Vec::new();
    conn.write_tls(&mut out).unwrap();
    out
}
