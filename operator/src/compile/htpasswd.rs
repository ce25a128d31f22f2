//! htpasswd lists from Secrets, for Basic authentication (Ingress annotations and
//! CoxswainAccessPolicies): the lines the proxy can check, sorted by user, and the ones it
//! cannot, each named by line and user (never by hash).

use coxswain_proxy::auth::{BadLine, Htpasswd};
use k8s_openapi::api::core::v1::Secret;
use std::collections::BTreeMap;

/// How a Secret holds its users.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The key `auth` holds an htpasswd file.
    File,
    /// Every key is a user, its value the hash (ingress-nginx's auth-map).
    Map,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Users {
    /// "user:hash" lines the proxy can check; a user listed twice keeps its first line.
    pub lines: Vec<String>,
    /// Lines the proxy cannot check: their users cannot sign in.
    pub refused: Vec<BadLine>,
}

/// The users of `secret` (named `what` in messages, e.g. "Secret web/users"). Err: why
/// nobody can sign in with it.
pub fn users(secret: &Secret, format: Format, what: &str) -> Result<Users, String> {
    // What the API server stores: `data`, with `stringData` written over it (files given to
    // `coxswain snapshot compile` may still hold `stringData`).
    let mut data: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in secret.data.iter().flatten() {
        if let Ok(text) = String::from_utf8(v.0.clone()) {
            data.insert(k.clone(), text);
        }
    }
    data.extend(secret.string_data.clone().unwrap_or_default());
    let lines: Vec<String> = match format {
        Format::File => data
            .get("auth")
            .ok_or_else(|| {
                format!(
                    "{what} has no text key \"auth\" (an htpasswd file, `htpasswd -c auth USER`)"
                )
            })?
            .lines()
            .map(|l| l.trim_end_matches('\r').to_owned())
            .collect(),
        Format::Map => data
            .iter()
            .map(|(user, hash)| format!("{user}:{}", hash.trim()))
            .collect(),
    };
    let (_, refused) = Htpasswd::parse_lenient(&lines);
    let user = |line: &String| line.split(':').next().unwrap_or_default().to_owned();
    let mut good: Vec<String> = lines
        .into_iter()
        .filter(|l| !l.trim().is_empty() && Htpasswd::parse(&[l.as_str()]).is_ok())
        .collect();
    if good.is_empty() {
        return Err(format!("{what} lists no user the proxy can check"));
    }
    // Stable: a user listed twice keeps its first line, as the proxy would.
    good.sort_by_key(user);
    good.dedup_by(|a, b| user(a) == user(b));
    Ok(Users {
        lines: good,
        refused,
    })
}
