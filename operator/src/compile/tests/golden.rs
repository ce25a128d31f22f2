//! The fixtures the compiler's tests compiled when this corpus was made (named after their
//! test), and cases added for what no test covered, each kept as a file beside what the
//! compiler made of it: the snapshot of every scope, the status, the dedicated proxies' names
//! and ServiceAccounts. A compiler change that alters any of it by a byte fails here, so a
//! refactor can show it changed nothing; a change meant to alter output rewrites the expected
//! files with `COXSWAIN_BLESS=1` and shows the difference in review.

use crate::compile::*;
use coxswain_api::snapshot::Snapshot;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the fixtures are: `NAME.yaml` (the input; a first line `# ingress-nginx-compat`
/// compiles it with that setting on) and `NAME.expected.yaml`.
fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/compile")
}

const COMPAT_MARK: &str = "# ingress-nginx-compat\n";
const EXPECTED_SUFFIX: &str = ".expected.yaml";

/// What the golden files hold of a compile: every field of [`Compiled`], with keys as text.
/// Fields at their default are left out ([`without_defaults`]).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Output<'a> {
    snapshots: BTreeMap<String, &'a Snapshot>,
    status: &'a StatusDecisions,
    proxy_names: BTreeMap<String, String>,
    proxy_accounts: BTreeMap<String, String>,
}

fn scope_name(scope: &ScopeKey) -> String {
    match scope {
        ScopeKey::SharedPool => "shared".to_owned(),
        ScopeKey::Gateway(gw) => format!("gateway/{gw}"),
    }
}

fn render(c: &Compiled) -> String {
    let output = Output {
        snapshots: c
            .snapshots
            .iter()
            .map(|(k, s)| (scope_name(k), s.snapshot()))
            .collect(),
        status: &c.status,
        proxy_names: c
            .proxy_names
            .iter()
            .map(|(gw, name)| (gw.to_string(), format!("{name:?}")))
            .collect(),
        proxy_accounts: c
            .proxy_accounts
            .iter()
            .map(|(scope, account)| (scope_name(scope), account.to_string()))
            .collect(),
    };
    let value = serde_json::to_value(&output).unwrap_or_else(|e| panic!("encoding: {e}"));
    coxswain_api::snapshot::to_yaml(&without_defaults(value))
        .unwrap_or_else(|e| panic!("encoding: {e}"))
}

/// `value` without the object fields that hold their type's default (null, false, 0, "", an
/// empty list or map). A field added to the snapshot or status then changes no fixture until
/// something sets it, as proto's wire form (and so the snapshot's content hash, which stays
/// in) does not change either; a value that moves to or from its default still shows, as a
/// field that appears or goes.
fn without_defaults(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| (k, without_defaults(v)))
                .filter(|(_, v)| !is_default(v))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_defaults).collect()),
        other => other,
    }
}

fn is_default(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(fields) => fields.is_empty(),
    }
}

fn expected_of(input: &Path) -> PathBuf {
    let input = input.to_string_lossy();
    let stem = input.strip_suffix(".yaml").unwrap_or(&input);
    PathBuf::from(format!("{stem}{EXPECTED_SUFFIX}"))
}

/// Where two outputs part, as the reader of a failure wants it first: a snapshot's content
/// hash (`version:`) differs whenever anything in it does, so it is named only when nothing
/// else differs.
fn first_difference(expected: &str, actual: &str) -> String {
    let mut expected_lines = expected.lines();
    let mut actual_lines = actual.lines();
    let mut hash = None;
    for line in 1.. {
        match (expected_lines.next(), actual_lines.next()) {
            (Some(e), Some(a)) if e == a => {}
            (Some(e), Some(a)) if e.trim_start().starts_with("version:") => {
                hash.get_or_insert(format!("line {line}: expected {e:?}, got {a:?}"));
            }
            (None, None) => break,
            (e, a) => return format!("line {line}: expected {e:?}, got {a:?}"),
        }
    }
    hash.unwrap_or_else(|| "only in line endings".to_owned())
}

fn compile_file(path: &Path) -> Compiled {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut store = Store::default();
    let mut errors = Vec::new();
    store.load_yaml(path, &text, &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    let config = Config {
        ingress_nginx_compat: text.starts_with(COMPAT_MARK),
        ..Config::default()
    };
    compile(&store, &config)
}

fn inputs() -> Vec<PathBuf> {
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(corpus())
        .unwrap_or_else(|e| panic!("{}: {e}", corpus().display()))
        .map(|entry| entry.unwrap_or_else(|e| panic!("{e}")).path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.to_string_lossy().ends_with(EXPECTED_SUFFIX))
        .collect();
    inputs.sort();
    inputs
}

/// The assembler writes each snapshot's encoding itself (`compile::encode`); a proxy checks
/// the hash over those bytes, and a reader that encodes the snapshot again (an older proxy, a
/// snapshot file written as YAML) must get the same bytes and so the same version.
#[test]
fn every_snapshot_is_encoded_as_prost_encodes_it() {
    let inputs = inputs();
    assert!(inputs.len() > 100, "the corpus was found: {inputs:?}");
    for input in &inputs {
        for (scope, sealed) in compile_file(input).snapshots {
            let again = coxswain_api::snapshot::Sealed::new(sealed.snapshot().clone());
            assert!(
                again.encoded() == sealed.encoded(),
                "{} {scope:?}: the written encoding ({} bytes) differs from prost's ({} bytes)",
                input.display(),
                sealed.encoded().len(),
                again.encoded().len()
            );
            assert_eq!(again.version(), sealed.version());
            assert_eq!(sealed.snapshot().version, sealed.version());
        }
    }
}

#[test]
fn every_fixture_compiles_to_its_committed_output() {
    let bless = std::env::var_os("COXSWAIN_BLESS").is_some();
    let (mut inputs, expected): (Vec<PathBuf>, Vec<PathBuf>) = std::fs::read_dir(corpus())
        .unwrap_or_else(|e| panic!("{}: {e}", corpus().display()))
        .map(|entry| entry.unwrap_or_else(|e| panic!("{e}")).path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .partition(|p| !p.to_string_lossy().ends_with(EXPECTED_SUFFIX));
    inputs.sort();
    assert!(inputs.len() > 100, "the corpus was found: {inputs:?}");
    // An expected output whose input was renamed or removed would otherwise check nothing.
    let orphans: Vec<&PathBuf> = expected
        .iter()
        .filter(|e| !inputs.iter().any(|i| expected_of(i) == **e))
        .collect();
    assert!(
        orphans.is_empty(),
        "expected outputs without an input: {orphans:?}"
    );
    let mut changed = Vec::new();
    for input in &inputs {
        let actual = render(&compile_file(input));
        let expected_path = expected_of(input);
        if bless {
            std::fs::write(&expected_path, &actual).unwrap_or_else(|e| panic!("{e}"));
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        if actual != expected {
            changed.push(format!(
                "{}: {}",
                input.display(),
                first_difference(&expected, &actual)
            ));
        }
    }
    assert!(
        changed.is_empty(),
        "{} of {} fixtures compile differently from their .expected.yaml \
         (COXSWAIN_BLESS=1 rewrites them; review the diff): {changed:#?}",
        changed.len(),
        inputs.len()
    );
}
