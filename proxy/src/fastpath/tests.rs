use super::read::head_end;
use super::*;

#[test]
fn head_end_finds_the_empty_line() {
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nrest"), Some(27));
    assert_eq!(head_end(b"GET / HTTP/1.1\nHost: a\n\nrest"), Some(24));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n"), None);
    assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\n"), Some(18));
}

#[test]
fn header_values_are_text_only_when_visible_ascii() {
    assert_eq!(visible(b"a b\tc"), Some("a b\tc"));
    assert_eq!(visible(b"caf\xc3\xa9"), None);
    assert_eq!(visible(b"a\x01"), None);
}
