use super::*;

fn chunked(input: &[u8]) -> Result<Option<usize>, BadResponse> {
    Chunked::default().feed(input)
}

#[test]
fn chunked_framing_finds_the_end_across_any_split() {
    let body = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\nE \r\n in\r\n\r\nchunks.\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
    let end = body.len() - 4;
    assert_eq!(chunked(body), Ok(Some(end)));
    for split in 0..body.len() {
        let mut c = Chunked::default();
        let (a, b) = body.split_at(split);
        match c.feed(a).unwrap() {
            Some(n) => assert_eq!(n, end, "split at {split}"),
            None => assert_eq!(
                c.feed(b).unwrap().map(|n| n + split),
                Some(end),
                "split at {split}"
            ),
        }
    }
    assert_eq!(chunked(b"0\r\n\r\n"), Ok(Some(5)));
    assert_eq!(chunked(b"10\r\n0123456789abcdef\r\n"), Ok(None));
}

#[test]
fn malformed_chunks_are_refused() {
    for bad in [
        &b"0x5\r\nhello\r\n0\r\n\r\n"[..],
        b"+5\r\nhello\r\n0\r\n\r\n",
        b"\r\n",
        b"5\r\nhelloX\r\n",
        b"5\nhello\r\n",
        b"0\n\n",
        b"11111111111111111\r\n",
        b"5 x\r\n",
        b"0\r\nTrailer: a\nb\r\n\r\n",
    ] {
        assert_eq!(
            chunked(bad),
            Err(BadResponse::Chunk),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    let long = [b"1;".as_slice(), &[b'x'; MAX_LINE]].concat();
    assert_eq!(chunked(&long), Err(BadResponse::Chunk), "size line bounded");
    // Trailer lines each within bounds, but without end.
    let line = b"X-Trailer: 0123456789abcdef0123456789abcdef\r\n";
    let mut endless = b"0\r\n".to_vec();
    let mut c = Chunked::default();
    assert_eq!(c.feed(&endless), Ok(None));
    endless.clear();
    for _ in 0..(MAX_TRAILERS / line.len()) {
        endless.extend_from_slice(line);
    }
    assert_eq!(c.feed(&endless), Ok(None), "up to the bound: still a body");
    assert_eq!(c.feed(line), Err(BadResponse::Chunk), "trailers bounded");
}

fn head(r: &[u8], head_only: bool) -> ResponseHead {
    parse_response(r, head_only, 64).unwrap().unwrap()
}

#[test]
fn response_framing() {
    let h = head(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n", false);
    assert_eq!((h.status, h.len, h.reusable), (200, 38, true));
    assert!(matches!(h.framing, Framing::Length(3)));
    let h = head(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", true);
    assert!(matches!(h.framing, Framing::Length(0)), "HEAD has no body");
    let h = head(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        false,
    );
    assert!(matches!(h.framing, Framing::Chunked(_)));
    assert!(!h.reusable);
    let h = head(b"HTTP/1.1 200 OK\r\n\r\n", false);
    assert!(matches!(h.framing, Framing::UntilClose));
    assert!(!h.reusable && !h.framing.delimited());
    let h = head(
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
        false,
    );
    assert!(matches!(h.framing, Framing::Length(0)));
    let mut f = Framing::Length(5);
    assert_eq!(f.advance(b"abc"), Ok((3, false)));
    assert_eq!(f.advance(b"defgh"), Ok((2, true)));
}

#[test]
fn transfer_codings_end_in_chunked_or_at_close() {
    let h = head(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        false,
    );
    assert!(matches!(h.framing, Framing::Chunked(_)));
    assert!(h.reusable);
    let h = head(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
        false,
    );
    assert!(matches!(h.framing, Framing::Chunked(_)));
    let h = head(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        false,
    );
    assert!(matches!(h.framing, Framing::UntilClose));
    assert!(!h.reusable);
}

#[test]
fn http10_responses_are_served_and_never_reused() {
    let h = head(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", false);
    assert_eq!(h.version, Version::Http10);
    assert!(matches!(h.framing, Framing::Length(2)));
    assert!(!h.reusable);
    let h = head(b"HTTP/1.0 200 OK\r\n\r\nok", false);
    assert!(matches!(h.framing, Framing::UntilClose));
}

#[test]
fn ambiguous_lengths_are_refused() {
    let bad = |r: &[u8]| parse_response(r, false, 64).err();
    assert_eq!(
        bad(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"),
        Some(BadResponse::Length)
    );
    assert_eq!(
        bad(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
        Some(BadResponse::Length)
    );
    assert_eq!(
        bad(b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n"),
        Some(BadResponse::Length)
    );
    assert_eq!(
        bad(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n"),
        Some(BadResponse::Length)
    );
    // Transfer-Encoding wins; the Content-Length is dropped and the connection not reused.
    let h = head(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
        false,
    );
    assert!(matches!(h.framing, Framing::Chunked(_)));
    assert!(h.drop_length && !h.reusable);
    assert_eq!(
        bad(b"HTTP/2.0 200 OK\r\n\r\n"),
        Some(BadResponse::Malformed)
    );
    // The same value repeated is one length.
    let h = head(b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok", false);
    assert!(matches!(h.framing, Framing::Length(2)));
    assert!(
        parse_response(b"HTTP/1.1 200 OK\r\nContent-Le", false, 64)
            .unwrap()
            .is_none()
    );
}
