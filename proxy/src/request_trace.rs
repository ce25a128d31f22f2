//! A request's span, filled the same way whichever engine serves the request. Both engines
//! get the request's trace context from `request::forwarded` (which also makes the
//! `traceparent` the backend receives), call [`span`] once the request is routed, and finish
//! the span when its status is known.

use crate::forwarded::Forwarded;
use crate::head::Head;
use crate::limits::Limits;
use crate::request::{Arrival, Checked};
use crate::router::CompiledRoute;
use crate::trace::{RequestFields, RequestSpan, known_method};

/// The request's span: None when tracing is off or the request is not sampled.
pub fn span<H: Head + ?Sized>(
    limits: &Limits,
    forwarded: &Forwarded<'_>,
    head: &H,
    checked: &Checked<'_>,
    arrival: &Arrival<'_>,
    route: Option<&CompiledRoute>,
) -> Option<RequestSpan> {
    let tracer = limits.tracer.as_ref()?;
    let begun = forwarded.trace.as_ref()?;
    tracer.request_span(begun, || RequestFields {
        method: known_method(head.method()),
        https: arrival.https,
        path: checked.path().to_owned(),
        port: arrival.port,
        client: arrival.client,
        route: route.map(|r| r.route.clone()),
    })
}
