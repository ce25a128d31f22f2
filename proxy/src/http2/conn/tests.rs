//! The connection fed frames as clients, honest and hostile, send them; its answers read
//! back frame by frame.

use super::*;
use crate::hpack::{Decoder, Encoder};
use crate::http2::frame::{self, Frame, SettingsFrame};
use crate::http2::tests::raw;

/// A client: encodes its frames, and reads the server's output back as short descriptions.
struct Client {
    conn: Connection,
    encoder: Encoder,
    decoder: Decoder,
}

/// An event with what it borrowed copied out.
#[derive(Debug, PartialEq, Eq)]
enum Got {
    Headers(u32, Vec<(String, String)>, bool, bool),
    Data(u32, Vec<u8>, bool),
    Reset(u32, ErrorCode, bool),
    Refused(u32, u16),
    GoAway(u32),
}

fn code(c: u32) -> ErrorCode {
    [
        ErrorCode::NoError,
        ErrorCode::Protocol,
        ErrorCode::Internal,
        ErrorCode::FlowControl,
        ErrorCode::SettingsTimeout,
        ErrorCode::StreamClosed,
        ErrorCode::FrameSize,
        ErrorCode::RefusedStream,
        ErrorCode::Cancel,
        ErrorCode::Compression,
        ErrorCode::Connect,
        ErrorCode::EnhanceYourCalm,
    ]
    .get(c as usize)
    .copied()
    .unwrap_or(ErrorCode::Internal)
}

fn settings(params: &[(u16, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    frame::write_settings(&mut out, params);
    out
}

impl Client {
    /// A connection past the preface and both SETTINGS, its output drained.
    fn new(config: Config) -> Self {
        Self::with_settings(config, &[])
    }

    fn with_settings(config: Config, params: &[(u16, u32)]) -> Self {
        let mut client = Self {
            conn: Connection::new(config),
            encoder: Encoder::new(),
            decoder: Decoder::new(4096),
        };
        let mut hello = PREFACE.to_vec();
        hello.extend_from_slice(&settings(params));
        assert_eq!(client.feed(&hello), Ok(vec![]));
        let out = client.frames();
        assert!(out[0].starts_with("SETTINGS 0x2=0 0x3="), "{out:?}");
        // A window at or under the initial 65,535 needs no update (none can shrink it).
        let grown = config.connection_window.saturating_sub(65_535);
        let mut expected = vec![format!("WINDOW_UPDATE 0 +{grown}"), "SETTINGS ack".into()];
        if grown == 0 {
            expected.remove(0);
        }
        assert_eq!(out[1..], expected[..], "{out:?}");
        client
    }

    /// Polls until the connection wants more input; every event, copied.
    fn feed(&mut self, input: &[u8]) -> Result<Vec<Got>, ConnError> {
        let mut got = Vec::new();
        let mut at = 0;
        loop {
            let (used, event) = self.conn.poll(&input[at..])?;
            at += used;
            let Some(event) = event else {
                assert!(used == 0 || at == input.len(), "stopped mid-input");
                if used == 0 {
                    return Ok(got);
                }
                continue;
            };
            got.push(match event {
                Event::Headers {
                    stream,
                    fields,
                    end_stream,
                    trailers,
                } => Got::Headers(
                    stream,
                    fields
                        .iter()
                        .map(|(n, v)| {
                            (
                                String::from_utf8_lossy(n).into(),
                                String::from_utf8_lossy(v).into(),
                            )
                        })
                        .collect(),
                    end_stream,
                    trailers,
                ),
                Event::Data {
                    stream,
                    data,
                    end_stream,
                } => Got::Data(stream, data.to_vec(), end_stream),
                Event::Reset {
                    stream,
                    code: c,
                    by_client,
                } => Got::Reset(stream, code(c), by_client),
                Event::Refused { stream, status } => Got::Refused(stream, status),
                Event::GoAway { last_stream } => Got::GoAway(last_stream),
            });
        }
    }

    fn request(&mut self, stream: u32, path: &str, end_stream: bool) -> Vec<u8> {
        let mut block = Vec::new();
        for (n, v) in [
            (":method", "GET"),
            (":scheme", "https"),
            (":path", path),
            (":authority", "a.example"),
        ] {
            self.encoder.field(n.as_bytes(), v.as_bytes(), &mut block);
        }
        let flags = 0x4 | if end_stream { 0x1 } else { 0 };
        raw(0x1, flags, stream, &block)
    }

    /// The server's output since the last call, one description per frame.
    fn frames(&mut self) -> Vec<String> {
        let out = std::mem::take(self.conn.output());
        let mut at = 0;
        let mut seen = Vec::new();
        while at < out.len() {
            let Ok(Some((frame, used))) = frame::parse(&out[at..], 1 << 24) else {
                panic!("the server wrote a bad frame at {at}");
            };
            at += used;
            seen.push(match frame {
                Frame::Settings(SettingsFrame::Ack) => "SETTINGS ack".to_string(),
                Frame::Settings(SettingsFrame::Params(p)) => {
                    let params: Vec<String> = p
                        .chunks(6)
                        .map(|c| {
                            format!(
                                "{:#x}={}",
                                u16::from_be_bytes([c[0], c[1]]),
                                u32::from_be_bytes([c[2], c[3], c[4], c[5]])
                            )
                        })
                        .collect();
                    format!("SETTINGS {}", params.join(" "))
                }
                Frame::WindowUpdate { stream, increment } => {
                    format!("WINDOW_UPDATE {stream} +{increment}")
                }
                Frame::Headers {
                    stream,
                    end_stream,
                    fragment,
                    ..
                } => {
                    let mut fields = Fields::new();
                    self.decoder
                        .decode(fragment, 1 << 20, &mut fields)
                        .expect("our block decodes");
                    let list: Vec<String> = fields
                        .iter()
                        .map(|(n, v)| {
                            format!(
                                "{}={}",
                                String::from_utf8_lossy(n),
                                String::from_utf8_lossy(v)
                            )
                        })
                        .collect();
                    format!(
                        "HEADERS {stream} {}{}",
                        list.join(","),
                        if end_stream { " end" } else { "" }
                    )
                }
                Frame::Data {
                    stream,
                    data,
                    end_stream,
                    ..
                } => {
                    format!(
                        "DATA {stream} {}{}",
                        String::from_utf8_lossy(data),
                        if end_stream { " end" } else { "" }
                    )
                }
                Frame::RstStream { stream, code: c } => {
                    format!("RST_STREAM {stream} {:?}", code(c))
                }
                Frame::GoAway {
                    last_stream,
                    code: c,
                } => format!("GOAWAY {last_stream} {:?}", code(c)),
                Frame::Ping { ack, data } => {
                    format!("PING {ack} {}", String::from_utf8_lossy(&data))
                }
                other => format!("{other:?}"),
            });
        }
        seen
    }
}

fn fields(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

fn get(path: &str) -> Vec<(String, String)> {
    fields(&[
        (":method", "GET"),
        (":scheme", "https"),
        (":path", path),
        (":authority", "a.example"),
    ])
}

fn conn_error(result: Result<Vec<Got>, ConnError>) -> Option<ErrorCode> {
    result.err().map(|e| e.code)
}

#[test]
fn a_request_and_its_answer() {
    let mut c = Client::new(Config::default());
    let request = c.request(1, "/a", true);
    assert_eq!(
        c.feed(&request),
        Ok(vec![Got::Headers(1, get("/a"), true, false)])
    );
    assert_eq!(c.conn.open_streams(), 1);
    let content_type: (&[u8], &[u8]) = (b"Content-Type", b"text/plain");
    assert_eq!(
        c.conn.send_headers(1, Some(200), [content_type], false),
        Ok(())
    );
    assert_eq!(c.conn.send_data(1, b"hello", true), Ok(5));
    assert_eq!(
        c.frames(),
        [
            "HEADERS 1 :status=200,content-type=text/plain",
            "DATA 1 hello end"
        ]
    );
    assert_eq!(c.conn.open_streams(), 0);
    assert_eq!(
        c.conn.send_data(1, b"more", true),
        Err(SendError::NotOpen(1))
    );
}

#[test]
fn the_preface_may_arrive_in_pieces_but_must_be_exact() {
    let mut conn = Connection::new(Config::default());
    let mut hello = PREFACE.to_vec();
    hello.extend_from_slice(&settings(&[]));
    let mut buffer = Vec::new();
    for octet in hello {
        buffer.push(octet);
        let (used, event) = conn.poll(&buffer).expect("a prefix of a good start");
        assert!(event.is_none());
        buffer.drain(..used);
    }
    assert!(buffer.is_empty());
    let mut conn = Connection::new(Config::default());
    let err = conn.poll(b"GET / HTTP/1.1\r\n").map(|_| ()).unwrap_err();
    assert_eq!(err.code, ErrorCode::Protocol);
    let mut c = Connection::new(Config::default());
    let mut ping_first = PREFACE.to_vec();
    ping_first.extend_from_slice(&raw(0x6, 0, 0, &[0; 8]));
    assert_eq!(
        c.poll(&ping_first).map(|_| ()).unwrap_err().code,
        ErrorCode::Protocol
    );
}

#[test]
fn a_header_block_in_continuations_and_nothing_between_them() {
    let mut c = Client::new(Config::default());
    let whole = c.request(1, "/split", true);
    let block = &whole[9..];
    let (a, b) = block.split_at(5);
    let mut input = raw(0x1, 0x1, 1, a);
    input.extend_from_slice(&raw(0x9, 0x4, 1, b));
    assert_eq!(
        c.feed(&input),
        Ok(vec![Got::Headers(1, get("/split"), true, false)])
    );

    let mut c = Client::new(Config::default());
    let whole = c.request(1, "/split", true);
    let mut input = raw(0x1, 0x1, 1, &whole[9..14]);
    input.extend_from_slice(&raw(0x6, 0, 0, &[0; 8]));
    assert_eq!(conn_error(c.feed(&input)), Some(ErrorCode::Protocol));
    assert_eq!(c.frames(), ["GOAWAY 0 Protocol"]);
}

#[test]
fn a_continuation_flood_ends_the_connection() {
    let mut c = Client::new(Config {
        max_header_list_size: 1024,
        ..Config::default()
    });
    let mut input = raw(0x1, 0, 1, &[0x82]);
    for _ in 0..20 {
        input.extend_from_slice(&raw(0x9, 0, 1, &[0x82; 100]));
    }
    assert_eq!(conn_error(c.feed(&input)), Some(ErrorCode::EnhanceYourCalm));
    let mut c = Client::new(Config::default());
    let mut input = raw(0x1, 0, 1, &[0x82]);
    for _ in 0..200 {
        input.extend_from_slice(&raw(0x9, 0, 1, &[]));
    }
    assert_eq!(conn_error(c.feed(&input)), Some(ErrorCode::EnhanceYourCalm));
}

#[test]
fn clients_open_odd_streams_upwards() {
    let mut c = Client::new(Config::default());
    let even = c.request(2, "/", true);
    assert_eq!(conn_error(c.feed(&even)), Some(ErrorCode::Protocol));
    let mut c = Client::new(Config::default());
    let mut input = c.request(5, "/five", true);
    input.extend_from_slice(&c.request(3, "/three", true));
    // Stream 3 is below 5, so closed: its block is decoded and dropped.
    assert_eq!(
        c.feed(&input),
        Ok(vec![Got::Headers(5, get("/five"), true, false)])
    );
}

#[test]
fn streams_past_the_concurrency_bound_are_refused() {
    let mut c = Client::new(Config {
        max_concurrent_streams: 2,
        ..Config::default()
    });
    let mut input = Vec::new();
    for id in [1, 3, 5] {
        input.extend_from_slice(&c.request(id, "/", true));
    }
    let got = c.feed(&input).expect("no connection error");
    assert_eq!(got[2], Got::Reset(5, ErrorCode::RefusedStream, false));
    assert_eq!(c.frames(), ["RST_STREAM 5 RefusedStream"]);
    assert_eq!(c.conn.open_streams(), 2);
}

#[test]
fn request_bodies_are_flow_controlled_and_credit_comes_back_on_release() {
    let mut c = Client::new(Config {
        initial_window_size: 100,
        ..Config::default()
    });
    let mut input = c.request(1, "/up", false);
    input.extend_from_slice(&raw(0x0, 0, 1, &[b'x'; 60]));
    let got = c.feed(&input).expect("within the window");
    assert_eq!(got[1], Got::Data(1, vec![b'x'; 60], false));
    c.conn.release(1, 60);
    assert_eq!(c.frames(), ["WINDOW_UPDATE 1 +60"]);
    // 60 granted back: 100 fit, 101 do not.
    let over = raw(0x0, 0, 1, &[b'y'; 101]);
    assert_eq!(
        c.feed(&over),
        Ok(vec![Got::Reset(1, ErrorCode::FlowControl, false)])
    );
    assert_eq!(c.frames(), ["RST_STREAM 1 FlowControl"]);
}

/// `len` octets of DATA on `stream`, in frames of the default maximum size.
fn data_frames(stream: u32, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut left = len;
    while left > 0 {
        let n = left.min(16_384);
        out.extend_from_slice(&raw(0x0, 0, stream, &vec![b'd'; n]));
        left -= n;
    }
    out
}

/// A connection holding 65,535 octets on one stream and the rest of a 70,000-octet
/// connection window on another, none passed on yet.
fn connection_window_full() -> Client {
    let mut c = Client::new(Config {
        initial_window_size: 65_535,
        connection_window: 70_000,
        ..Config::default()
    });
    let mut input = c.request(1, "/up", false);
    input.extend_from_slice(&data_frames(1, 65_535));
    input.extend_from_slice(&c.request(3, "/up", false));
    input.extend_from_slice(&data_frames(3, 4_465));
    let got = c.feed(&input).expect("within both windows");
    assert_eq!(got.len(), 2 + 4 + 1, "{got:?}");
    assert!(c.frames().is_empty(), "nothing released, nothing granted");
    c
}

#[test]
fn a_connections_streams_together_get_no_more_than_its_window() {
    let mut c = connection_window_full();
    // Stream 3's own window has room; the connection's has none.
    let err = c
        .feed(&raw(0x0, 0, 3, b"x"))
        .expect_err("past the connection window");
    assert_eq!(err.code, ErrorCode::FlowControl);
}

#[test]
fn connection_credit_comes_back_once_half_the_window_is_released() {
    let mut c = connection_window_full();
    c.conn.release(3, 4_465);
    assert!(
        c.frames().is_empty(),
        "4,465 is under half of either window"
    );
    c.conn.release(1, 65_535);
    assert_eq!(
        c.frames(),
        ["WINDOW_UPDATE 0 +70000", "WINDOW_UPDATE 1 +65535"]
    );
    let got = c.feed(&raw(0x0, 0, 3, b"x")).expect("credit came back");
    assert_eq!(got, vec![Got::Data(3, b"x".to_vec(), false)]);
}

#[test]
fn a_connection_window_under_the_initial_one_is_the_initial_one() {
    // No WINDOW_UPDATE can shrink a window: 65,535 is where every connection starts.
    let mut c = Client::new(Config {
        connection_window: 1_000,
        ..Config::default()
    });
    let mut input = c.request(1, "/up", false);
    input.extend_from_slice(&data_frames(1, 65_535));
    assert!(c.feed(&input).is_ok(), "65,535 octets fit");
    let err = c
        .feed(&raw(0x0, 0, 1, b"x"))
        .expect_err("one more does not");
    assert_eq!(err.code, ErrorCode::FlowControl);
}

#[test]
fn answers_wait_for_the_clients_windows() {
    let mut c = Client::with_settings(Config::default(), &[(0x4, 10), (0x5, 16_384)]);
    let request = c.request(1, "/down", true);
    c.feed(&request).expect("request");
    let none: [(&[u8], &[u8]); 0] = [];
    c.conn
        .send_headers(1, Some(200), none, false)
        .expect("open");
    assert_eq!(c.conn.send_data(1, b"0123456789abcdef", true), Ok(10));
    assert_eq!(c.conn.send_capacity(1), 0);
    // A larger INITIAL_WINDOW_SIZE moves the open stream's window by the difference.
    c.feed(&settings(&[(0x4, 14)])).expect("settings");
    assert_eq!(c.conn.send_capacity(1), 4);
    c.feed(&raw(0x8, 0, 1, &2u32.to_be_bytes()))
        .expect("update");
    assert_eq!(c.conn.send_data(1, b"abcdef", true), Ok(6));
    assert_eq!(
        c.frames(),
        [
            "HEADERS 1 :status=200",
            "DATA 1 0123456789",
            "SETTINGS ack",
            "DATA 1 abcdef end"
        ]
    );
}

#[test]
fn a_window_update_past_the_maximum_is_an_error_where_it_lands() {
    let mut c = Client::new(Config::default());
    let request = c.request(1, "/", true);
    c.feed(&request).expect("request");
    let huge = raw(0x8, 0, 1, &0x7fff_ffffu32.to_be_bytes());
    assert_eq!(
        c.feed(&huge),
        Ok(vec![Got::Reset(1, ErrorCode::FlowControl, false)])
    );
    let huge = raw(0x8, 0, 0, &0x7fff_ffffu32.to_be_bytes());
    assert_eq!(conn_error(c.feed(&huge)), Some(ErrorCode::FlowControl));
}

#[test]
fn rapid_reset_ends_the_connection() {
    let mut c = Client::new(Config::default());
    let mut outcome = Ok(vec![]);
    for n in 0..300u32 {
        let id = 2 * n + 1;
        let mut input = c.request(id, "/", true);
        input.extend_from_slice(&raw(0x3, 0, id, &8u32.to_be_bytes()));
        outcome = c.feed(&input);
        if outcome.is_err() {
            assert!(n >= RESET_ALLOWANCE, "stopped after {n} resets");
            break;
        }
    }
    assert_eq!(conn_error(outcome), Some(ErrorCode::EnhanceYourCalm));
}

#[test]
fn floods_of_empty_data_and_unread_pings_end_the_connection() {
    let mut c = Client::new(Config::default());
    let mut input = c.request(1, "/", false);
    for _ in 0..=MAX_EMPTY_FRAMES {
        input.extend_from_slice(&raw(0x0, 0, 1, &[]));
    }
    assert_eq!(conn_error(c.feed(&input)), Some(ErrorCode::EnhanceYourCalm));

    let mut c = Client::new(Config::default());
    c.feed(&raw(0x6, 0, 0, b"pingpong")).expect("one ping");
    assert_eq!(c.frames(), ["PING true pingpong"]);
    let mut flood = Vec::new();
    for _ in 0..10_000 {
        flood.extend_from_slice(&raw(0x6, 0, 0, b"pingpong"));
    }
    assert_eq!(conn_error(c.feed(&flood)), Some(ErrorCode::EnhanceYourCalm));
}

#[test]
fn an_oversized_head_is_answered_431_and_the_table_stays_in_step() {
    let mut c = Client::new(Config {
        max_header_list_size: 300,
        ..Config::default()
    });
    // Literal with incremental indexing: the client's table now holds it at 62.
    let mut block = vec![0x82, 0x84, 0x87, 0x41, 9];
    block.extend_from_slice(b"a.example");
    block.extend_from_slice(&[0x40, 1, b'x', 0x7f, 100]);
    block.extend_from_slice(&[b'v'; 227]);
    let big = raw(0x1, 0x5, 1, &block);
    assert_eq!(c.feed(&big), Ok(vec![Got::Refused(1, 431)]));
    assert_eq!(c.frames(), ["HEADERS 1 :status=431 end"]);
    // Index 62 is now x: v*227, 63 the authority: the next request reads them.
    let next = raw(0x1, 0x5, 3, &[0x82, 0x84, 0x87, 0xbf]);
    let got = c.feed(&next).expect("in step");
    assert_eq!(
        got,
        [Got::Headers(
            3,
            fields(&[
                (":method", "GET"),
                (":path", "/"),
                (":scheme", "https"),
                (":authority", "a.example")
            ]),
            true,
            false
        )]
    );
}

#[test]
fn trailers_end_a_request_and_must_say_so() {
    let mut c = Client::new(Config::default());
    let mut input = c.request(1, "/t", false);
    input.extend_from_slice(&raw(0x0, 0, 1, b"body"));
    let mut trailer = Vec::new();
    c.encoder.field(b"x-checksum", b"1", &mut trailer);
    input.extend_from_slice(&raw(0x1, 0x5, 1, &trailer));
    let got = c.feed(&input).expect("trailers");
    assert_eq!(
        got[2],
        Got::Headers(1, fields(&[("x-checksum", "1")]), true, true)
    );

    let mut c = Client::new(Config::default());
    let mut input = c.request(1, "/t", false);
    input.extend_from_slice(&raw(0x1, 0x4, 1, &trailer));
    let got = c.feed(&input).expect("a stream error only");
    assert_eq!(got[1], Got::Reset(1, ErrorCode::Protocol, false));
}

#[test]
fn data_where_no_stream_takes_it() {
    let mut c = Client::new(Config::default());
    assert_eq!(
        conn_error(c.feed(&raw(0x0, 0, 1, b"x"))),
        Some(ErrorCode::Protocol)
    );

    let mut c = Client::new(Config::default());
    let mut input = c.request(1, "/", true);
    input.extend_from_slice(&raw(0x0, 0, 1, b"late"));
    let got = c.feed(&input).expect("a stream error only");
    assert_eq!(got[1], Got::Reset(1, ErrorCode::StreamClosed, false));
}

#[test]
fn an_early_answer_stops_the_upload_and_later_frames_are_ignored() {
    let mut c = Client::new(Config::default());
    let request = c.request(1, "/upload", false);
    c.feed(&request).expect("request");
    let none: [(&[u8], &[u8]); 0] = [];
    c.conn.send_headers(1, Some(413), none, true).expect("open");
    assert_eq!(
        c.frames(),
        ["HEADERS 1 :status=413 end", "RST_STREAM 1 NoError"]
    );
    let mut late = raw(0x0, 0, 1, b"in flight");
    let mut trailer = Vec::new();
    c.encoder.field(b"x-done", b"1", &mut trailer);
    late.extend_from_slice(&raw(0x1, 0x5, 1, &trailer));
    assert_eq!(c.feed(&late), Ok(vec![]));
    assert!(c.frames().is_empty());
}

#[test]
fn garbage_in_a_header_block_is_a_compression_error() {
    let mut c = Client::new(Config::default());
    assert_eq!(
        conn_error(c.feed(&raw(0x1, 0x5, 1, &[0x80]))),
        Some(ErrorCode::Compression)
    );
    assert_eq!(c.frames(), ["GOAWAY 0 Compression"]);
}

#[test]
fn answers_are_cut_to_the_clients_frame_size() {
    let mut c = Client::with_settings(Config::default(), &[(0x5, 16_384)]);
    let request = c.request(1, "/big", true);
    c.feed(&request).expect("request");
    let body = vec![b'z'; 40_000];
    let none: [(&[u8], &[u8]); 0] = [];
    c.conn
        .send_headers(1, Some(200), none, false)
        .expect("open");
    assert_eq!(c.conn.send_data(1, &body, true), Ok(40_000));
    let sizes: Vec<usize> = c.frames()[1..]
        .iter()
        .map(|f| f.trim_end_matches(" end").len() - "DATA 1 ".len())
        .collect();
    assert_eq!(sizes, [16_384, 16_384, 7_232]);
}

#[test]
fn after_our_goaway_open_streams_finish_and_new_ones_are_not_taken() {
    let mut c = Client::new(Config::default());
    let first = c.request(1, "/first", true);
    c.feed(&first).expect("request");
    c.conn.go_away();
    c.conn.go_away();
    assert_eq!(c.frames(), ["GOAWAY 1 NoError"]);
    let mut late = c.request(3, "/late", false);
    late.extend_from_slice(&raw(0x0, 0x1, 3, b"body in flight"));
    assert_eq!(c.feed(&late), Ok(vec![]));
    assert_eq!(c.conn.open_streams(), 1);
    let none: [(&[u8], &[u8]); 0] = [];
    c.conn
        .send_headers(1, Some(204), none, true)
        .expect("still open");
    assert_eq!(c.frames(), ["HEADERS 1 :status=204 end"]);
    assert_eq!(c.conn.open_streams(), 0);
}

#[test]
fn an_idle_connection_gives_its_buffers_back() {
    let mut c = Client::new(Config::default());
    let mut block = Vec::new();
    c.encoder.field(b":method", b"GET", &mut block);
    c.encoder.field(b":scheme", b"https", &mut block);
    c.encoder.field(b":path", &[b'p'; 8_000], &mut block);
    let request = raw(0x1, 0x5, 1, &block);
    c.feed(&request).expect("request");
    let none: [(&[u8], &[u8]); 0] = [];
    c.conn.send_headers(1, Some(204), none, true).expect("open");
    c.frames();
    assert!(c.conn.buffer_size() > 8_000, "{}", c.conn.buffer_size());
    c.conn.free_buffers();
    assert_eq!(c.conn.buffer_size(), 0);
    let again = c.request(3, "/again", true);
    assert_eq!(c.feed(&again).map(|g| g.len()), Ok(1));
}

#[test]
fn a_stream_depending_on_itself_is_reset_after_its_block_is_decoded() {
    let mut c = Client::new(Config::default());
    // HEADERS with PRIORITY on itself, whose block adds "x: 1" to the client's table (62).
    let mut payload = vec![0, 0, 0, 1, 0];
    payload.extend_from_slice(&[0x82, 0x84, 0x87, 0x41, 1, b'a', 0x40, 1, b'x', 1, b'1']);
    let looped = raw(0x1, 0x20 | 0x5, 1, &payload);
    assert_eq!(c.feed(&looped), Ok(vec![]));
    assert_eq!(c.frames(), ["RST_STREAM 1 Protocol"]);
    // The next block reads index 62 and 63 as the client wrote them.
    let next = raw(0x1, 0x5, 3, &[0x82, 0x84, 0x87, 0xbf, 0xbe]);
    assert_eq!(
        c.feed(&next),
        Ok(vec![Got::Headers(
            3,
            fields(&[
                (":method", "GET"),
                (":path", "/"),
                (":scheme", "https"),
                (":authority", "a"),
                ("x", "1")
            ]),
            true,
            false
        )])
    );
}
