//! A CoxswainAccessPolicy's `globalRateLimit`: the rate limit service's cluster and the
//! descriptors each request is described with (Envoy's `envoy.service.ratelimit.v3`).
//!
//! Every request carries the entry `coxswain_policy: <namespace>/<name>` first, so the
//! service's keys never mix two policies, then the key's entry: `remote_address` (the client),
//! or the header's lower-case name (its value). With `requests` set, the limit travels as the
//! descriptor's override and the service needs no configuration per key.

use super::refs::Index;
use super::status::ObjectKey;
use coxswain_api::crd::accesspolicy::{FailureMode, GlobalRateLimit, RateLimitKeyType, RateUnit};
use coxswain_api::snapshot as snap;
use snap::rate_limit_descriptor::{Entry, entry::Source};

/// The domain when the policy names none.
pub const DEFAULT_DOMAIN: &str = "coxswain";
/// The descriptor entry naming the policy.
pub const POLICY_KEY: &str = "coxswain_policy";
/// The descriptor entry naming the client, as Envoy's remote_address action does.
pub const CLIENT_KEY: &str = "remote_address";

/// What a policy's global limit compiles to.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub limit: snap::GlobalRateLimit,
    /// The service's cluster, for the snapshots of the routes that use it.
    pub cluster: Option<snap::Cluster>,
    /// Set when the service cannot be used: requests then go on or get 503 as the failure
    /// mode says; the policy reports it.
    pub problem: Option<String>,
}

/// The policy's global limit, or why its settings are refused (the policy is then Invalid and
/// holds nothing).
pub fn compile(g: &GlobalRateLimit, index: &Index<'_>, me: &ObjectKey) -> Result<Compiled, String> {
    let mut exempt = Vec::new();
    for block in &g.exempt {
        let cidr = super::annotations::parse_cidr(block.trim())
            .map_err(|why| format!("globalRateLimit.exempt: {why}"))?;
        exempt.push(snap::Cidr {
            address: cidr.addr.to_string(),
            prefix_len: u32::from(cidr.prefix),
        });
    }
    exempt.sort_by(|a, b| (&a.address, a.prefix_len).cmp(&(&b.address, b.prefix_len)));
    exempt.dedup();
    let mut entries = vec![Entry {
        key: POLICY_KEY.into(),
        source: Source::Value as i32,
        value: format!("{}/{}", me.namespace, me.name),
    }];
    match g
        .key
        .as_ref()
        .map_or(RateLimitKeyType::ClientAddress, |k| k.type_)
    {
        RateLimitKeyType::ClientAddress => entries.push(Entry {
            key: CLIENT_KEY.into(),
            source: Source::ClientAddress as i32,
            value: String::new(),
        }),
        RateLimitKeyType::Header => {
            let header = g
                .key
                .as_ref()
                .and_then(|k| k.header.as_deref())
                .map(str::to_ascii_lowercase)
                .ok_or("globalRateLimit.key: type Header needs header")?;
            entries.push(Entry {
                key: header.clone(),
                source: Source::Header as i32,
                value: header,
            });
        }
        RateLimitKeyType::Route => {}
    }
    let unit_seconds = match g.unit.unwrap_or_default() {
        RateUnit::Second => 1,
        RateUnit::Minute => 60,
        RateUnit::Hour => 3_600,
        RateUnit::Day => 86_400,
    };
    let service = &g.service;
    let (cluster, problem) = match index.cluster(&me.namespace, &service.name, service.port) {
        Some(c) => (Some(c), None),
        None => {
            let what = if index.service(&me.namespace, &service.name).is_none() {
                format!(
                    "rate limit Service {}/{} not found",
                    me.namespace, service.name
                )
            } else {
                format!(
                    "rate limit Service {}/{} has no port {}",
                    me.namespace, service.name, service.port
                )
            };
            (None, Some(what))
        }
    };
    let fail_open = g.failure_mode.unwrap_or_default() == FailureMode::Open;
    let problem = problem.map(|p| {
        let meanwhile = if fail_open {
            "requests go on uncounted (failureMode Open)"
        } else {
            "requests are answered 503 (failureMode Closed)"
        };
        format!("{p}; {meanwhile} until it exists")
    });
    Ok(Compiled {
        limit: snap::GlobalRateLimit {
            cluster: cluster.as_ref().map(|c| c.name.clone()).unwrap_or_default(),
            domain: g.domain.clone().unwrap_or_else(|| DEFAULT_DOMAIN.into()),
            descriptors: vec![snap::RateLimitDescriptor {
                entries,
                requests: g.requests.unwrap_or(0),
                unit_seconds: if g.requests.is_some() {
                    unit_seconds
                } else {
                    0
                },
            }],
            fail_open,
            timeout_ms: g.timeout_milliseconds.map_or(0, u64::from),
            exempt,
        },
        cluster,
        problem,
    })
}
