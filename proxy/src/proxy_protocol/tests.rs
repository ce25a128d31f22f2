use super::*;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A v2 header: command byte, family byte, address bytes, then TLVs.
fn v2(command: u8, family: u8, body: &[u8]) -> Vec<u8> {
    let mut h = V2_SIGNATURE.to_vec();
    h.push(command);
    h.push(family);
    h.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
    h.extend_from_slice(body);
    h
}

fn v4_body(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    let mut b = src.to_vec();
    b.extend_from_slice(&dst);
    b.extend_from_slice(&sport.to_be_bytes());
    b.extend_from_slice(&dport.to_be_bytes());
    b
}

#[test]
fn v1_lines_name_the_client() {
    let line = b"PROXY TCP4 203.0.113.7 10.0.0.1 4711 80\r\nGET / HTTP/1.1\r\n";
    let (h, len) = parse(line).unwrap().unwrap();
    assert_eq!(
        h,
        Header::Proxied {
            source: addr("203.0.113.7:4711")
        }
    );
    assert_eq!(&line[len..len + 3], b"GET");
    let line = b"PROXY TCP6 2001:db8::7 2001:db8::1 65535 443\r\n";
    assert_eq!(
        parse(line).unwrap().unwrap().0,
        Header::Proxied {
            source: addr("[2001:db8::7]:65535")
        }
    );
    assert_eq!(
        parse(b"PROXY UNKNOWN\r\n").unwrap().unwrap(),
        (Header::Local, 15)
    );
    assert_eq!(
        parse(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n")
            .unwrap()
            .unwrap()
            .0,
        Header::Local
    );
}

#[test]
fn malformed_v1_lines_are_refused() {
    for bad in [
        &b"PROXY TCP4 203.0.113.7 10.0.0.1 4711\r\n"[..],
        b"PROXY TCP4 203.0.113.7 10.0.0.1 4711 80 9\r\n",
        b"PROXY TCP4 2001:db8::7 10.0.0.1 4711 80\r\n",
        b"PROXY TCP6 203.0.113.7 10.0.0.1 4711 80\r\n",
        b"PROXY TCP4 203.0.113.7 10.0.0.1 65536 80\r\n",
        b"PROXY TCP4 203.0.113.7 10.0.0.1 0471 80\r\n",
        b"PROXY TCP4 203.0.113.7 10.0.0.1 +471 80\r\n",
        b"PROXY TCP4  203.0.113.7 10.0.0.1 4711 80\r\n",
        b"PROXY UDP4 203.0.113.7 10.0.0.1 4711 80\r\n",
        b"PROXY TCP4 203.0.113.7 10.0.0.1 4711 80\n",
    ] {
        assert!(
            matches!(parse(bad), Err(Invalid::V1(_))),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    let long = [b"PROXY TCP4 ".as_slice(), &[b'1'; 120]].concat();
    assert!(matches!(parse(&long), Err(Invalid::V1(_))));
    // Not whole yet.
    assert_eq!(parse(b"PROXY TCP4 203.0.113.7 10.0.0.1 4711 80"), Ok(None));
    assert_eq!(parse(b"PROX"), Ok(None));
}

#[test]
fn anything_else_is_not_a_header() {
    for bad in [
        &b"GET / HTTP/1.1\r\n"[..],
        b"\x16\x03\x01\x02\x00",
        b"proxy TCP4",
    ] {
        assert_eq!(parse(bad), Err(Invalid::Missing));
    }
}

#[test]
fn v2_headers_name_the_client() {
    let h = v2(
        0x21,
        0x11,
        &v4_body([198, 51, 100, 9], [10, 0, 0, 1], 5000, 443),
    );
    assert_eq!(
        parse(&h).unwrap().unwrap(),
        (
            Header::Proxied {
                source: addr("198.51.100.9:5000")
            },
            28
        )
    );
    let mut body = vec![0u8; 36];
    body[0] = 0x20;
    body[1] = 0x01;
    body[15] = 0x07;
    body[32..34].copy_from_slice(&8080u16.to_be_bytes());
    // A TLV after the addresses (PP2_TYPE_AUTHORITY) is skipped.
    body.extend_from_slice(&[0x02, 0x00, 0x03, b'a', b'.', b'b']);
    let h = v2(0x21, 0x21, &body);
    assert_eq!(
        parse(&h).unwrap().unwrap(),
        (
            Header::Proxied {
                source: addr("[2001::7]:8080")
            },
            h.len()
        )
    );
    // LOCAL (health checks), UNSPEC and UNIX: the peer stands.
    assert_eq!(
        parse(&v2(0x20, 0x00, &[])).unwrap().unwrap().0,
        Header::Local
    );
    assert_eq!(
        parse(&v2(0x21, 0x00, &[])).unwrap().unwrap().0,
        Header::Local
    );
    assert_eq!(
        parse(&v2(0x21, 0x31, &[0; 216])).unwrap().unwrap().0,
        Header::Local
    );
    // Every prefix is "read more".
    let h = v2(0x21, 0x11, &v4_body([1, 2, 3, 4], [5, 6, 7, 8], 1, 2));
    for n in 1..h.len() {
        assert_eq!(parse(&h[..n]), Ok(None), "prefix {n}");
    }
}

#[test]
fn malformed_v2_headers_are_refused() {
    let cases = [
        v2(0x11, 0x11, &v4_body([1, 2, 3, 4], [5, 6, 7, 8], 1, 2)),
        v2(0x22, 0x11, &v4_body([1, 2, 3, 4], [5, 6, 7, 8], 1, 2)),
        v2(0x21, 0x11, &[1, 2, 3]),
        v2(0x21, 0x21, &[0; 20]),
        v2(0x21, 0x41, &[0; 12]),
        v2(0x21, 0x11, &[0; 5000]),
    ];
    for h in cases {
        assert!(matches!(parse(&h), Err(Invalid::V2(_))), "{:?}", &h[12..16]);
    }
}

#[tokio::test]
async fn reading_stops_at_the_end_of_the_header() {
    for header in [
        b"PROXY TCP4 203.0.113.7 10.0.0.1 4711 80\r\n".to_vec(),
        b"PROXY UNKNOWN\r\n".to_vec(),
        v2(0x21, 0x11, &v4_body([1, 2, 3, 4], [5, 6, 7, 8], 1, 2)),
        v2(0x20, 0x00, &[]),
    ] {
        let mut input = header.clone();
        input.extend_from_slice(b"\x16\x03\x01rest");
        let mut reader = &input[..];
        read(&mut reader).await.unwrap();
        assert_eq!(reader, b"\x16\x03\x01rest");
    }
    let mut garbage = &b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..];
    assert!(matches!(
        read(&mut garbage).await,
        Err(ReadError::Invalid(Invalid::Missing))
    ));
    let mut short = &b"PROXY TCP4 1.2.3.4"[..];
    assert!(matches!(read(&mut short).await, Err(ReadError::Io(_))));
}
