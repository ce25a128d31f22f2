//! HTTPRoute filters as pure functions over plain values, so their Gateway API semantics are
//! tested without sockets; the proxy calls them with Pingora's header types.

use coxswain_api::snapshot::{self as snap, path_modifier};

/// Header edits a filter makes: set replaces, add appends, remove deletes. Names and values
/// live for `'v` (the snapshot's modifier), so a list of fields may borrow them.
pub trait EditHeaders<'v> {
    fn set(&mut self, name: &'v str, value: &'v str);
    fn add(&mut self, name: &'v str, value: &'v str);
    fn remove(&mut self, name: &str);
}

/// Applies a header modifier in the order the Gateway API defines: set, add, remove.
pub fn modify_headers<'v, H: EditHeaders<'v> + ?Sized>(
    headers: &mut H,
    m: &'v snap::HeaderModifier,
) {
    for h in &m.set {
        headers.set(&h.name, &h.value);
    }
    for h in &m.add {
        headers.add(&h.name, &h.value);
    }
    for name in &m.remove {
        headers.remove(name);
    }
}

/// Fields a header modifier must leave to the engine: they frame the message, belong to one
/// connection or are set by Pingora itself, so an edit to them is not a plain copy of the head.
const ENGINE_FIELDS: [&str; 10] = [
    "connection",
    "content-length",
    // Pingora writes its own Date on every final response.
    "date",
    "expect",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether a filter only edits header fields in a way the fast path can apply while it
/// copies a head, with the same result as Pingora's header types: a header modifier whose
/// names are tokens and whose values are visible ASCII (what `http::HeaderValue` takes), and
/// that leaves `ENGINE_FIELDS` alone. Decided once per snapshot.
pub fn edits_fields_only(f: &snap::Filter) -> bool {
    use snap::filter::Kind;
    let m = match &f.kind {
        Some(Kind::RequestHeaderModifier(m) | Kind::ResponseHeaderModifier(m)) => m,
        _ => return false,
    };
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.bytes().all(is_token_byte)
            && !ENGINE_FIELDS.iter().any(|e| e.eq_ignore_ascii_case(n))
    };
    let value_ok = |v: &str| v.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b));
    m.set
        .iter()
        .chain(&m.add)
        .all(|h| name_ok(&h.name) && value_ok(&h.value))
        && m.remove.iter().all(|n| name_ok(n))
}

/// Whether the fast path applies a filter as Pingora would: header edits it can make while it
/// copies the head (`edits_fields_only`), URL rewrites, which change the target and the Host
/// it writes (a hostname that is a valid field value: compiled from a DNS name, it is), and
/// CORS, whose answers and fields the route policy gives both engines.
pub fn fast_path_filter(f: &snap::Filter) -> bool {
    match &f.kind {
        Some(snap::filter::Kind::Cors(_)) => true,
        Some(snap::filter::Kind::UrlRewrite(r)) => r
            .hostname
            .bytes()
            .all(|b| b == b'-' || b == b'.' || b.is_ascii_alphanumeric()),
        _ => edits_fields_only(f),
    }
}

/// RFC 9110 5.6.2 tchar.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The path after a path modifier. `matched_prefix` is the route's prefix as the router keeps
/// it ("" for "/"); the query string is kept.
pub fn rewrite_path(
    path_and_query: &str,
    matched_prefix: Option<&str>,
    m: &snap::PathModifier,
) -> String {
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    let mut out = match &m.kind {
        Some(path_modifier::Kind::ReplaceFullPath(full)) => full.clone(),
        Some(path_modifier::Kind::ReplacePrefixMatch(replacement)) => {
            let prefix = matched_prefix.unwrap_or("");
            let rest = path
                .get(prefix.len()..)
                .filter(|_| path.starts_with(prefix))
                .unwrap_or(path);
            format!("{}{rest}", replacement.trim_end_matches('/'))
        }
        // Without the route's regex there are no groups to fill in; the proxy renders these
        // from its compiled route instead.
        Some(path_modifier::Kind::ReplaceRegexMatch(template)) => {
            crate::policy::Template::parse(template).render(|_| None, None)
        }
        None => path.to_owned(),
    };
    if !out.starts_with('/') {
        out.insert(0, '/');
    }
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// What a redirect needs to know about the request.
pub struct RedirectRequest<'a> {
    pub scheme: &'a str,
    /// Host without port.
    pub host: &'a str,
    /// The listener port the request arrived on.
    pub listener_port: u16,
    pub path_and_query: &'a str,
    pub matched_prefix: Option<&'a str>,
}

/// The Location of a RequestRedirect (Gateway API HTTPRequestRedirectFilter): unset parts keep
/// the request's; the port defaults to the scheme's well-known port when the scheme is set,
/// else to the listener's port, and is left out when it is the scheme's default.
pub fn redirect_location(req: &RedirectRequest<'_>, r: &snap::RequestRedirect) -> String {
    if !r.location.is_empty() {
        return r.location.clone();
    }
    let scheme = if r.scheme.is_empty() {
        req.scheme
    } else {
        r.scheme.as_str()
    };
    let host = if r.hostname.is_empty() {
        req.host
    } else {
        r.hostname.as_str()
    };
    let port = if r.port != 0 {
        u16::try_from(r.port).unwrap_or(req.listener_port)
    } else if !r.scheme.is_empty() {
        default_port(scheme)
    } else {
        req.listener_port
    };
    let path = match &r.path {
        Some(m) => rewrite_path(req.path_and_query, req.matched_prefix, m),
        None => req.path_and_query.to_owned(),
    };
    if port == default_port(scheme) {
        format!("{scheme}://{host}{path}")
    } else {
        format!("{scheme}://{host}:{port}{path}")
    }
}

fn default_port(scheme: &str) -> u16 {
    if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        80
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(p: &str) -> snap::PathModifier {
        snap::PathModifier {
            kind: Some(path_modifier::Kind::ReplacePrefixMatch(p.into())),
        }
    }

    fn full(p: &str) -> snap::PathModifier {
        snap::PathModifier {
            kind: Some(path_modifier::Kind::ReplaceFullPath(p.into())),
        }
    }

    // Gateway API HTTPPathModifier: ReplacePrefixMatch replaces the matched prefix only, on
    // path element boundaries; the conformance suite's httproute-rewrite-path cases.
    #[test]
    fn prefix_rewrites_follow_the_conformance_cases() {
        assert_eq!(
            rewrite_path("/prefix/one/two", Some("/prefix/one"), &prefix("/one")),
            "/one/two"
        );
        assert_eq!(
            rewrite_path("/strip-prefix/three", Some("/strip-prefix"), &prefix("/")),
            "/three"
        );
        assert_eq!(
            rewrite_path("/strip-prefix", Some("/strip-prefix"), &prefix("/")),
            "/"
        );
        assert_eq!(
            rewrite_path("/a/b?x=1", Some("/a"), &prefix("/z/")),
            "/z/b?x=1"
        );
        assert_eq!(
            rewrite_path("/anything", Some(""), &prefix("/base")),
            "/base/anything"
        );
        assert_eq!(
            rewrite_path("/full/one?q", Some("/full"), &full("/one")),
            "/one?q"
        );
    }

    fn redirect(
        scheme: &str,
        host: &str,
        port: u32,
        path: Option<snap::PathModifier>,
    ) -> snap::RequestRedirect {
        snap::RequestRedirect {
            scheme: scheme.into(),
            hostname: host.into(),
            path,
            port,
            status_code: 302,
            location: String::new(),
        }
    }

    #[test]
    fn redirect_ports_derive_from_scheme_or_listener() {
        let req = RedirectRequest {
            scheme: "http",
            host: "example.com",
            listener_port: 8080,
            path_and_query: "/a?b=c",
            matched_prefix: Some("/a"),
        };
        assert_eq!(
            redirect_location(&req, &redirect("https", "", 0, None)),
            "https://example.com/a?b=c"
        );
        assert_eq!(
            redirect_location(&req, &redirect("", "other.org", 0, None)),
            "http://other.org:8080/a?b=c"
        );
        assert_eq!(
            redirect_location(&req, &redirect("", "", 80, None)),
            "http://example.com/a?b=c"
        );
        assert_eq!(
            redirect_location(&req, &redirect("https", "", 8443, None)),
            "https://example.com:8443/a?b=c"
        );
        assert_eq!(
            redirect_location(&req, &redirect("", "", 0, Some(prefix("/new")))),
            "http://example.com:8080/new?b=c"
        );
    }

    #[derive(Default)]
    struct Headers(Vec<(String, String)>);

    impl EditHeaders<'_> for Headers {
        fn set(&mut self, name: &str, value: &str) {
            self.remove(name);
            self.0.push((name.to_ascii_lowercase(), value.into()));
        }
        fn add(&mut self, name: &str, value: &str) {
            self.0.push((name.to_ascii_lowercase(), value.into()));
        }
        fn remove(&mut self, name: &str) {
            self.0.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        }
    }

    #[test]
    fn header_modifier_sets_then_adds_then_removes() {
        let mut h = Headers(vec![
            ("x-a".into(), "old".into()),
            ("x-gone".into(), "1".into()),
        ]);
        let m = snap::HeaderModifier {
            set: vec![snap::Header {
                name: "X-A".into(),
                value: "new".into(),
            }],
            add: vec![
                snap::Header {
                    name: "x-b".into(),
                    value: "1".into(),
                },
                snap::Header {
                    name: "x-b".into(),
                    value: "2".into(),
                },
            ],
            remove: vec!["x-gone".into()],
        };
        modify_headers(&mut h, &m);
        assert_eq!(
            h.0,
            [
                ("x-a".to_owned(), "new".to_owned()),
                ("x-b".into(), "1".into()),
                ("x-b".into(), "2".into())
            ]
        );
    }

    #[test]
    fn only_plain_field_edits_are_copied_with_the_head() {
        let modifier = |name: &str, value: &str| snap::HeaderModifier {
            set: vec![snap::Header {
                name: name.into(),
                value: value.into(),
            }],
            ..Default::default()
        };
        let request = |m| snap::Filter {
            kind: Some(snap::filter::Kind::RequestHeaderModifier(m)),
        };
        let response = |m| snap::Filter {
            kind: Some(snap::filter::Kind::ResponseHeaderModifier(m)),
        };
        assert!(edits_fields_only(&request(modifier("X-Tenant", "a b\tc"))));
        assert!(edits_fields_only(&response(modifier(
            "x-served-by",
            "edge"
        ))));
        // Framing and connection fields stay with the engine, whatever their case.
        assert!(!edits_fields_only(&request(modifier(
            "Content-Length",
            "3"
        ))));
        assert!(!edits_fields_only(&response(modifier(
            "transfer-encoding",
            "chunked"
        ))));
        assert!(!edits_fields_only(&request(modifier(
            "Connection",
            "close"
        ))));
        let removes = snap::HeaderModifier {
            remove: vec!["Upgrade".into()],
            ..Default::default()
        };
        assert!(!edits_fields_only(&request(removes)));
        // Values Pingora's header types would refuse, and names that are not tokens.
        assert!(!edits_fields_only(&request(modifier(
            "x-a",
            "line\r\nx-b: 1"
        ))));
        assert!(!edits_fields_only(&request(modifier("x-a", "caf\u{e9}"))));
        assert!(!edits_fields_only(&request(modifier("x a", "1"))));
        assert!(!edits_fields_only(&request(modifier("", "1"))));
        // Any other filter is not a field edit.
        let mirror = snap::Filter {
            kind: Some(snap::filter::Kind::RequestMirror(Default::default())),
        };
        assert!(!edits_fields_only(&mirror));
    }

    #[test]
    fn url_rewrites_and_cors_take_the_fast_path() {
        let rewrite = |hostname: &str| snap::Filter {
            kind: Some(snap::filter::Kind::UrlRewrite(snap::UrlRewrite {
                hostname: hostname.into(),
                path: Some(prefix("/new")),
            })),
        };
        assert!(fast_path_filter(&rewrite("")));
        assert!(fast_path_filter(&rewrite("inner.example")));
        assert!(fast_path_filter(&rewrite("a-1.example")));
        // Not a field value the head could carry as it is.
        assert!(!fast_path_filter(&rewrite("a.example\r\nx-b: 1")));
        assert!(!fast_path_filter(&rewrite("caf\u{e9}.example")));
        let mirror = snap::Filter {
            kind: Some(snap::filter::Kind::RequestMirror(Default::default())),
        };
        assert!(!fast_path_filter(&mirror));
        let cors = snap::Filter {
            kind: Some(snap::filter::Kind::Cors(Default::default())),
        };
        assert!(fast_path_filter(&cors));
    }
}
