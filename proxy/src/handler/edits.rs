//! What the Pingora engine changes in the request it sends upstream: a rule's or backend's
//! filters, and the body chunks handed to mirrors.

use super::Ctx;
use crate::filters::{self, EditHeaders};
use coxswain_api::snapshot::{self as snap, filter};
use pingora::http::{RequestHeader, ResponseHeader};

/// A rule or backend filter's edits to the request sent upstream.
pub(super) fn apply_request_filter(
    f: &snap::Filter,
    upstream: &mut RequestHeader,
    ctx: &mut Ctx,
) -> pingora::Result<()> {
    match &f.kind {
        Some(filter::Kind::RequestHeaderModifier(m)) => filters::modify_headers(upstream, m),
        Some(filter::Kind::UrlRewrite(r)) => {
            if !r.hostname.is_empty() {
                upstream.insert_header("host", r.hostname.as_str())?;
            }
            let regex = matches!(
                r.path.as_ref().and_then(|p| p.kind.as_ref()),
                Some(snap::path_modifier::Kind::ReplaceRegexMatch(_))
            );
            let new = if regex {
                // Cloned, not taken: a retry starts again from the client's request.
                ctx.regex_rewrite.clone()
            } else {
                r.path.as_ref().map(|m| {
                    let current = upstream.uri.path_and_query().map_or("/", |p| p.as_str());
                    filters::rewrite_path(current, ctx.matched_prefix.as_deref(), m)
                })
            };
            if let Some(new) = new {
                match new.parse() {
                    Ok(uri) => upstream.set_uri(uri),
                    Err(e) => {
                        tracing::warn!(path = %new, error = %e, "rewritten path is not a valid URI")
                    }
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Hands a request body chunk to every mirror without waiting: a mirror whose backlog is full
/// is dropped (its request aborts). Bytes a retry replays are not fed twice.
pub(super) fn feed_mirrors(
    ctx: &mut Ctx,
    start: u64,
    body: Option<&bytes::Bytes>,
    end_of_stream: bool,
) {
    // `body_pos` already counts this chunk; only what no attempt fed before goes out.
    if let Some(b) = body
        && ctx.body_pos > ctx.mirror_fed
    {
        let skip = usize::try_from(ctx.mirror_fed.saturating_sub(start)).unwrap_or(0);
        let fresh = b.slice(skip.min(b.len())..);
        ctx.mirror_fed = ctx.body_pos;
        ctx.mirror_taps
            .retain(|tap| tap.try_send(Some(fresh.clone())).is_ok());
    }
    if end_of_stream {
        for tap in ctx.mirror_taps.drain(..) {
            let _ = tap.try_send(None);
        }
    }
}

impl EditHeaders<'_> for RequestHeader {
    fn set(&mut self, name: &str, value: &str) {
        let _ = self.insert_header(name.to_owned(), value);
    }
    fn add(&mut self, name: &str, value: &str) {
        let _ = self.append_header(name.to_owned(), value);
    }
    fn remove(&mut self, name: &str) {
        let _ = self.remove_header(name);
    }
}

impl EditHeaders<'_> for ResponseHeader {
    fn set(&mut self, name: &str, value: &str) {
        let _ = self.insert_header(name.to_owned(), value);
    }
    fn add(&mut self, name: &str, value: &str) {
        let _ = self.append_header(name.to_owned(), value);
    }
    fn remove(&mut self, name: &str) {
        let _ = self.remove_header(name);
    }
}
