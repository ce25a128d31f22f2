//! Authentication the proxy checks itself: HTTP Basic (RFC 7617) against an htpasswd list.
//!
//! The controller reads the list from a Secret, checks every line and ships it in the route;
//! the proxy turns it into a map of users once per snapshot. Verifying a bcrypt hash costs
//! milliseconds on purpose, so a credential that passed is remembered (the exact
//! `Authorization` value, in a set read with one atomic load): a client that sends the same
//! header on every request pays for the hash once per routing table, not once per request.
//! Wrong credentials are never remembered.

use arc_swap::ArcSwap;
use base64::Engine;
use md5::{Digest, Md5};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Credentials remembered per route at most; past it the set starts again.
const REMEMBERED: usize = 1024;

/// A password hash as htpasswd writes it.
#[derive(Clone, PartialEq, Eq)]
pub enum Hash {
    /// `$2a$`, `$2b$`, `$2y$`: the whole string, as bcrypt reads it.
    Bcrypt(Box<str>),
    /// `$apr1$salt$digest` (Apache's MD5).
    Apr1 { salt: Box<str>, digest: Box<str> },
    /// `{SHA}`: SHA-1 of the password.
    Sha1([u8; 20]),
    /// `{SSHA}`: SHA-1 of the password and the salt, then the salt.
    SaltedSha1 { digest: [u8; 20], salt: Box<[u8]> },
    /// `{PLAIN}`: the password itself.
    Plain(Box<str>),
}

impl std::fmt::Debug for Hash {
    // Never print a hash: logs and panics must not carry what an attacker could crack.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Self::Bcrypt(_) => "bcrypt",
            Self::Apr1 { .. } => "apr1",
            Self::Sha1(_) => "sha1",
            Self::SaltedSha1 { .. } => "ssha",
            Self::Plain(_) => "plain",
        };
        write!(f, "Hash({kind})")
    }
}

/// Why an htpasswd line is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadLine {
    #[error("line {line}: no \"user:hash\"")]
    NoColon { line: usize },
    #[error("line {line}: the user name is empty")]
    EmptyUser { line: usize },
    #[error(
        "line {line} (user {user:?}): crypt(3) DES hashes are not supported (they keep only 8 \
         characters of a password); use bcrypt (htpasswd -B) or MD5 (htpasswd -m)"
    )]
    Des { line: usize, user: String },
    #[error(
        "line {line} (user {user:?}): unknown hash format; use bcrypt (htpasswd -B), MD5 \
         ($apr1$, htpasswd -m), {{SHA}}, {{SSHA}} or {{PLAIN}}"
    )]
    Unknown { line: usize, user: String },
    #[error("line {line} (user {user:?}): malformed {format} hash")]
    Malformed {
        line: usize,
        user: String,
        format: &'static str,
    },
}

impl Hash {
    /// Reads one hash; the error names the format it looked like.
    fn parse(text: &str) -> Result<Self, Option<&'static str>> {
        let b64 = base64::engine::general_purpose::STANDARD;
        if ["$2a$", "$2b$", "$2y$"].iter().any(|p| text.starts_with(p)) {
            // $2?$NN$ and 53 characters of salt and digest.
            if text.len() != 60 {
                return Err(Some("bcrypt"));
            }
            return Ok(Self::Bcrypt(text.into()));
        }
        if let Some(rest) = text.strip_prefix("$apr1$") {
            let (salt, digest) = rest.split_once('$').ok_or(Some("apr1"))?;
            if salt.is_empty() || salt.len() > 8 || digest.len() != 22 {
                return Err(Some("apr1"));
            }
            return Ok(Self::Apr1 {
                salt: salt.into(),
                digest: digest.into(),
            });
        }
        if let Some(rest) = text.strip_prefix("{SHA}") {
            let bytes = b64.decode(rest).map_err(|_| Some("{SHA}"))?;
            return Ok(Self::Sha1(bytes.try_into().map_err(|_| Some("{SHA}"))?));
        }
        if let Some(rest) = text.strip_prefix("{SSHA}") {
            let bytes = b64.decode(rest).map_err(|_| Some("{SSHA}"))?;
            if bytes.len() <= 20 {
                return Err(Some("{SSHA}"));
            }
            let (digest, salt) = bytes.split_at(20);
            return Ok(Self::SaltedSha1 {
                digest: digest.try_into().map_err(|_| Some("{SSHA}"))?,
                salt: salt.into(),
            });
        }
        if let Some(rest) = text.strip_prefix("{PLAIN}") {
            return Ok(Self::Plain(rest.into()));
        }
        Err(None)
    }

    pub fn verify(&self, password: &[u8]) -> bool {
        match self {
            Self::Bcrypt(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            Self::Apr1 { salt, digest } => same(
                apr1(password, salt.as_bytes()).as_bytes(),
                digest.as_bytes(),
            ),
            Self::Sha1(digest) => same(&sha1(&[password]), digest),
            Self::SaltedSha1 { digest, salt } => same(&sha1(&[password, salt]), digest),
            Self::Plain(p) => same(password, p.as_bytes()),
        }
    }
}

/// Compares in time that depends only on the lengths, so a guess learns nothing from timing.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn sha1(parts: &[&[u8]]) -> [u8; 20] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    for p in parts {
        ctx.update(p);
    }
    let mut out = [0u8; 20];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// Apache's MD5 crypt ("$apr1$"): the digest part, 22 characters of crypt's base 64.
fn apr1(password: &[u8], salt: &[u8]) -> String {
    const MAGIC: &[u8] = b"$apr1$";
    let mut alt = Md5::new();
    alt.update(password);
    alt.update(salt);
    alt.update(password);
    let alt = alt.finalize();

    let mut ctx = Md5::new();
    ctx.update(password);
    ctx.update(MAGIC);
    ctx.update(salt);
    for chunk_start in (0..password.len()).step_by(16) {
        ctx.update(&alt[..(password.len() - chunk_start).min(16)]);
    }
    let mut bits = password.len();
    while bits > 0 {
        if bits & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&password[..1]);
        }
        bits >>= 1;
    }
    let mut sum: [u8; 16] = ctx.finalize().into();

    // 1,000 rounds, only to make guessing slower.
    for round in 0..1000 {
        let mut c = Md5::new();
        if round % 2 == 1 {
            c.update(password);
        } else {
            c.update(sum);
        }
        if round % 3 != 0 {
            c.update(salt);
        }
        if round % 7 != 0 {
            c.update(password);
        }
        if round % 2 == 1 {
            c.update(sum);
        } else {
            c.update(password);
        }
        sum = c.finalize().into();
    }

    const ALPHABET: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = String::with_capacity(22);
    let mut put = |mut v: u32, chars: usize| {
        for _ in 0..chars {
            out.push(char::from(ALPHABET[(v & 0x3f) as usize]));
            v >>= 6;
        }
    };
    let s = |i: usize| u32::from(sum[i]);
    for (a, b, c) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        put((s(a) << 16) | (s(b) << 8) | s(c), 4);
    }
    put(s(11), 2);
    out
}

/// htpasswd lines: user to hash. Blank lines and lines starting with '#' are skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Htpasswd {
    users: HashMap<Box<str>, Hash>,
}

impl Htpasswd {
    /// Every line must parse; the errors name each refused line.
    pub fn parse<S: AsRef<str>>(lines: &[S]) -> Result<Self, Vec<BadLine>> {
        let (users, errors) = Self::parse_lenient(lines);
        if errors.is_empty() {
            Ok(users)
        } else {
            Err(errors)
        }
    }

    /// The users whose lines parse, and an error per line that does not (its user cannot sign
    /// in; nobody else is affected). A user listed twice keeps its first line.
    pub fn parse_lenient<S: AsRef<str>>(lines: &[S]) -> (Self, Vec<BadLine>) {
        let mut users = HashMap::new();
        let mut errors = Vec::new();
        let lines = lines.iter().flat_map(|l| l.as_ref().lines());
        for (i, line) in lines.enumerate() {
            let line_no = i + 1;
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((user, hash)) = line.split_once(':') else {
                errors.push(BadLine::NoColon { line: line_no });
                continue;
            };
            if user.is_empty() {
                errors.push(BadLine::EmptyUser { line: line_no });
                continue;
            }
            match Hash::parse(hash) {
                Ok(h) => {
                    users.entry(user.into()).or_insert(h);
                }
                Err(Some(format)) => errors.push(BadLine::Malformed {
                    line: line_no,
                    user: user.into(),
                    format,
                }),
                Err(None) if hash.len() == 13 => errors.push(BadLine::Des {
                    line: line_no,
                    user: user.into(),
                }),
                Err(None) => errors.push(BadLine::Unknown {
                    line: line_no,
                    user: user.into(),
                }),
            }
        }
        (Self { users }, errors)
    }

    pub fn contains(&self, user: &str) -> bool {
        self.users.contains_key(user)
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Whether `user` exists and `password` is its password.
    pub fn verify(&self, user: &str, password: &[u8]) -> bool {
        self.users.get(user).is_some_and(|h| h.verify(password))
    }
}

/// A route's Basic authentication, built once per snapshot.
#[derive(Debug)]
pub struct BasicAuth {
    users: Htpasswd,
    /// The `WWW-Authenticate` value of a 401.
    pub challenge: Box<str>,
    /// `Authorization` values that passed.
    remembered: ArcSwap<HashSet<Box<[u8]>>>,
}

impl BasicAuth {
    /// Lines that do not parse are left out (the controller refuses them before they get
    /// here), so a broken line can only keep someone out, never let someone in.
    pub fn new(realm: &str, lines: &[String]) -> Self {
        let (users, _) = Htpasswd::parse_lenient(lines);
        // A quote or backslash would end the quoted string early.
        let realm: String = realm
            .chars()
            .filter(|c| !matches!(c, '"' | '\\') && !c.is_control())
            .collect();
        Self {
            users,
            challenge: format!("Basic realm=\"{realm}\"").into(),
            remembered: ArcSwap::default(),
        }
    }

    /// Whether a request's `Authorization` value names a user and its password.
    pub fn allows(&self, authorization: Option<&[u8]>) -> bool {
        let Some(value) = authorization.map(<[u8]>::trim_ascii) else {
            return false;
        };
        if self.remembered.load().contains(value) {
            return true;
        }
        let Some(ok) = self.check(value) else {
            return false;
        };
        if ok {
            self.remembered.rcu(|set| {
                let mut set = if set.len() >= REMEMBERED {
                    HashSet::new()
                } else {
                    HashSet::clone(set)
                };
                set.insert(value.into());
                Arc::new(set)
            });
        }
        ok
    }

    fn check(&self, value: &[u8]) -> Option<bool> {
        let (scheme, token) = value.split_at_checked(6)?;
        if !scheme.eq_ignore_ascii_case(b"basic ") {
            return None;
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(token.trim_ascii())
            .ok()?;
        let colon = decoded.iter().position(|b| *b == b':')?;
        let user = std::str::from_utf8(&decoded[..colon]).ok()?;
        Some(self.users.verify(user, &decoded[colon + 1..]))
    }
}

#[cfg(test)]
mod tests;
