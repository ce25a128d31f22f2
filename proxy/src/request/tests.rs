use super::*;
use crate::router::Headers;

/// A head given as text, for the checks.
struct TestHead {
    method: &'static str,
    target: &'static str,
    version: Version,
    headers: Vec<(&'static str, &'static str)>,
}

impl Headers for TestHead {
    fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
}

impl Head for TestHead {
    fn method(&self) -> &str {
        self.method
    }
    fn target(&self) -> &[u8] {
        self.target.as_bytes()
    }
    fn version(&self) -> Version {
        self.version
    }
    fn each_header<'s>(&'s self, f: &mut dyn FnMut(&'s [u8], &'s [u8])) {
        for (n, v) in &self.headers {
            f(n.as_bytes(), v.as_bytes());
        }
    }
}

fn get(target: &'static str, headers: &[(&'static str, &'static str)]) -> TestHead {
    TestHead {
        method: "GET",
        target,
        version: Version::Http11,
        headers: headers.to_vec(),
    }
}

fn norm(target: &str) -> Result<String, Reject> {
    normalize(target.as_bytes()).map(|c| c.into_owned())
}

#[test]
fn targets_are_normalised_before_routing() {
    let cases = [
        ("/admin", "/admin"),
        ("/admin#x", "/admin"),
        ("/admin?q=1#frag", "/admin?q=1"),
        ("/x/../admin", "/admin"),
        ("/%61dmin", "/admin"),
        ("//admin", "/admin"),
        ("/a//b///c", "/a/b/c"),
        ("/a/./b/../c", "/a/c"),
        ("/../../etc", "/etc"),
        ("/a/b/..", "/a/"),
        ("/a/b/.", "/a/b/"),
        ("/a/", "/a/"),
        ("/", "/"),
        ("/%2e%2e/admin", "/admin"),
        ("/a/%2E%2E/admin", "/admin"),
        ("/a%2fb", "/a%2Fb"),
        ("/a%2Fb", "/a%2Fb"),
        ("/caf%c3%a9", "/caf%C3%A9"),
        ("/%7euser", "/~user"),
        ("/a?x=/../y", "/a?x=/../y"),
        ("/a?%61=1", "/a?%61=1"),
        ("/.well-known/acme", "/.well-known/acme"),
        ("/a..b/c.", "/a..b/c."),
    ];
    for (input, want) in cases {
        assert_eq!(norm(input).as_deref(), Ok(want), "{input}");
    }
}

#[test]
fn unchanged_targets_are_borrowed() {
    for t in ["/", "/a/b?c=d", "/a%20b", "/a/"] {
        assert!(
            matches!(normalize(t.as_bytes()), Ok(Cow::Borrowed(_))),
            "{t}"
        );
    }
    assert!(matches!(normalize(b"/a%2fb"), Ok(Cow::Owned(_))));
    assert!(
        matches!(normalize(b"/a#frag"), Ok(Cow::Owned(_))),
        "a dropped fragment is a change"
    );
}

#[test]
fn normalisation_is_idempotent() {
    for t in [
        "/x/../admin",
        "//a/./b",
        "/%61%2f%2E",
        "/a/b/..",
        "/a?b#c",
        "/%7E/../%2e",
    ] {
        let once = norm(t).unwrap();
        assert_eq!(norm(&once).unwrap(), once, "{t}");
    }
}

#[test]
fn bad_targets_are_refused() {
    for t in [
        "/a%zz",
        "/a%4",
        "/a b",
        "/a\\..\\admin",
        "/caf\u{e9}",
        "/a\"b",
        "/a?b c",
        "/a<b>",
    ] {
        assert!(
            matches!(norm(t), Err(Reject::BadRequest(_))),
            "{t:?} -> {:?}",
            norm(t)
        );
    }
}

#[test]
fn heads_that_must_be_refused() {
    let limits = Limits::default();
    let check = |h: &TestHead| super::check(h, &limits).map(|c| c.host.to_owned());
    assert_eq!(
        check(&get("/", &[("host", "a.example")])).as_deref(),
        Ok("a.example")
    );
    // Missing or repeated Host.
    assert!(matches!(check(&get("/", &[])), Err(Reject::BadRequest(_))));
    assert!(matches!(
        check(&get("/", &[("host", "a"), ("host", "b")])),
        Err(Reject::BadRequest(_))
    ));
    let mut old = get("/", &[]);
    old.version = Version::Http10;
    assert_eq!(check(&old).as_deref(), Ok(""), "HTTP/1.0 may omit Host");
    // Absolute-form: the target's authority wins over Host.
    assert_eq!(
        check(&get("http://b.example:8080/x", &[("host", "a.example")])).as_deref(),
        Ok("b.example:8080")
    );
    assert!(matches!(
        check(&get("http://u@b.example/x", &[("host", "a")])),
        Err(Reject::BadRequest(_))
    ));
    // Framing.
    for headers in [
        vec![("host", "a"), ("content-length", "+1")],
        vec![
            ("host", "a"),
            ("content-length", "1"),
            ("content-length", "2"),
        ],
        vec![("host", "a"), ("transfer-encoding", "chunked, gzip")],
        vec![("host", "bad host")],
        vec![("host", "a/b")],
        vec![("host", "a:x")],
    ] {
        let h = TestHead {
            method: "POST",
            target: "/",
            version: Version::Http11,
            headers,
        };
        assert!(
            matches!(check(&h), Err(Reject::BadRequest(_))),
            "{:?}",
            h.headers
        );
    }
    let ok = TestHead {
        method: "POST",
        target: "/",
        version: Version::Http11,
        headers: vec![("host", "a"), ("content-length", "5, 5")],
    };
    assert_eq!(super::check(&ok, &limits).unwrap().body, Body::Length(5));
    // Transfer-Encoding overrides a Content-Length beside it.
    let both = TestHead {
        method: "POST",
        target: "/",
        version: Version::Http11,
        headers: vec![
            ("host", "a"),
            ("content-length", "1"),
            ("transfer-encoding", "chunked"),
        ],
    };
    assert_eq!(super::check(&both, &limits).unwrap().body, Body::Chunked);
    let connect = TestHead {
        method: "CONNECT",
        target: "a.example:443",
        version: Version::Http11,
        headers: vec![("host", "a.example:443")],
    };
    assert_eq!(check(&connect), Err(Reject::MethodNotAllowed));
    assert!(matches!(
        check(&get("*", &[("host", "a")])),
        Err(Reject::BadRequest(_))
    ));
    assert_eq!(
        check(&get("/", &[("host", "[::1]:80")])).as_deref(),
        Ok("[::1]:80")
    );
}

#[test]
fn header_limits_answer_431() {
    let limits = Limits {
        max_request_headers: 3,
        max_request_head_bytes: 64,
        ..Limits::default()
    };
    let many = get("/", &[("host", "a"), ("a", "1"), ("b", "2"), ("c", "3")]);
    assert_eq!(check(&many, &limits).err(), Some(Reject::HeadTooLarge));
    let long = get("/", &[("host", "a"), ("a", &*"x".repeat(64).leak())]);
    assert_eq!(check(&long, &limits).err(), Some(Reject::HeadTooLarge));
    let fine = get("/", &[("host", "a"), ("a", "1")]);
    assert!(check(&fine, &limits).is_ok());
}

#[test]
fn only_idempotent_methods_may_be_replayed() {
    for m in ["GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"] {
        assert!(idempotent(m), "{m}");
    }
    for m in ["POST", "PATCH", "CONNECT", "get"] {
        assert!(!idempotent(m), "{m}");
    }
}

#[test]
fn only_close_and_keep_alive_are_this_hops_own_connection_options() {
    use ConnectionOption::{Close, KeepAlive};
    for (value, option) in [
        ("close", Some(Close)),
        ("Close", Some(Close)),
        ("keep-alive", Some(KeepAlive)),
        ("Keep-Alive , close", Some(Close)),
        (" close,", Some(Close)),
        ("", Some(KeepAlive)),
        (",", Some(KeepAlive)),
        ("upgrade", None),
        ("close, Upgrade", None),
        ("keep-alive, x-private", None),
        ("closed", None),
        ("close;q=1", None),
    ] {
        assert_eq!(connection_option(value.as_bytes()), option, "{value:?}");
    }
}
