//! Hostname matching and intersection, as the Gateway API defines them (GEP-2016/HTTPRoute
//! `spec.hostnames`): a leading `*.` label matches one or more labels, never the bare suffix.

use std::cmp::Ordering;

/// Whether `pattern` (exact or `*.suffix`) covers `host` (exact or wildcard).
/// A wildcard host is covered when every name it matches is matched by `pattern`.
pub fn covers(pattern: &str, host: &str) -> bool {
    match (pattern.strip_prefix("*."), host.strip_prefix("*.")) {
        (None, None) => pattern.eq_ignore_ascii_case(host),
        (None, Some(_)) => false,
        (Some(suffix), None) => has_label_suffix(host, suffix),
        (Some(suffix), Some(inner)) => {
            inner.eq_ignore_ascii_case(suffix) || has_label_suffix(inner, suffix)
        }
    }
}

/// `host` ends with `.suffix` and has at least one label before it.
fn has_label_suffix(host: &str, suffix: &str) -> bool {
    host.len() > suffix.len() + 1
        && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
        && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
}

/// The hostnames a route serves on a listener: the intersection of the listener's hostname
/// (None: any) and the route's hostname. None when they do not intersect.
pub fn intersect(listener: Option<&str>, route: &str) -> Option<String> {
    let Some(listener) = listener else {
        return Some(route.to_ascii_lowercase());
    };
    if covers(listener, route) {
        Some(route.to_ascii_lowercase())
    } else if covers(route, listener) {
        Some(listener.to_ascii_lowercase())
    } else {
        None
    }
}

/// Specificity order of virtual host names: exact names first, then wildcards with the longest
/// suffix, then the catch-all "". Used to sort and to pick the most specific listener.
pub fn specificity(a: &str, b: &str) -> Ordering {
    fn rank(h: &str) -> (u8, std::cmp::Reverse<usize>) {
        if h.is_empty() {
            (2, std::cmp::Reverse(0))
        } else if h.starts_with("*.") {
            (1, std::cmp::Reverse(h.len()))
        } else {
            (0, std::cmp::Reverse(h.len()))
        }
    }
    rank(a).cmp(&rank(b))
}

/// Whether a virtual host name (exact, wildcard or "") is covered by a listener hostname
/// (None: any).
pub fn listener_covers(listener: Option<&str>, vhost: &str) -> bool {
    match listener {
        None => true,
        Some(_) if vhost.is_empty() => false,
        Some(l) => covers(l, vhost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Gateway API spec, Listener.hostname: "*.example.com" matches "test.example.com" and
    // "foo.test.example.com", but not "example.com".
    #[test]
    fn wildcard_matches_one_or_more_labels_not_the_suffix() {
        assert!(covers("*.example.com", "test.example.com"));
        assert!(covers("*.example.com", "foo.test.example.com"));
        assert!(!covers("*.example.com", "example.com"));
        assert!(!covers("*.example.com", "testexample.com"));
        assert!(covers("*.example.com", "*.foo.example.com"));
        assert!(!covers("foo.example.com", "*.example.com"));
    }

    // HTTPRoute.spec.hostnames: a route hostname and a listener hostname intersect when one
    // covers the other; the more specific one is what the route serves.
    #[test]
    fn intersection_is_the_more_specific_name() {
        assert_eq!(
            intersect(None, "a.example.com").as_deref(),
            Some("a.example.com")
        );
        assert_eq!(
            intersect(Some("*.example.com"), "a.example.com").as_deref(),
            Some("a.example.com")
        );
        assert_eq!(
            intersect(Some("a.example.com"), "*.example.com").as_deref(),
            Some("a.example.com")
        );
        assert_eq!(
            intersect(Some("*.example.com"), "*.bar.example.com").as_deref(),
            Some("*.bar.example.com")
        );
        assert_eq!(intersect(Some("a.example.com"), "b.example.com"), None);
        assert_eq!(intersect(Some("*.example.com"), "example.com"), None);
        assert_eq!(
            intersect(Some("A.Example.com"), "a.example.COM").as_deref(),
            Some("a.example.com")
        );
    }

    #[test]
    fn specificity_orders_exact_then_longest_wildcard_then_any() {
        let mut hosts = vec!["", "*.com", "a.example.com", "*.example.com"];
        hosts.sort_by(|a, b| specificity(a, b));
        assert_eq!(hosts, ["a.example.com", "*.example.com", "*.com", ""]);
    }
}
