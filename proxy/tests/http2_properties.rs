//! Property tests of what a client's HTTP/2 bytes meet first: the frame reader and HPACK.
//! Hostile frames and header blocks must never panic or grow memory past their bounds, and
//! the dynamic table must evict exactly as a model of RFC 7541 section 4 does, across blocks.
//! `make fuzz` runs these with many more cases (PROPTEST_CASES).
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use coxswain_proxy::hpack::{DecodeError, Decoder, Encoder, Fields, STATIC, huffman};
use coxswain_proxy::http2::conn::{Config, Connection};
use coxswain_proxy::http2::frame::{self, DEFAULT_MAX_FRAME_SIZE, Frame, HEADER_LEN};
use coxswain_proxy::http2::{ErrorCode, PREFACE};
use proptest::prelude::*;

#[path = "support/proptest_cases.rs"]
mod proptest_cases;
use proptest_cases::cases;

/// The table size the decoder announces in these tests: small, so blocks evict often.
const TABLE: usize = 256;

/// One representation in a block, as a client's encoder may choose it.
#[derive(Debug, Clone)]
enum Op {
    /// Literal with incremental indexing; the name by static index when `static_name` is set.
    Insert {
        static_name: Option<usize>,
        name: Vec<u8>,
        value: Vec<u8>,
        huffman: bool,
    },
    /// Literal without indexing (or never indexed).
    Literal {
        name: Vec<u8>,
        value: Vec<u8>,
        never: bool,
    },
    /// An indexed field: the table entry this picks (modulo what the tables hold).
    Indexed(usize),
    /// A dynamic table size update, kept only at the start of a block.
    Resize(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let name = "[a-z][a-z0-9-]{0,15}".prop_map(String::into_bytes);
    let value = prop::collection::vec(any::<u8>(), 0..48);
    prop_oneof![
        4 => (prop::option::of(1..=61usize), name.clone(), value.clone(), any::<bool>())
            .prop_map(|(static_name, name, value, huffman)| Op::Insert { static_name, name, value, huffman }),
        2 => (name, value, any::<bool>()).prop_map(|(name, value, never)| Op::Literal { name, value, never }),
        3 => any::<usize>().prop_map(Op::Indexed),
        1 => (0..=TABLE).prop_map(Op::Resize),
    ]
}

// Integers and strings are written here apart from the crate's encoder, so that a mistake the
// two shared could not pass unseen.
fn integer(value: usize, prefix: u32, flags: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

fn string(s: &[u8], huffman_coded: bool, out: &mut Vec<u8>) {
    if huffman_coded {
        let mut coded = Vec::new();
        huffman::encode(s, &mut coded);
        integer(coded.len(), 7, 0x80, out);
        out.extend_from_slice(&coded);
    } else {
        integer(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

/// RFC 7541's dynamic table, written as plainly as the text: newest first, sizes of 32 + octets.
struct Model {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    max: usize,
}

impl Model {
    fn size(&self) -> usize {
        self.entries
            .iter()
            .map(|(n, v)| n.len() + v.len() + 32)
            .sum()
    }

    fn evict(&mut self) {
        while self.size() > self.max {
            self.entries.pop();
        }
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        if name.len() + value.len() + 32 > self.max {
            self.entries.clear();
            return;
        }
        self.entries.insert(0, (name, value));
        self.evict();
    }

    fn get(&self, index: usize) -> (Vec<u8>, Vec<u8>) {
        if index <= STATIC.len() {
            let (n, v) = STATIC[index - 1];
            (n.to_vec(), v.to_vec())
        } else {
            self.entries[index - STATIC.len() - 1].clone()
        }
    }
}

/// Encodes `ops` as one block, applying them to `model`, and returns the fields a decoder must
/// produce.
fn encode_block(ops: &[Op], model: &mut Model, block: &mut Vec<u8>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut expected = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Resize(size) if i == 0 => {
                integer(*size, 5, 0x20, block);
                model.max = *size;
                model.evict();
            }
            Op::Resize(_) => {}
            Op::Indexed(pick) => {
                let index = 1 + pick % (STATIC.len() + model.entries.len());
                integer(index, 7, 0x80, block);
                expected.push(model.get(index));
            }
            Op::Insert {
                static_name,
                name,
                value,
                huffman,
            } => {
                let name = match static_name {
                    Some(index) => {
                        integer(*index, 6, 0x40, block);
                        STATIC[index - 1].0.to_vec()
                    }
                    None => {
                        block.push(0x40);
                        string(name, *huffman, block);
                        name.clone()
                    }
                };
                string(value, *huffman, block);
                expected.push((name.clone(), value.clone()));
                model.insert(name, value.clone());
            }
            Op::Literal { name, value, never } => {
                block.push(if *never { 0x10 } else { 0x00 });
                string(name, false, block);
                string(value, true, block);
                expected.push((name.clone(), value.clone()));
            }
        }
    }
    expected
}

fn owned(fields: &Fields) -> Vec<(Vec<u8>, Vec<u8>)> {
    fields
        .iter()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect()
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn the_dynamic_table_evicts_as_the_rfc_model_does(
        blocks in prop::collection::vec(prop::collection::vec(op(), 0..12), 1..6),
    ) {
        let mut decoder = Decoder::new(TABLE);
        let mut model = Model { entries: Vec::new(), max: TABLE };
        let mut fields = Fields::new();
        for ops in &blocks {
            let mut block = Vec::new();
            let expected = encode_block(ops, &mut model, &mut block);
            decoder.decode(&block, 1 << 20, &mut fields).unwrap();
            prop_assert_eq!(owned(&fields), expected);
            prop_assert_eq!(decoder.table_size(), model.size());
        }
    }

    #[test]
    fn hostile_blocks_never_panic_or_outgrow_the_list_bound(
        ops in prop::collection::vec(op(), 0..12),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        limit in 0..600usize,
    ) {
        // A valid block with a few octets changed: most of it parses, so the damage lands
        // deep inside fields and tables rather than at the first octet.
        let mut model = Model { entries: Vec::new(), max: TABLE };
        let mut block = Vec::new();
        encode_block(&ops, &mut model, &mut block);
        for (at, octet) in flips {
            if !block.is_empty() {
                let i = at.index(block.len());
                block[i] = octet;
            }
        }
        let mut decoder = Decoder::new(TABLE);
        let mut fields = Fields::new();
        match decoder.decode(&block, limit, &mut fields) {
            Ok(()) | Err(DecodeError::ListTooLarge { .. }) => {
                prop_assert!(fields.list_size() <= limit);
            }
            Err(_) => {}
        }
        prop_assert!(decoder.table_size() <= TABLE);
    }

    #[test]
    fn random_octets_never_panic(block in prop::collection::vec(any::<u8>(), 0..128)) {
        let mut decoder = Decoder::new(TABLE);
        let mut fields = Fields::new();
        let _ = decoder.decode(&block, 4096, &mut fields);
        prop_assert!(decoder.table_size() <= TABLE);
        prop_assert!(fields.list_size() <= 4096);
    }

    #[test]
    fn huffman_coding_is_one_to_one(data in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut coded = Vec::new();
        huffman::encode(&data, &mut coded);
        prop_assert_eq!(coded.len(), huffman::encoded_len(&data));
        let mut back = Vec::new();
        huffman::decode(&coded, &mut back).unwrap();
        prop_assert_eq!(&back, &data);
        // Read the other way: whatever decodes has exactly one encoding, itself.
        let mut decoded = Vec::new();
        if huffman::decode(&data, &mut decoded).is_ok() {
            let mut again = Vec::new();
            huffman::encode(&decoded, &mut again);
            prop_assert_eq!(again, data);
        }
    }

    #[test]
    fn answers_round_trip_with_names_lowercased(
        status in 100..1000u16,
        fields in prop::collection::vec(("[A-Za-z][A-Za-z0-9-]{0,20}", prop::collection::vec(any::<u8>(), 0..40)), 0..10),
    ) {
        let mut encoder = Encoder::new();
        let mut block = Vec::new();
        encoder.begin(&mut block);
        encoder.status(status, &mut block);
        for (name, value) in &fields {
            encoder.field(name.as_bytes(), value, &mut block);
        }
        let mut decoder = Decoder::new(4096);
        let mut out = Fields::new();
        decoder.decode(&block, 1 << 20, &mut out).unwrap();
        let mut expected = vec![(b":status".to_vec(), status.to_string().into_bytes())];
        expected.extend(fields.iter().map(|(n, v)| (n.to_ascii_lowercase().into_bytes(), v.clone())));
        prop_assert_eq!(owned(&out), expected);
        prop_assert_eq!(decoder.table_size(), 0);
    }

    #[test]
    fn the_frame_reader_never_panics_and_never_over_reads(
        input in prop::collection::vec(any::<u8>(), 0..64),
        kind in 0..12u8,
        max in prop::sample::select(vec![DEFAULT_MAX_FRAME_SIZE, 32]),
    ) {
        // Random octets, and the same octets behind a header of a known type and their length.
        let mut framed = vec![0, 0, input.len() as u8, kind, input.first().copied().unwrap_or(0)];
        framed.extend_from_slice(&input[..input.len().min(4)]);
        framed.resize(HEADER_LEN, 0);
        framed.extend_from_slice(&input);
        for bytes in [&input, &framed] {
            if let Ok(Some((_, used))) = frame::parse(bytes, max) {
                prop_assert!(used >= HEADER_LEN && used <= bytes.len());
                prop_assert!(used - HEADER_LEN <= max as usize);
            }
        }
    }

    #[test]
    fn header_blocks_split_into_frames_join_back_at_any_frame_size(
        len in 0..40_000usize,
        seed in any::<u8>(),
        max in DEFAULT_MAX_FRAME_SIZE..40_000,
        end_stream in any::<bool>(),
    ) {
        // What the octets are does not matter here, only how many: made, not drawn, octet by
        // octet, which would cost far more than the test.
        let block: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed | 1)).collect();
        let mut out = Vec::new();
        frame::write_headers(&mut out, 1, &block, end_stream, max);
        let mut joined = Vec::new();
        let mut at = 0;
        let mut ended = false;
        while at < out.len() {
            prop_assert!(!ended, "a frame after END_HEADERS");
            let (frame, used) = frame::parse(&out[at..], max).unwrap().unwrap();
            match frame {
                Frame::Headers { end_stream: e, end_headers, fragment, .. } => {
                    prop_assert_eq!(at, 0);
                    prop_assert_eq!(e, end_stream);
                    ended = end_headers;
                    joined.extend_from_slice(fragment);
                }
                Frame::Continuation { end_headers, fragment, .. } => {
                    prop_assert!(at > 0);
                    ended = end_headers;
                    joined.extend_from_slice(fragment);
                }
                other => prop_assert!(false, "{:?}", other),
            }
            at += used;
        }
        prop_assert!(ended);
        prop_assert_eq!(joined, block);
    }

    #[test]
    fn a_connection_fed_hostile_frames_keeps_its_bounds_and_writes_only_valid_frames(
        actions in prop::collection::vec(action(), 0..60),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let config = Config { max_concurrent_streams: 4, initial_window_size: 1000, connection_window: 3000, max_header_list_size: 2000 };
        let mut conn = Connection::new(config);
        let mut client_encoder = Encoder::new();
        let mut input = PREFACE.to_vec();
        frame::write_settings(&mut input, &[]);
        let mut server_side = Vec::new();
        for a in &actions {
            match a {
                Action::Client(kind, flags, pick, payload) => {
                    let stream = if *kind == 0x4 || *kind == 0x6 || *kind == 0x7 { 0 } else { 2 * u32::from(*pick) + 1 };
                    let payload = if *kind == 0x1 && flags & 0x20 == 0 && payload.is_empty() {
                        // A well-formed GET for this stream, so that streams really open.
                        let mut block = Vec::new();
                        for (n, v) in [(":method", "GET"), (":scheme", "https"), (":path", "/"), (":authority", "a")] {
                            client_encoder.field(n.as_bytes(), v.as_bytes(), &mut block);
                        }
                        block
                    } else {
                        payload.clone()
                    };
                    let len = (payload.len() as u32).to_be_bytes();
                    input.extend_from_slice(&[len[1], len[2], len[3], *kind, *flags]);
                    input.extend_from_slice(&stream.to_be_bytes());
                    input.extend_from_slice(&payload);
                }
                Action::Server(what, pick, size) => server_side.push((input.len(), *what, 2 * u32::from(*pick) + 1, *size)),
            }
        }
        // Fed in pieces at random cuts, with the server's actions where they fell.
        let mut cut_at: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
        cut_at.extend(server_side.iter().map(|s| s.0));
        cut_at.push(input.len());
        cut_at.sort_unstable();
        let mut buffer = Vec::new();
        let mut fed = 0;
        let mut failed = false;
        let mut written = Vec::new();
        for cut in cut_at {
            buffer.extend_from_slice(&input[fed..cut]);
            fed = cut;
            let mut at = 0;
            while !failed {
                match conn.poll(&buffer[at..]) {
                    Ok((used, event)) => {
                        at += used;
                        if event.is_none() && used == 0 {
                            break;
                        }
                    }
                    Err(e) => {
                        prop_assert_ne!(e.code, ErrorCode::NoError);
                        failed = true;
                    }
                }
            }
            buffer.drain(..at);
            for &(_, what, stream, size) in server_side.iter().filter(|s| s.0 == cut) {
                let none: [(&[u8], &[u8]); 0] = [];
                match what {
                    0 => { let _ = conn.send_headers(stream, Some(200), none, size == 0); }
                    1 => { let _ = conn.send_data(stream, &vec![b'd'; size], size % 2 == 0); }
                    2 => conn.release(stream, size),
                    3 => conn.go_away(),
                    _ => conn.free_buffers(),
                }
            }
            prop_assert!(conn.open_streams() <= 4);
            prop_assert!(conn.buffer_size() <= 64 << 10, "{} octets held", conn.buffer_size());
            written.append(conn.output());
        }
        // Everything written is whole, valid frames whose header blocks decode.
        let mut decoder = Decoder::new(4096);
        let mut fields = Fields::new();
        let mut at = 0;
        while at < written.len() {
            let (frame, used) = frame::parse(&written[at..], 1 << 24).unwrap().unwrap();
            if let Frame::Headers { fragment, end_headers, .. } = frame {
                prop_assert!(end_headers);
                decoder.decode(fragment, 1 << 20, &mut fields).unwrap();
            }
            at += used;
        }
    }
}

/// One step of a hostile exchange: a client frame (type, flags, stream pick, payload, where
/// an empty HEADERS payload becomes a well-formed GET), or a server call (what, stream pick,
/// size).
#[derive(Debug, Clone)]
enum Action {
    Client(u8, u8, u8, Vec<u8>),
    Server(u8, u8, usize),
}

fn action() -> impl Strategy<Value = Action> {
    let pick = 0..6u8;
    prop_oneof![
        // Mostly frames an honest client sends, so that streams open, carry data and answer;
        // then anything at all, which usually ends the connection.
        5 => (pick.clone(), any::<bool>()).prop_map(|(p, end)| Action::Client(0x1, 0x4 | u8::from(end), p, Vec::new())),
        3 => (pick.clone(), any::<bool>(), prop::collection::vec(any::<u8>(), 0..24))
            .prop_map(|(p, end, data)| Action::Client(0x0, u8::from(end), p, data)),
        2 => (pick.clone(), 1..70_000u32).prop_map(|(p, inc)| Action::Client(0x8, 0, p, inc.to_be_bytes().to_vec())),
        1 => Just(Action::Client(0x6, 0, 0, b"pingpong".to_vec())),
        1 => (1..7u16, 0..70_000u32).prop_map(|(id, value)| {
            let value = if id == 2 { value % 2 } else if id == 5 { 16_384 + value } else { value };
            let mut p = id.to_be_bytes().to_vec();
            p.extend_from_slice(&value.to_be_bytes());
            Action::Client(0x4, 0, 0, p)
        }),
        1 => (pick.clone(), 0..14u32).prop_map(|(p, code)| Action::Client(0x3, 0, p, code.to_be_bytes().to_vec())),
        1 => (0..11u8, any::<u8>(), pick.clone(), prop::collection::vec(any::<u8>(), 0..24))
            .prop_map(|(kind, flags, p, payload)| Action::Client(kind, flags, p, payload)),
        4 => (0..5u8, pick, 0..3000usize).prop_map(|(what, p, size)| Action::Server(what, p, size)),
    ]
}
