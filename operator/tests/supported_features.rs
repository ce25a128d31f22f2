//! The GatewayClass's `status.supportedFeatures` (SUPPORTED_FEATURES) is exactly what the
//! committed conformance report for the pinned Gateway API release shows passing: a feature
//! added to the list without a report that proves it, or proven by a report but left out of
//! the list, fails here. The report is what `make conformance` writes under
//! test/conformance/reports/<release>/coxswain/.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use coxswain_operator::status::{SUPPORTED_FEATURES, class_features};
use serde_yaml::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Core features of each Gateway profile (conformance/utils/suite/profiles.go): the report
/// lists only extended ones, a profile whose core tests all pass supports these.
const PROFILE_CORE: &[(&str, &[&str])] = &[
    ("GATEWAY-HTTP", &["Gateway", "ReferenceGrant", "HTTPRoute"]),
    ("GATEWAY-GRPC", &["Gateway", "ReferenceGrant", "GRPCRoute"]),
    ("GATEWAY-TLS", &["Gateway", "ReferenceGrant", "TLSRoute"]),
];

/// Features in no profile's extended set, so no report lists them; the suite still runs their
/// tests when the GatewayClass claims them: (feature, that test's ShortName). Up to v1.5 the
/// report named such a test under succeededProvisionalTests; v1.6 made GRPCRouteNamedRule a
/// regular test, whose pass only the suite's output shows, so run.sh keeps the names of the
/// tests that passed beside the report (`*-passed-tests.txt`).
const OUTSIDE_PROFILES: &[(&str, &str)] = &[("GRPCRouteNamedRouteRule", "GRPCRouteNamedRule")];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// "v1.5.1" -> (1, 5, 1); None for anything else.
fn release(name: &str) -> Option<(u64, u64, u64)> {
    let mut parts = name.strip_prefix('v')?.split('.');
    let v = (
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
    );
    parts.next().is_none().then_some(v)
}

/// The Gateway API release hack/cluster installs and `make conformance` tests against.
fn pinned_release() -> String {
    let env = std::fs::read_to_string(repo().join("hack/cluster/env.sh")).unwrap();
    env.lines()
        .find_map(|l| l.trim().strip_prefix("export GATEWAY_API_VERSION="))
        .map(|v| v.trim_matches('"').to_owned())
        .expect("hack/cluster/env.sh exports GATEWAY_API_VERSION")
}

/// The newest release directory under test/conformance/reports and its default-run report
/// files: the run with a dedicated proxy per Gateway, what a class with a parametersRef
/// publishes.
fn newest_reports() -> (String, Vec<PathBuf>) {
    newest_reports_of("-default-report.yaml")
}

/// The newest release directory holding reports whose names end in `suffix`, and those.
fn newest_reports_of(suffix: &str) -> (String, Vec<PathBuf>) {
    let dir = repo().join("test/conformance/reports");
    let mut releases: Vec<((u64, u64, u64), String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|name| release(&name).map(|v| (v, name)))
        .collect();
    releases.sort();
    assert!(
        !releases.is_empty(),
        "no vX.Y.Z directory under {}",
        dir.display()
    );
    for (_, newest) in releases.into_iter().rev() {
        let mut files = Vec::new();
        for implementation in std::fs::read_dir(dir.join(&newest)).unwrap() {
            let implementation = implementation.unwrap().path();
            if !implementation.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&implementation).unwrap() {
                let f = f.unwrap().path();
                if f.file_name()
                    .is_some_and(|n| n.to_string_lossy().ends_with(suffix))
                {
                    files.push(f);
                }
            }
        }
        if !files.is_empty() {
            files.sort();
            return (newest, files);
        }
    }
    panic!("no *{suffix} under {}", dir.display())
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// What one report shows passing, and what it shows unsupported.
fn claims(path: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let report: Value = serde_yaml::from_str(&text).unwrap();
    let what = path.display();
    let mut passed = BTreeSet::new();
    let mut unsupported = BTreeSet::new();
    let profiles = report["profiles"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    assert!(!profiles.is_empty(), "{what}: no profiles");
    for p in &profiles {
        let name = p["name"].as_str().unwrap_or_default();
        for part in ["core", "extended"] {
            assert_eq!(
                p[part]["result"].as_str(),
                Some("success"),
                "{what}: {name} {part} did not succeed: its features are not proven"
            );
        }
        let core = PROFILE_CORE
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{what}: profile {name} is not one Coxswain runs"));
        passed.extend(core.1.iter().map(|f| (*f).to_owned()));
        passed.extend(strings(&p["extended"]["supportedFeatures"]));
        unsupported.extend(strings(&p["extended"]["unsupportedFeatures"]));
    }
    let mut shown_passing = strings(&report["succeededProvisionalTests"]);
    shown_passing.extend(passed_tests(path));
    for (feature, test) in OUTSIDE_PROFILES {
        if shown_passing.iter().any(|t| t == test) {
            passed.insert((*feature).to_owned());
        }
    }
    (passed, unsupported)
}

/// The tests run.sh saw pass in the run that wrote `report` (one ShortName a line), from the
/// file beside it; none when there is no such file (reports before v1.6).
fn passed_tests(report: &Path) -> Vec<String> {
    let name = report.to_string_lossy();
    let Some(stem) = name.strip_suffix("-report.yaml") else {
        return Vec::new();
    };
    std::fs::read_to_string(format!("{stem}-passed-tests.txt"))
        .map(|text| text.lines().map(|l| l.trim().to_owned()).collect())
        .unwrap_or_default()
}

#[test]
fn supported_features_are_exactly_what_the_newest_conformance_report_shows_passing() {
    let (newest, files) = newest_reports();
    assert_eq!(
        newest,
        pinned_release(),
        "the newest conformance report is not for the pinned Gateway API release: run `make \
         conformance` and commit its report"
    );
    assert!(!files.is_empty(), "no report under reports/{newest}");
    let published: BTreeSet<String> = SUPPORTED_FEATURES.iter().map(|f| (*f).to_owned()).collect();
    assert_eq!(
        published.len(),
        SUPPORTED_FEATURES.len(),
        "SUPPORTED_FEATURES lists a feature twice"
    );
    assert_published_equals_proven(
        "SUPPORTED_FEATURES (operator/src/status.rs)",
        &published,
        &files,
    );
}

/// Fails unless `published` is exactly what `files` (reports of one run) show passing, and
/// none of it is reported unsupported there.
fn assert_published_equals_proven(what: &str, published: &BTreeSet<String>, files: &[PathBuf]) {
    let mut passed = BTreeSet::new();
    let mut unsupported = BTreeSet::new();
    for f in files {
        let (p, u) = claims(f);
        passed.extend(p);
        unsupported.extend(u);
    }
    let unproven: Vec<&String> = published.difference(&passed).collect();
    let unpublished: Vec<&String> = passed.difference(published).collect();
    assert!(
        unproven.is_empty() && unpublished.is_empty(),
        "{what} and the conformance report(s) {files:?} disagree.\n  published, not shown \
         passing: {unproven:?}\n  shown passing, not published: {unpublished:?}"
    );
    let contradicted: Vec<&String> = published.intersection(&unsupported).collect();
    assert!(
        contradicted.is_empty(),
        "{what}: published yet reported unsupported: {contradicted:?}"
    );
}

#[test]
fn release_directories_order_by_number_not_by_text() {
    assert_eq!(release("v1.5.1"), Some((1, 5, 1)));
    assert!(release("v1.10.0") > release("v1.9.3"));
    assert_eq!(release("v1.5"), None);
    assert_eq!(release("latest"), None);
}

#[test]
fn a_shared_pool_class_publishes_exactly_what_the_shared_pool_run_shows_passing() {
    // `COXSWAIN_CONFORMANCE_POOL=shared make conformance`: a class without parametersRef,
    // every Gateway on the shared pool through a Service of its own.
    let (release, files) = newest_reports_of("-shared-pool-report.yaml");
    let published: BTreeSet<String> = class_features(false, true)
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_published_equals_proven(
        &format!("a shared-pool class's features (status::class_features), {release}"),
        &published,
        &files,
    );
}
