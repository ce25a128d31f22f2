//! The examples of RFC 7541 appendix C, decoded in sequence on one decoder as the RFC runs
//! them, then round trips through the encoder.

use super::*;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| {
            let text = std::str::from_utf8(pair).unwrap_or("00");
            u8::from_str_radix(text, 16).unwrap_or(0)
        })
        .collect()
}

fn decoded(decoder: &mut Decoder, block: &str) -> Vec<(String, String)> {
    let mut fields = Fields::new();
    decoder
        .decode(&hex(block), 1 << 16, &mut fields)
        .unwrap_or_else(|e| panic!("{block}: {e}"));
    fields
        .iter()
        .map(|(n, v)| {
            (
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            )
        })
        .collect()
}

fn list(fields: &[(&str, &str)]) -> Vec<(String, String)> {
    fields
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[test]
fn c2_one_field_of_each_representation() {
    let mut d = Decoder::new(4096);
    assert_eq!(
        decoded(
            &mut d,
            "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572"
        ),
        list(&[("custom-key", "custom-header")])
    );
    assert_eq!(d.table_size(), 55);
    let mut d = Decoder::new(4096);
    assert_eq!(
        decoded(&mut d, "040c 2f73 616d 706c 652f 7061 7468"),
        list(&[(":path", "/sample/path")])
    );
    assert_eq!(d.table_size(), 0);
    assert_eq!(
        decoded(&mut d, "1008 7061 7373 776f 7264 0673 6563 7265 74"),
        list(&[("password", "secret")])
    );
    assert_eq!(d.table_size(), 0);
    assert_eq!(decoded(&mut d, "82"), list(&[(":method", "GET")]));
}

/// C.3 and C.4: the same three requests, without and with Huffman coding.
#[test]
fn c3_c4_requests_share_the_table() {
    let blocks = [
        [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ],
        [
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ],
    ];
    for [first, second, third] in blocks {
        let mut d = Decoder::new(4096);
        let base = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ];
        assert_eq!(decoded(&mut d, first), list(&base));
        assert_eq!(d.table_size(), 57);
        let mut with_cache = base.to_vec();
        with_cache.push(("cache-control", "no-cache"));
        assert_eq!(decoded(&mut d, second), list(&with_cache));
        assert_eq!(d.table_size(), 110);
        assert_eq!(
            decoded(&mut d, third),
            list(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
        assert_eq!(d.table_size(), 164);
    }
}

/// C.5 and C.6: three answers through a 256-octet table, which evicts as they go.
#[test]
fn c5_c6_responses_evict() {
    let blocks = [
        [
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 \
             2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 \
             6c65 2e63 6f6d",
            "4803 3330 37c1 c0bf",
            "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d \
             54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 \
             5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e \
             3d31",
        ],
        [
            "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 \
             2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
            "4883 640e ffc1 c0bf",
            "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab \
             77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f \
             9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        ],
    ];
    let date = "Mon, 21 Oct 2013 20:13:21 GMT";
    let location = ("location", "https://www.example.com");
    for [first, second, third] in blocks {
        let mut d = Decoder::new(256);
        assert_eq!(
            decoded(&mut d, first),
            list(&[
                (":status", "302"),
                ("cache-control", "private"),
                ("date", date),
                location
            ])
        );
        assert_eq!(d.table_size(), 222);
        assert_eq!(
            decoded(&mut d, second),
            list(&[
                (":status", "307"),
                ("cache-control", "private"),
                ("date", date),
                location
            ])
        );
        assert_eq!(d.table_size(), 222);
        assert_eq!(
            decoded(&mut d, third),
            list(&[
                (":status", "200"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
                location,
                ("content-encoding", "gzip"),
                (
                    "set-cookie",
                    "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"
                ),
            ])
        );
        assert_eq!(d.table_size(), 215);
    }
}

#[test]
fn hostile_blocks_get_the_right_error() {
    let mut fields = Fields::new();
    let mut d = Decoder::new(4096);
    let mut decode = |block: &str| d.decode(&hex(block), 1 << 16, &mut fields);
    // Index 0, an index past both tables, a literal cut short, a string longer than the block.
    assert_eq!(decode("80"), Err(DecodeError::BadIndex(0)));
    assert_eq!(decode("be"), Err(DecodeError::BadIndex(62)));
    assert_eq!(decode("400a 6375"), Err(DecodeError::Truncated));
    assert_eq!(decode("047f"), Err(DecodeError::Truncated));
    // A size update over what we announced, and one after a field.
    assert_eq!(
        decode("3fe2 1f"),
        Err(DecodeError::TableSizeOverLimit {
            size: 4097,
            limit: 4096
        })
    );
    assert_eq!(decode("82 20"), Err(DecodeError::LateTableSizeUpdate));
    // Two updates at the start are allowed (section 4.2).
    assert_eq!(decode("20 3f e1 1f 82"), Ok(()));
    // A Huffman string holding EOS.
    assert_eq!(decode("0084 ffff ffff"), Err(DecodeError::Huffman));
    assert!(DecodeError::Huffman.is_connection_error());
    assert!(!DecodeError::ListTooLarge { limit: 1 }.is_connection_error());
}

#[test]
fn an_oversized_list_is_dropped_but_still_fills_the_table() {
    // C.3.1 then C.3.2 with room for three fields: the first block is refused, yet the second
    // must still find :authority at index 62, where the first put it.
    let mut d = Decoder::new(4096);
    let mut fields = Fields::new();
    let first = hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d");
    let limit = 3 * 32 + 20;
    assert_eq!(
        d.decode(&first, limit, &mut fields),
        Err(DecodeError::ListTooLarge { limit })
    );
    assert!(fields.list_size() <= limit);
    assert_eq!(d.table_size(), 57);
    d.decode(&hex("be"), 1 << 16, &mut fields)
        .expect("index 62 exists");
    assert_eq!(
        fields.get(0),
        Some((&b":authority"[..], &b"www.example.com"[..]))
    );
}

#[test]
fn encoded_answers_decode_to_what_went_in() {
    let mut encoder = Encoder::new();
    let mut decoder = Decoder::new(4096);
    let mut fields = Fields::new();
    for status in [200, 302, 404, 503] {
        let mut block = Vec::new();
        encoder.begin(&mut block);
        encoder.status(status, &mut block);
        encoder.field(b"Content-Type", b"text/plain; charset=utf-8", &mut block);
        encoder.field(b"x-request-id", b"\x00\xff binary \x7f", &mut block);
        encoder.field(b"server", b"", &mut block);
        decoder
            .decode(&block, 1 << 16, &mut fields)
            .expect("decodes");
        let got: Vec<(&[u8], &[u8])> = fields.iter().collect();
        let code = status.to_string();
        assert_eq!(
            got,
            [
                (&b":status"[..], code.as_bytes()),
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"x-request-id", b"\x00\xff binary \x7f"),
                (b"server", b""),
            ]
        );
        // Nothing was indexed, so nothing can go out of step.
        assert_eq!(decoder.table_size(), 0);
    }
}
