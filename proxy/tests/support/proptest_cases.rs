//! Case counts for the property tests: `make fuzz` raises them through PROPTEST_CASES.

use proptest::prelude::ProptestConfig;

/// `default` cases, or PROPTEST_CASES when set.
pub fn cases(default: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(default),
        ..ProptestConfig::default()
    }
}
