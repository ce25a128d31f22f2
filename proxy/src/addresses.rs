//! Sets of address blocks, checked with a mask and a compare per block: route allowlists,
//! rate-limit exemptions, and the proxies trusted to say who the client is.

use coxswain_api::snapshot as snap;
use std::net::IpAddr;

/// Address blocks as (network, mask) integers: a route's client allowlist, or the proxies
/// trusted to say who the client is.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AddressSet {
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

/// A CIDR that does not parse, with what was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not an address block like 10.0.0.0/8 or 2001:db8::/32 (or one address)")]
pub struct BadCidr {
    pub given: String,
}

impl AddressSet {
    /// Entries that do not parse are dropped: a broken entry can only deny, never allow.
    pub fn new(list: &snap::ClientAllowlist) -> Self {
        let mut out = Self::default();
        for c in &list.cidrs {
            if let Ok(addr) = c.address.parse::<IpAddr>() {
                out.insert(addr, c.prefix_len);
            }
        }
        out
    }

    /// Blocks written as "10.0.0.0/8", "2001:db8::/32" or a single address; any entry that
    /// does not parse is an error (these lists widen trust, so none is skipped silently).
    pub fn parse<S: AsRef<str>>(blocks: &[S]) -> Result<Self, BadCidr> {
        let mut out = Self::default();
        for block in blocks {
            let given = block.as_ref().trim();
            let bad = || BadCidr {
                given: given.to_owned(),
            };
            let (addr, len) = match given.split_once('/') {
                Some((a, l)) => (
                    a.parse::<IpAddr>().map_err(|_| bad())?,
                    Some(l.parse::<u32>().map_err(|_| bad())?),
                ),
                None => (given.parse::<IpAddr>().map_err(|_| bad())?, None),
            };
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let len = len.unwrap_or(max);
            if len > max {
                return Err(bad());
            }
            out.insert(addr, len);
        }
        Ok(out)
    }

    fn insert(&mut self, addr: IpAddr, prefix_len: u32) {
        match addr {
            IpAddr::V4(a) if prefix_len <= 32 => {
                let mask = u32::MAX.checked_shl(32 - prefix_len).unwrap_or(0);
                self.v4.push((u32::from(a) & mask, mask));
            }
            IpAddr::V6(a) if prefix_len <= 128 => {
                let mask = u128::MAX.checked_shl(128 - prefix_len).unwrap_or(0);
                self.v6.push((u128::from(a) & mask, mask));
            }
            _ => {}
        }
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    pub fn allows(&self, ip: IpAddr) -> bool {
        // An IPv4 client on a dual-stack socket shows up as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match ip {
            IpAddr::V4(a) => {
                let a = u32::from(a);
                self.v4.iter().any(|(net, mask)| a & mask == *net)
            }
            IpAddr::V6(a) => {
                let a = u128::from(a);
                self.v6.iter().any(|(net, mask)| a & mask == *net)
            }
        }
    }
}
