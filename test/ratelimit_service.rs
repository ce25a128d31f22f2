//! A small rate limit service speaking Envoy's `envoy.service.ratelimit.v3`, for tests: what
//! envoyproxy/ratelimit does with Redis, in one process. Each descriptor (its entries, in
//! order) is a key with a fixed window, as envoyproxy/ratelimit counts; the window of a key
//! starts at its first hit, so a test that runs for N windows counts exactly N of them. The
//! limit is the descriptor's override; a descriptor without one is not limited.
//! Shared by the proxy's and the controller's tests through `#[path]`.
#![allow(dead_code, clippy::unwrap_used)]

use coxswain_api::ratelimit as pb;
use pb::rate_limit_response::{Code, DescriptorStatus};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Counts {
    /// Per key: (window start, hits in it).
    windows: HashMap<Vec<(String, String)>, (Instant, u32)>,
    /// Every request, in arrival order.
    asked: Vec<pb::RateLimitRequest>,
}

#[derive(Clone, Default)]
pub struct RateLimitService {
    counts: Arc<Mutex<Counts>>,
}

impl RateLimitService {
    /// Serves on a loopback port of its own until the test ends.
    pub async fn start() -> (Self, SocketAddr) {
        let service = Self::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(pb::rate_limit_service_server::RateLimitServiceServer::new(
                    service.clone(),
                ))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (service, addr)
    }

    /// The requests asked so far.
    pub fn asked(&self) -> Vec<pb::RateLimitRequest> {
        self.counts.lock().unwrap().asked.clone()
    }

    /// Forgets every window and request.
    pub fn reset(&self) {
        *self.counts.lock().unwrap() = Counts::default();
    }
}

fn window(unit: i32) -> Option<Duration> {
    match pb::Unit::try_from(unit).ok()? {
        pb::Unit::Second => Some(Duration::from_secs(1)),
        pb::Unit::Minute => Some(Duration::from_secs(60)),
        pb::Unit::Hour => Some(Duration::from_secs(3_600)),
        pb::Unit::Day => Some(Duration::from_secs(86_400)),
        _ => None,
    }
}

#[tonic::async_trait]
impl pb::rate_limit_service_server::RateLimitService for RateLimitService {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<pb::RateLimitRequest>,
    ) -> Result<tonic::Response<pb::RateLimitResponse>, tonic::Status> {
        let request = request.into_inner();
        let now = Instant::now();
        let mut counts = self.counts.lock().unwrap();
        counts.asked.push(request.clone());
        let hits = request.hits_addend.max(1);
        let mut statuses = Vec::new();
        for d in &request.descriptors {
            let Some((limit, length)) = d
                .limit
                .as_ref()
                .and_then(|l| Some((l.requests_per_unit, window(l.unit)?)))
            else {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                });
                continue;
            };
            let key: Vec<(String, String)> = d
                .entries
                .iter()
                .map(|e| (e.key.clone(), e.value.clone()))
                .collect();
            let (start, used) = counts.windows.entry(key).or_insert((now, 0));
            // Whole windows since the key's first hit: the one `now` falls in.
            let elapsed = now.duration_since(*start);
            if elapsed >= length {
                let windows = (elapsed.as_nanos() / length.as_nanos()) as u32;
                *start += length * windows;
                *used = 0;
            }
            *used += hits;
            let reset = length.saturating_sub(now.duration_since(*start));
            statuses.push(DescriptorStatus {
                code: if *used > limit {
                    Code::OverLimit
                } else {
                    Code::Ok
                } as i32,
                current_limit: Some(pb::rate_limit_response::RateLimit {
                    name: String::new(),
                    requests_per_unit: limit,
                    unit: d.limit.as_ref().map_or(0, |l| l.unit),
                }),
                limit_remaining: limit.saturating_sub(*used),
                duration_until_reset: Some(pb::Duration {
                    seconds: reset.as_secs() as i64,
                    nanos: reset.subsec_nanos() as i32,
                }),
            });
        }
        let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
        let limit = statuses
            .iter()
            .filter_map(|s| s.current_limit.as_ref())
            .map(|l| l.requests_per_unit)
            .min();
        Ok(tonic::Response::new(pb::RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            response_headers_to_add: limit
                .filter(|_| over)
                .map(|l| pb::HeaderValue {
                    key: "X-RateLimit-Limit".into(),
                    value: l.to_string(),
                })
                .into_iter()
                .collect(),
            statuses,
            request_headers_to_add: Vec::new(),
        }))
    }
}
