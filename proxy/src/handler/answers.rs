//! The answers the Pingora engine writes itself: statuses, redirects and CORS preflights.

use crate::policy::{CorsPolicy, FieldOp};
use pingora::http::{IntoCaseHeaderName, RequestHeader, ResponseHeader};
use pingora::prelude::Session;
use std::borrow::Cow;

/// The answer to a preflight: 204, with the Access-Control-* headers when the origin is
/// allowed and without them otherwise (the browser then refuses the real request).
pub(super) async fn respond_preflight(
    session: &mut Session,
    cors: &CorsPolicy,
    origin: Option<&str>,
) -> pingora::Result<bool> {
    let mut resp = ResponseHeader::build(204, Some(8))?;
    let req = session.req_header();
    let asked = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
    let fields = cors.preflight_fields(
        origin,
        asked("access-control-request-method"),
        asked("access-control-request-headers"),
    );
    add_fields(&mut resp, fields)?;
    resp.insert_header("content-length", "0")?;
    session.write_response_header(Box::new(resp), true).await?;
    Ok(true)
}

/// Adds a policy's fields to an answer (`policy::PolicyField`).
pub(super) fn add_fields(
    resp: &mut ResponseHeader,
    fields: Vec<crate::policy::PolicyField>,
) -> pingora::Result<()> {
    for (name, value, op) in fields {
        match name {
            Cow::Borrowed(name) => add_field(resp, name, value, op)?,
            Cow::Owned(name) => add_field(resp, name, value, op)?,
        }
    }
    Ok(())
}

fn add_field(
    resp: &mut ResponseHeader,
    name: impl IntoCaseHeaderName,
    value: String,
    op: FieldOp,
) -> pingora::Result<()> {
    match op {
        FieldOp::Set => resp.insert_header(name, value),
        FieldOp::Add => resp.append_header(name, value).map(drop),
    }
}

/// Content-Length, when present and a number.
pub(super) fn content_length(req: &RequestHeader) -> Option<u64> {
    req.headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// A status and no body, with one header field when given (Location, WWW-Authenticate,
/// Retry-After).
pub(super) async fn respond(
    session: &mut Session,
    status: u16,
    field: Option<(&'static str, &str)>,
) -> pingora::Result<bool> {
    let mut resp = ResponseHeader::build(status, Some(2))?;
    if let Some((name, value)) = field {
        resp.insert_header(name, value)?;
    }
    resp.insert_header("content-length", "0")?;
    session.write_response_header(Box::new(resp), true).await?;
    Ok(true)
}

/// 429 from the global rate limit service, with Retry-After and the fields it asked for.
pub(super) async fn respond_limited(
    session: &mut Session,
    retry_after: u64,
    fields: &[(String, String)],
) -> pingora::Result<bool> {
    let mut resp = ResponseHeader::build(429, Some(fields.len() + 2))?;
    for (name, value) in fields {
        resp.append_header(name.clone(), value.as_str())?;
    }
    resp.insert_header("retry-after", retry_after.to_string())?;
    resp.insert_header("content-length", "0")?;
    session.write_response_header(Box::new(resp), true).await?;
    Ok(true)
}

/// An authorization service's refusal, as it answered: status, fields and body.
pub(super) async fn respond_denial(
    session: &mut Session,
    denial: &crate::external_auth::Denial,
) -> pingora::Result<bool> {
    let mut resp = ResponseHeader::build(denial.status, Some(denial.fields.len() + 1))?;
    for (name, value) in &denial.fields {
        resp.append_header(name.clone(), value.as_str())?;
    }
    resp.insert_header("content-length", denial.body.len().to_string())?;
    let body = (!denial.body.is_empty() && session.req_header().method != "HEAD")
        .then(|| denial.body.clone());
    session
        .write_response_header(Box::new(resp), body.is_none())
        .await?;
    if let Some(body) = body {
        session.write_response_body(Some(body), true).await?;
    }
    Ok(true)
}
