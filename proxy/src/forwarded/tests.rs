use super::*;
use crate::head::Version;
use crate::router::Headers;

struct Fields(Vec<(&'static str, &'static str)>);

impl Headers for Fields {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
}

impl Head for Fields {
    fn method(&self) -> &str {
        "GET"
    }
    fn target(&self) -> &[u8] {
        b"/"
    }
    fn version(&self) -> Version {
        Version::Http11
    }
    fn each_header<'s>(&'s self, f: &mut dyn FnMut(&'s [u8], &'s [u8])) {
        for (n, v) in &self.0 {
            f(n.as_bytes(), v.as_bytes());
        }
    }
}

fn trust(blocks: &[&str]) -> ClientAddress {
    ClientAddress {
        trusted: AddressSet::parse(blocks).unwrap(),
        proxy_protocol: false,
    }
}

/// The fields sent, joined, in order.
fn sent(f: &Forwarded<'_>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    f.each(&mut |name, parts| out.push((name.to_owned(), parts.concat())));
    out
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn an_untrusted_peer_is_the_client_and_its_fields_are_replaced() {
    let head = Fields(vec![
        ("X-Forwarded-For", "1.2.3.4"),
        ("X-Real-IP", "1.2.3.4"),
        ("X-Forwarded-Proto", "https"),
        ("X-Forwarded-Host", "evil.example"),
        ("X-Forwarded-Port", "1"),
        ("Forwarded", "for=1.2.3.4"),
    ]);
    let f = Forwarded::resolve(
        &head,
        Some(ip("192.0.2.9")),
        "a.example",
        false,
        8080,
        &trust(&["10.0.0.0/8"]),
    );
    assert_eq!(f.client, Some(ip("192.0.2.9")));
    assert!(!f.keeps(b"forwarded"));
    assert_eq!(
        sent(&f),
        [
            ("x-forwarded-for".into(), "192.0.2.9".into()),
            ("x-forwarded-proto".into(), "http".into()),
            ("x-forwarded-host".into(), "a.example".into()),
            ("x-forwarded-port".into(), "8080".into()),
            ("x-real-ip".into(), "192.0.2.9".into()),
        ]
    );
}

#[test]
fn a_trusted_peer_is_appended_to_and_names_the_client() {
    let head = Fields(vec![
        ("x-forwarded-for", "203.0.113.7, 10.0.0.2"),
        ("X-Forwarded-For", "10.0.0.3"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "shop.example"),
        ("x-forwarded-port", "443"),
        ("forwarded", "for=203.0.113.7"),
    ]);
    let f = Forwarded::resolve(
        &head,
        Some(ip("10.0.0.1")),
        "inner.example",
        false,
        80,
        &trust(&["10.0.0.0/8"]),
    );
    // 10.0.0.3 and 10.0.0.2 are trusted hops; 203.0.113.7 is the first that is not.
    assert_eq!(f.client, Some(ip("203.0.113.7")));
    assert!(f.keeps(b"Forwarded"));
    assert_eq!(
        sent(&f),
        [
            (
                "x-forwarded-for".into(),
                "203.0.113.7, 10.0.0.2, 10.0.0.3, 10.0.0.1".into()
            ),
            ("x-forwarded-proto".into(), "https".into()),
            ("x-forwarded-host".into(), "shop.example".into()),
            ("x-forwarded-port".into(), "443".into()),
            ("x-real-ip".into(), "203.0.113.7".into()),
        ]
    );
}

#[test]
fn the_client_behind_trusted_proxies_is_the_first_untrusted_from_the_right() {
    let t = trust(&["10.0.0.0/8", "2001:db8::/32"]);
    let client = |xff: &'static str| {
        let head = Fields(vec![("x-forwarded-for", xff)]);
        Forwarded::resolve(&head, Some(ip("10.9.9.9")), "h", true, 443, &t).client
    };
    // A spoofed left-most entry does not win over the real client.
    assert_eq!(client("6.6.6.6, 198.51.100.1"), Some(ip("198.51.100.1")));
    // Every hop trusted: the left-most.
    assert_eq!(client("10.1.1.1, 10.2.2.2"), Some(ip("10.1.1.1")));
    // Ports and IPv6 forms.
    assert_eq!(client("198.51.100.1:4711"), Some(ip("198.51.100.1")));
    assert_eq!(client("[2001:db9::1]:4711"), Some(ip("2001:db9::1")));
    assert_eq!(client("2001:db9::1"), Some(ip("2001:db9::1")));
    // Garbage: the last trusted hop before it, never what the garbage hides.
    assert_eq!(
        client("198.51.100.1, unknown, 10.3.3.3"),
        Some(ip("10.3.3.3"))
    );
    assert_eq!(client("nonsense"), Some(ip("10.9.9.9")));
    // No field: the peer.
    let head = Fields(vec![]);
    let f = Forwarded::resolve(&head, Some(ip("10.9.9.9")), "h", true, 443, &t);
    assert_eq!(f.client, Some(ip("10.9.9.9")));
    assert_eq!(sent(&f)[1], ("x-forwarded-proto".into(), "https".into()));
}

#[test]
fn nothing_is_trusted_by_default_and_mapped_addresses_are_plain_ipv4() {
    let head = Fields(vec![("x-forwarded-for", "1.1.1.1")]);
    let none = ClientAddress::default();
    let f = Forwarded::resolve(&head, Some(ip("::ffff:127.0.0.1")), "h", false, 80, &none);
    assert_eq!(f.client, Some(ip("127.0.0.1")));
    assert_eq!(sent(&f)[0], ("x-forwarded-for".into(), "127.0.0.1".into()));
    let t = trust(&["127.0.0.1"]);
    let f = Forwarded::resolve(&head, Some(ip("::ffff:127.0.0.1")), "h", false, 80, &t);
    assert_eq!(f.client, Some(ip("1.1.1.1")));
}

#[test]
fn fields_are_recognised_in_any_case() {
    for f in FIELDS {
        assert!(is_field(f.as_bytes()));
        assert!(is_field(f.to_ascii_uppercase().as_bytes()));
    }
    assert!(!is_field(b"x-forwarded"));
    assert!(!is_field(b"host"));
    assert!(!is_field(b"x-forwarded-for-real"));
}

#[test]
fn cidr_lists_refuse_what_does_not_parse() {
    assert!(AddressSet::parse(&["10.0.0.0/8", "::1", " 192.0.2.0/24 "]).is_ok());
    for bad in ["10.0.0.0/33", "10.0.0/8", "x", "::/129", "10.0.0.0/-1", ""] {
        assert_eq!(
            AddressSet::parse(&[bad]).unwrap_err().given,
            bad.trim(),
            "{bad}"
        );
    }
}
