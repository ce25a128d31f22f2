//! Frames as a client could send them, good and malformed, against RFC 9113 section 6.

use super::frame::*;
use super::*;

/// A frame as a client would write it, whatever it holds.
pub(super) fn raw(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn one(bytes: &[u8]) -> Result<Frame<'_>, FrameError> {
    match parse(bytes, DEFAULT_MAX_FRAME_SIZE)? {
        Some((frame, used)) => {
            assert_eq!(used, bytes.len(), "the whole frame is consumed");
            Ok(frame)
        }
        None => panic!("a whole frame was given"),
    }
}

fn connection_code(result: Result<Frame<'_>, FrameError>) -> Option<ErrorCode> {
    match result {
        Err(FrameError::Connection { code, .. }) => Some(code),
        _ => None,
    }
}

#[test]
fn a_frame_waits_for_all_of_its_octets() {
    let frame = raw(0x0, 0x1, 1, b"hello");
    for cut in 0..frame.len() {
        assert_eq!(
            parse(&frame[..cut], DEFAULT_MAX_FRAME_SIZE),
            Ok(None),
            "cut at {cut}"
        );
    }
    let mut two = frame.clone();
    two.extend_from_slice(&raw(0x6, 0, 0, &[0; 8]));
    let (_, used) = parse(&two, DEFAULT_MAX_FRAME_SIZE)
        .unwrap_or_default()
        .unwrap_or((Frame::Unknown, 0));
    assert_eq!(used, frame.len());
}

#[test]
fn an_oversized_frame_is_refused_from_its_header_alone() {
    let header = [0x00, 0x40, 0x01, 0x0, 0x0, 0, 0, 0, 1];
    assert_eq!(
        parse(&header, DEFAULT_MAX_FRAME_SIZE).map(|_| ()),
        Err(FrameError::Connection {
            code: ErrorCode::FrameSize,
            reason: "frame over SETTINGS_MAX_FRAME_SIZE"
        })
    );
}

#[test]
fn padding_is_taken_off_but_counted_for_flow_control() {
    let mut payload = vec![3];
    payload.extend_from_slice(b"data");
    payload.extend_from_slice(&[0; 3]);
    assert_eq!(
        one(&raw(0x0, 0x8 | 0x1, 3, &payload)),
        Ok(Frame::Data {
            stream: 3,
            end_stream: true,
            data: b"data",
            flow_len: 8
        })
    );
    // A pad length reaching past the payload.
    assert_eq!(
        connection_code(one(&raw(0x0, 0x8, 3, &[5, 1, 2]))),
        Some(ErrorCode::Protocol)
    );
    assert_eq!(
        connection_code(one(&raw(0x0, 0x8, 3, &[]))),
        Some(ErrorCode::FrameSize)
    );
}

#[test]
fn headers_with_padding_and_priority() {
    let mut payload = vec![2];
    payload.extend_from_slice(&[0x80, 0, 0, 1, 15]);
    payload.extend_from_slice(b"block");
    payload.extend_from_slice(&[0, 0]);
    assert_eq!(
        one(&raw(0x1, 0x8 | 0x20 | 0x4, 5, &payload)),
        Ok(Frame::Headers {
            stream: 5,
            end_stream: false,
            end_headers: true,
            depends_on: Some(1),
            fragment: b"block",
        })
    );
    // Depending on itself is left to the connection, which must decode the block first.
    assert_eq!(
        one(&raw(0x1, 0x20, 5, &[0, 0, 0, 5, 0, 0x82])),
        Ok(Frame::Headers {
            stream: 5,
            end_stream: false,
            end_headers: false,
            depends_on: Some(5),
            fragment: &[0x82],
        })
    );
    assert_eq!(
        one(&raw(0x2, 0, 7, &[0, 0, 0, 1])),
        Err(FrameError::Stream {
            stream: 7,
            code: ErrorCode::FrameSize
        })
    );
}

#[test]
fn stream_frames_on_stream_zero_and_connection_frames_on_streams() {
    for kind in [0x0, 0x1, 0x2, 0x3, 0x9] {
        let payload: &[u8] = if kind == 0x2 {
            &[0, 0, 0, 1, 0]
        } else {
            &[0, 0, 0, 0]
        };
        assert_eq!(
            connection_code(one(&raw(kind, 0, 0, payload))),
            Some(ErrorCode::Protocol),
            "type {kind}"
        );
    }
    assert_eq!(
        connection_code(one(&raw(0x4, 0, 1, &[]))),
        Some(ErrorCode::Protocol)
    );
    assert_eq!(
        connection_code(one(&raw(0x6, 0, 1, &[0; 8]))),
        Some(ErrorCode::Protocol)
    );
    assert_eq!(
        connection_code(one(&raw(0x7, 0, 1, &[0; 8]))),
        Some(ErrorCode::Protocol)
    );
    assert_eq!(
        connection_code(one(&raw(0x5, 0x4, 1, &[0, 0, 0, 2]))),
        Some(ErrorCode::Protocol)
    );
}

#[test]
fn fixed_size_frames_of_the_wrong_size() {
    assert_eq!(
        connection_code(one(&raw(0x6, 0, 0, &[0; 7]))),
        Some(ErrorCode::FrameSize)
    );
    assert_eq!(
        connection_code(one(&raw(0x3, 0, 1, &[0; 5]))),
        Some(ErrorCode::FrameSize)
    );
    assert_eq!(
        connection_code(one(&raw(0x8, 0, 1, &[0; 3]))),
        Some(ErrorCode::FrameSize)
    );
    assert_eq!(
        connection_code(one(&raw(0x7, 0, 0, &[0; 7]))),
        Some(ErrorCode::FrameSize)
    );
    assert_eq!(
        connection_code(one(&raw(0x4, 0x1, 0, &[0; 6]))),
        Some(ErrorCode::FrameSize)
    );
    assert_eq!(
        connection_code(one(&raw(0x4, 0, 0, &[0; 5]))),
        Some(ErrorCode::FrameSize)
    );
}

#[test]
fn a_zero_window_update_is_a_stream_or_connection_error_by_where_it_is() {
    assert_eq!(
        connection_code(one(&raw(0x8, 0, 0, &[0; 4]))),
        Some(ErrorCode::Protocol)
    );
    assert_eq!(
        one(&raw(0x8, 0, 9, &[0x80, 0, 0, 0])),
        Err(FrameError::Stream {
            stream: 9,
            code: ErrorCode::Protocol
        })
    );
}

#[test]
fn settings_are_checked_when_read_and_applied_in_order() {
    let mut out = Vec::new();
    write_settings(
        &mut out,
        &[
            (0x4, 1 << 20),
            (0x5, 1 << 16),
            (0x3, 100),
            (0x4, 1000),
            (0x99, 7),
        ],
    );
    let Ok(Frame::Settings(frame)) = one(&out) else {
        panic!("SETTINGS")
    };
    let mut settings = Settings::default();
    assert_eq!(frame.apply(&mut settings), Ok(()));
    assert_eq!(settings.initial_window_size, 1000);
    assert_eq!(settings.max_frame_size, 1 << 16);
    assert_eq!(settings.max_concurrent_streams, 100);
    for (id, value, code) in [
        (0x2, 2, ErrorCode::Protocol),
        (0x4, 1 << 31, ErrorCode::FlowControl),
        (0x5, 16_383, ErrorCode::Protocol),
        (0x5, 1 << 24, ErrorCode::Protocol),
    ] {
        let mut out = Vec::new();
        write_settings(&mut out, &[(0x3, 1), (id, value)]);
        assert_eq!(
            connection_code(one(&out)),
            Some(code),
            "setting {id} = {value}"
        );
    }
    let mut ack = Vec::new();
    write_settings_ack(&mut ack);
    assert_eq!(one(&ack), Ok(Frame::Settings(SettingsFrame::Ack)));
}

#[test]
fn what_we_write_reads_back() {
    let mut out = Vec::new();
    write_ping_ack(&mut out, b"12345678");
    write_window_update(&mut out, 0, 1 << 20);
    write_rst_stream(&mut out, 3, ErrorCode::RefusedStream);
    write_goaway(&mut out, 7, ErrorCode::EnhanceYourCalm);
    write_data_header(&mut out, 3, 2, true);
    out.extend_from_slice(b"ok");
    let expected = [
        Frame::Ping {
            ack: true,
            data: *b"12345678",
        },
        Frame::WindowUpdate {
            stream: 0,
            increment: 1 << 20,
        },
        Frame::RstStream { stream: 3, code: 7 },
        Frame::GoAway {
            last_stream: 7,
            code: 0xb,
        },
        Frame::Data {
            stream: 3,
            end_stream: true,
            data: b"ok",
            flow_len: 2,
        },
    ];
    let mut at = 0;
    for want in expected {
        let (frame, used) = parse(&out[at..], DEFAULT_MAX_FRAME_SIZE)
            .ok()
            .flatten()
            .unwrap_or((Frame::Unknown, 0));
        assert_eq!(frame, want);
        at += used;
    }
    assert_eq!(at, out.len());
}

#[test]
fn a_long_header_block_continues_in_continuation_frames() {
    let block: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
    let mut out = Vec::new();
    write_headers(&mut out, 1, &block, true, DEFAULT_MAX_FRAME_SIZE);
    let mut joined = Vec::new();
    let mut at = 0;
    let mut frames = Vec::new();
    while at < out.len() {
        let (frame, used) = parse(&out[at..], DEFAULT_MAX_FRAME_SIZE)
            .ok()
            .flatten()
            .unwrap_or((Frame::Unknown, out.len()));
        match frame {
            Frame::Headers {
                end_stream,
                end_headers,
                fragment,
                ..
            } => {
                frames.push(("HEADERS", end_stream, end_headers, fragment.len()));
                joined.extend_from_slice(fragment);
            }
            Frame::Continuation {
                end_headers,
                fragment,
                ..
            } => {
                frames.push(("CONTINUATION", false, end_headers, fragment.len()));
                joined.extend_from_slice(fragment);
            }
            other => panic!("{other:?}"),
        }
        at += used;
    }
    assert_eq!(
        frames,
        [
            ("HEADERS", true, false, 16_384),
            ("CONTINUATION", false, false, 16_384),
            ("CONTINUATION", false, true, 7_232)
        ]
    );
    assert_eq!(joined, block);
}

#[test]
fn unknown_frame_types_are_skipped() {
    assert_eq!(one(&raw(0xfa, 0xff, 0, b"whatever")), Ok(Frame::Unknown));
}
