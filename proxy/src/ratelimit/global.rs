//! Global rate limits: one count shared by every proxy replica, kept by a rate limit service
//! that speaks Envoy's `envoy.service.ratelimit.v3` protocol (envoyproxy/ratelimit with Redis,
//! Limitador, ...). The proxy keeps no count of its own: it describes each request (the
//! route's descriptors, filled from the request) and asks; `OVER_LIMIT` is answered 429.
//!
//! The service is on the request's path, so it gets a short timeout (100 ms unless the route
//! says otherwise); when it cannot answer, the route's `fail_open` decides: the request goes on
//! (Envoy's default), or it is answered 503.

use crate::addresses::AddressSet;
use crate::callout::{CalloutError, Channels, cluster_endpoint};
use crate::upstream::ClusterState;
use coxswain_api::ratelimit as pb;
use coxswain_api::snapshot as snap;
use snap::rate_limit_descriptor::entry::Source;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// When the snapshot names no timeout: the service is asked on every request's path.
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
/// A descriptor value longer than this is cut: a hostile client's header must not make every
/// call to the service (and the service's keys) large.
const MAX_VALUE: usize = 256;

/// Why the service could not answer.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    #[error(transparent)]
    Callout(#[from] CalloutError),
    #[error("gRPC channel: {0}")]
    Channel(#[from] tonic::transport::Error),
    #[error("gRPC call: {0}")]
    Grpc(#[from] tonic::Status),
    #[error("the service answered code {0}, neither OK nor OVER_LIMIT")]
    Unknown(i32),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the snapshot names service {0:?}, which it does not carry")]
    Missing(Box<str>),
}

/// What the service said of a request.
#[derive(Debug)]
pub enum Outcome {
    Under,
    /// Answer 429; `retry_after` in seconds (from the descriptors' resets, at least 1).
    Over {
        retry_after: u64,
        /// Fields the service asks to add to the answer (X-RateLimit-* and the like).
        fields: Vec<(String, String)>,
    },
    /// The service could not answer: the request goes on or gets 503, as
    /// [`GlobalLimit::fails_open`] says.
    Failed(LimitError),
}

enum Target {
    Cluster(Arc<ClusterState>),
    Missing(Box<str>),
}

enum Value {
    Literal(Box<str>),
    ClientAddress,
    /// A lower-case field name.
    Header(Box<str>),
    Path,
    Method,
}

struct Descriptor {
    entries: Vec<(Box<str>, Value)>,
    limit: Option<pb::rate_limit_descriptor::RateLimitOverride>,
}

/// A route's global rate limit, compiled once per snapshot.
pub struct GlobalLimit {
    target: Target,
    domain: String,
    descriptors: Vec<Descriptor>,
    fail_open: bool,
    timeout: Duration,
    exempt: AddressSet,
    channels: Channels,
}

impl std::fmt::Debug for GlobalLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalLimit")
            .field("service", &self.service())
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

/// The request as descriptors read it.
#[derive(Debug, Clone, Copy)]
pub struct Described<'a> {
    pub client: Option<IpAddr>,
    pub method: &'a str,
    pub path: &'a str,
}

impl GlobalLimit {
    pub fn new(g: &snap::GlobalRateLimit, clusters: &HashMap<Box<str>, Arc<ClusterState>>) -> Self {
        let target = match clusters.get(g.cluster.as_str()) {
            Some(c) if !g.cluster.is_empty() => Target::Cluster(c.clone()),
            _ => Target::Missing(g.cluster.as_str().into()),
        };
        let descriptors = g
            .descriptors
            .iter()
            .map(|d| Descriptor {
                entries: d
                    .entries
                    .iter()
                    .map(|e| {
                        let value = match Source::try_from(e.source).unwrap_or(Source::Value) {
                            Source::Value => Value::Literal(e.value.as_str().into()),
                            Source::ClientAddress => Value::ClientAddress,
                            Source::Header => Value::Header(e.value.to_ascii_lowercase().into()),
                            Source::Path => Value::Path,
                            Source::Method => Value::Method,
                        };
                        (e.key.as_str().into(), value)
                    })
                    .collect(),
                limit: unit(d.unit_seconds).filter(|_| d.requests > 0).map(|unit| {
                    pb::rate_limit_descriptor::RateLimitOverride {
                        requests_per_unit: d.requests,
                        unit: unit as i32,
                    }
                }),
            })
            .collect();
        Self {
            target,
            domain: g.domain.clone(),
            descriptors,
            fail_open: g.fail_open,
            timeout: match g.timeout_ms {
                0 => DEFAULT_TIMEOUT,
                ms => Duration::from_millis(ms),
            },
            exempt: AddressSet::new(&snap::ClientAllowlist {
                cidrs: g.exempt.clone(),
            }),
            channels: Channels::default(),
        }
    }

    /// The service, as logs name it.
    fn service(&self) -> &str {
        match &self.target {
            Target::Cluster(c) => &c.name,
            Target::Missing(name) => name,
        }
    }

    /// What to ask the service about a request: None when nothing is to be counted (an exempt
    /// client, or every descriptor names a field the request lacks). `field`: the request's
    /// first value of a (lower-case) field.
    pub fn request<'h>(
        &self,
        field: impl Fn(&str) -> Option<&'h str>,
        described: Described<'_>,
    ) -> Option<pb::RateLimitRequest> {
        if described
            .client
            .is_some_and(|ip| !self.exempt.is_empty() && self.exempt.allows(ip))
        {
            return None;
        }
        let mut descriptors = Vec::with_capacity(self.descriptors.len());
        'descriptor: for d in &self.descriptors {
            let mut entries = Vec::with_capacity(d.entries.len());
            for (key, value) in &d.entries {
                let value = match value {
                    Value::Literal(v) => v.to_string(),
                    Value::ClientAddress => match described.client {
                        Some(ip) => ip.to_string(),
                        None => continue 'descriptor,
                    },
                    Value::Header(name) => match field(name) {
                        Some(v) => cut(v).to_owned(),
                        // As Envoy's request_headers action: no field, no descriptor.
                        None => continue 'descriptor,
                    },
                    Value::Path => cut(described.path).to_owned(),
                    Value::Method => described.method.to_owned(),
                };
                entries.push(pb::rate_limit_descriptor::Entry {
                    key: key.to_string(),
                    value,
                });
            }
            descriptors.push(pb::RateLimitDescriptor {
                entries,
                limit: d.limit,
            });
        }
        (!descriptors.is_empty()).then(|| pb::RateLimitRequest {
            domain: self.domain.clone(),
            descriptors,
            hits_addend: 1,
        })
    }

    /// Asks the service. Never takes longer than the timeout.
    pub async fn check(&self, request: pb::RateLimitRequest) -> Outcome {
        let asked = async {
            let (addr, tls) = match &self.target {
                Target::Cluster(c) => cluster_endpoint(c)?,
                Target::Missing(name) => return Err(LimitError::Missing(name.clone())),
            };
            let channel = self.channels.get(addr, tls, self.timeout)?;
            let mut client = pb::rate_limit_service_client::RateLimitServiceClient::new(channel);
            Ok(client.should_rate_limit(request).await?.into_inner())
        };
        let answer = match tokio::time::timeout(self.timeout, asked).await {
            Ok(answer) => answer,
            Err(_) => Err(LimitError::Timeout(self.timeout)),
        };
        match answer.and_then(outcome) {
            Ok(outcome) => outcome,
            Err(error) => {
                tracing::warn!(service = self.service(), %error, fail_open = self.fail_open,
                    "the rate limit service could not answer");
                Outcome::Failed(error)
            }
        }
    }

    /// Whether a request goes on when the service cannot answer (else 503).
    pub fn fails_open(&self) -> bool {
        self.fail_open
    }
}

/// Reads the service's answer.
fn outcome(answer: pb::RateLimitResponse) -> Result<Outcome, LimitError> {
    use pb::rate_limit_response::Code;
    match Code::try_from(answer.overall_code) {
        Ok(Code::Ok) => Ok(Outcome::Under),
        Ok(Code::OverLimit) => {
            // The longest wait among the descriptors over their limit; a service that names
            // none gets 1 s, so the client backs off at least a little.
            let wait = answer
                .statuses
                .iter()
                .filter(|s| s.code == Code::OverLimit as i32)
                .filter_map(|s| s.duration_until_reset.as_ref())
                .map(|d| {
                    let secs = u64::try_from(d.seconds).unwrap_or(0);
                    secs + u64::from(d.nanos > 0)
                })
                .max()
                .unwrap_or(1);
            let fields = answer
                .response_headers_to_add
                .into_iter()
                .filter(|h| valid_field(&h.key, &h.value))
                .map(|h| (h.key.to_ascii_lowercase(), h.value))
                .collect();
            Ok(Outcome::Over {
                retry_after: wait.max(1),
                fields,
            })
        }
        _ => Err(LimitError::Unknown(answer.overall_code)),
    }
}

/// A field the service may add to a 429: a token name, a value without control characters,
/// and none of the fields that frame the answer.
fn valid_field(name: &str, value: &str) -> bool {
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    let framing = [
        "content-length",
        "transfer-encoding",
        "connection",
        "retry-after",
    ]
    .iter()
    .any(|f| name.eq_ignore_ascii_case(f));
    token && !framing && !value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f)
}

fn unit(seconds: u32) -> Option<pb::Unit> {
    match seconds {
        1 => Some(pb::Unit::Second),
        60 => Some(pb::Unit::Minute),
        3_600 => Some(pb::Unit::Hour),
        86_400 => Some(pb::Unit::Day),
        _ => None,
    }
}

/// At most [`MAX_VALUE`] bytes, cut on a character boundary.
fn cut(v: &str) -> &str {
    if v.len() <= MAX_VALUE {
        return v;
    }
    let mut end = MAX_VALUE;
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    &v[..end]
}

#[cfg(test)]
mod tests;
