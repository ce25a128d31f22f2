use super::*;

// Written by `openssl passwd -apr1 -salt SALT PASSWORD` and `openssl dgst -sha1 -binary | base64`.
const APR1: &str = "$apr1$r31Jzq3U$oriiaS31APatLwvTBKE3D.";
const APR1_SHORT_SALT: &str = "$apr1$x$ya00XvwA0viq10Nb5bv6L.";
const APR1_LONG_PASSWORD: &str = "$apr1$12345678$aCoQ4OOzW0ayQ58.XIUNm0";
const SHA: &str = "{SHA}L55TUjtiq8FBorTWAZ0jy6g129A=";
// SHA-1 of "correct horse" + "salt", then "salt".
const SSHA: &str = "{SSHA}LhKrkM9Fy+zlstjdD7Kv2s6QvhBzYWx0";

fn header(user: &str, password: &str) -> Vec<u8> {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {token}").into_bytes()
}

#[test]
fn every_supported_format_accepts_its_password_and_nothing_else() {
    let bcrypt = bcrypt::hash("correct horse", 4).expect("hash");
    let lines = vec![
        format!("md5:{APR1}"),
        format!("sha:{SHA}"),
        format!("ssha:{SSHA}"),
        "plain:{PLAIN}correct horse".to_owned(),
        format!("bcrypt:{bcrypt}"),
        format!("b2y:{}", bcrypt.replacen("$2b$", "$2y$", 1)),
    ];
    let users = Htpasswd::parse(&lines).expect("all valid");
    assert_eq!(users.len(), 6);
    for user in ["md5", "sha", "ssha", "plain", "bcrypt", "b2y"] {
        assert!(users.verify(user, b"correct horse"), "{user}");
        assert!(!users.verify(user, b"correct horsE"), "{user}");
        assert!(!users.verify(user, b""), "{user}");
    }
    assert!(!users.verify("nobody", b"correct horse"));
}

#[test]
fn apache_md5_matches_openssl_for_short_salts_and_long_passwords() {
    let users = Htpasswd::parse(&[
        format!("a:{APR1_SHORT_SALT}"),
        format!("b:{APR1_LONG_PASSWORD}"),
    ])
    .expect("valid");
    assert!(users.verify("a", b"p"));
    assert!(users.verify("b", b"longer password than sixteen bytes!"));
    assert!(!users.verify("b", b"longer password than sixteen bytes?"));
}

#[test]
fn bad_lines_are_named_with_their_line_and_user() {
    let errors = Htpasswd::parse(&[
        "# a comment\n\nnocolon\n:{PLAIN}x\ndes:abJnggxhB/yWI\nodd:$6$salt$x\nshort:$apr1$x$abc\nsha:{SHA}bm90IDIwIGJ5dGVz",
    ])
    .expect_err("every line but the comment is bad");
    assert_eq!(
        errors,
        vec![
            BadLine::NoColon { line: 3 },
            BadLine::EmptyUser { line: 4 },
            BadLine::Des {
                line: 5,
                user: "des".into()
            },
            BadLine::Unknown {
                line: 6,
                user: "odd".into()
            },
            BadLine::Malformed {
                line: 7,
                user: "short".into(),
                format: "apr1"
            },
            BadLine::Malformed {
                line: 8,
                user: "sha".into(),
                format: "{SHA}"
            },
        ]
    );
    let text = errors[2].to_string();
    assert!(text.contains("htpasswd -B"), "{text}");
}

#[test]
fn hashes_are_never_printed() {
    let users = Htpasswd::parse(&[format!("u:{SHA}")]).expect("valid");
    let printed = format!("{users:?}");
    assert!(!printed.contains("L55T"), "{printed}");
}

#[test]
fn the_authorization_header_is_read_as_rfc_7617_says() {
    let auth = BasicAuth::new("Staff \"only\"", &[format!("alice:{APR1}")]);
    assert_eq!(&*auth.challenge, "Basic realm=\"Staff only\"");
    assert!(auth.allows(Some(&header("alice", "correct horse"))));
    // The scheme is case-insensitive; the password may contain colons.
    let lower = header("alice", "correct horse").to_ascii_lowercase();
    let token = &header("alice", "correct horse")[6..];
    assert!(auth.allows(Some(&[b"bAsIc ".as_slice(), token].concat())));
    assert!(
        !auth.allows(Some(&lower)),
        "the token itself is case-sensitive"
    );
    assert!(!auth.allows(None));
    assert!(!auth.allows(Some(b"Basic")));
    assert!(!auth.allows(Some(b"Basic !!!not base64")));
    assert!(!auth.allows(Some(b"Bearer abc")));
    assert!(!auth.allows(Some(&header("alice", "wrong"))));
    assert!(!auth.allows(Some(&header("bob", "correct horse"))));

    let colon = BasicAuth::new("r", &["c:{PLAIN}a:b".to_owned()]);
    assert!(colon.allows(Some(&header("c", "a:b"))));
}

#[test]
fn a_passing_credential_is_remembered_and_a_failing_one_is_not() {
    let auth = BasicAuth::new("r", &[format!("alice:{APR1}")]);
    let good = header("alice", "correct horse");
    let bad = header("alice", "guess");
    assert!(!auth.allows(Some(&bad)));
    assert!(auth.remembered.load().is_empty());
    assert!(auth.allows(Some(&good)));
    assert!(auth.remembered.load().contains(good.as_slice()));
    assert_eq!(auth.remembered.load().len(), 1);
}

#[test]
fn broken_lines_keep_out_only_their_own_user() {
    let auth = BasicAuth::new("r", &[format!("alice:{APR1}\nbob:garbage")]);
    assert!(auth.allows(Some(&header("alice", "correct horse"))));
    assert!(!auth.allows(Some(&header("bob", "garbage"))));
}
