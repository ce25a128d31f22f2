//! Incremental compile: a [`Compiler`] the controller keeps across passes compiles again only
//! the routes whose input changed, and gives the same output as [`super::compile`], byte for
//! byte (tested on random change sequences, `tests/incremental.rs`).
//!
//! A route's part of a pass depends on the route, the Gateways it can attach to, the listeners
//! a route of the other kind took from it, and what resolving its backendRefs read:
//! ReferenceGrants, the Service, its EndpointSlices and the BackendTLSPolicy of the port. The
//! first three are compared directly; the reads are recorded while the route compiles
//! ([`super::memo::Read`]) and looked up again. A route is told by its uid and generation
//! ([`super::route::Stored`]), so a status write changes nothing; Services and EndpointSlices
//! by identity (the store shares the reflector's `Arc`s; the memo holds them weakly).
//!
//! What a route keeps is small ([`super::memo`]): its entries hold their routes encoded
//! ([`super::encode`]), and what routes share (clusters, reads, listeners, status parents)
//! is kept once.
//!
//! A pass costs what changed, not every route:
//! - the memo remembers where the last pass met each route and the address of its object, so
//!   an unchanged route is known by comparing two addresses, without reading its key;
//! - what the routes add up to (status decisions, attachment counts, the Services each
//!   Gateway's routes send to, clusters) is kept as totals ([`super::totals`]) that changed
//!   routes are counted out of and into; the status maps are persistent, so each pass's
//!   decisions are a copy made in constant time;
//! - when none of the lists a route's reads look at changed (they are persistent vectors,
//!   compared by identity: [`super::memo::ReadInputs`]), no read is looked up again;
//! - the assembler keeps every port's virtual hosts and is given only the entries gone and
//!   new ([`super::assemble::Entries::Changes`]), and makes again only the hosts those are
//!   in. While an access policy or a Gateway's backend client certificate rewrites entries,
//!   it is given every entry and compares them with the last pass's instead;
//! - each virtual host keeps its encoding, and each cluster its encoding while it is the
//!   same `Arc`, so sealing a snapshot is copying bytes and hashing them.
//!
//! Gateways, Ingresses, policies, the index of Services and the snapshots' hash are done in
//! full each pass; a change to the Gateways or the configuration drops every kept route.

use super::assemble::Assembly;
use super::gateway::ServedGateway;
use super::memo::RouteMemo;
use super::status::ObjectKey;
use super::store::Store;
use super::{Compiled, Config};
use std::collections::BTreeMap;

/// Compiles like [`super::compile`], keeping each route's part for the next pass.
#[derive(Debug, Default)]
pub struct Compiler {
    routes: RouteMemo,
    /// Every port's virtual hosts as the last pass assembled them.
    assembly: Assembly,
    /// The Gateways (as routes see them) and configuration the kept routes compiled against.
    against: Option<(BTreeMap<ObjectKey, ServedGateway>, Config)>,
}

/// Routes compiled and reused, over a compiler's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reuse {
    pub compiled: u64,
    pub reused: u64,
}

impl Compiler {
    pub fn compile(&mut self, store: &Store, config: &Config) -> Compiled {
        let before = self.reuse();
        let compiled = super::compile_with(store, config, Some(self));
        self.routes.tidy();
        let after = self.reuse();
        tracing::debug!(
            routes_compiled = after.compiled - before.compiled,
            routes_reused = after.reused - before.reused,
            "incremental compile"
        );
        compiled
    }

    pub fn reuse(&self) -> Reuse {
        Reuse {
            compiled: self.routes.compiled,
            reused: self.routes.reused,
        }
    }

    /// Routes whose last part is kept.
    pub fn kept_routes(&self) -> usize {
        self.routes.len()
    }

    /// The kept routes, valid for `served` and `config` (dropped when those changed), and the
    /// kept assembly (valid for any input: it compares entries by identity).
    pub(super) fn kept_for(
        &mut self,
        served: &BTreeMap<ObjectKey, ServedGateway>,
        config: &Config,
    ) -> (&mut RouteMemo, &mut Assembly) {
        let same = self
            .against
            .as_ref()
            .is_some_and(|(s, c)| s == served && c == config);
        if !same {
            self.routes.clear();
            self.against = Some((served.clone(), config.clone()));
        }
        (&mut self.routes, &mut self.assembly)
    }
}
