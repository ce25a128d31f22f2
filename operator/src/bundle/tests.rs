use super::*;
use crate::cli::Cli;
use clap::CommandFactory;
use coxswain_api::names;
use std::collections::BTreeSet;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn bundle() -> Bundle {
    generate(&Layout::new(repo_root())).unwrap_or_else(|e| panic!("{e}"))
}

fn default_objects() -> Vec<ConfigObject> {
    config::build(&repo_root().join("config/default")).unwrap()
}

fn object<'a>(objects: &'a [ConfigObject], kind: &str, name: &str) -> &'a ConfigObject {
    objects
        .iter()
        .find(|o| o.kind() == kind && o.name() == name)
        .unwrap_or_else(|| panic!("config/default has no {kind} {name}"))
}

fn csv_of(bundle: &Bundle) -> Value {
    let text =
        &bundle.files[&PathBuf::from("bundle/manifests/coxswain.clusterserviceversion.yaml")];
    serde_yaml::from_str(text).unwrap()
}

#[test]
fn committed_bundle_is_what_make_bundle_generates() {
    let drift = bundle().drift(&repo_root()).unwrap();
    assert!(
        drift.is_empty(),
        "bundle/ or bundle.Dockerfile is out of date; run `make bundle` and commit:\n{}",
        drift.join("\n")
    );
}

#[test]
fn generation_is_deterministic() {
    assert_eq!(bundle(), bundle());
}

#[test]
fn services_and_accounts_carry_the_well_known_names() {
    let objects = default_objects();
    let discovery = object(&objects, "Service", names::DISCOVERY_SERVICE);
    assert_eq!(
        discovery.value["spec"]["selector"][names::LEADER_LABEL],
        names::LEADER_LABEL_VALUE,
        "the discovery Service must select the leader only"
    );
    assert_eq!(
        discovery.value["spec"]["ports"][0]["port"],
        names::DISCOVERY_PORT
    );
    let bootstrap = object(&objects, "Service", names::BOOTSTRAP_SERVICE);
    assert!(
        bootstrap.value["spec"]["selector"]
            .get(names::LEADER_LABEL)
            .is_none()
    );
    assert_eq!(
        bootstrap.value["spec"]["ports"][0]["port"],
        names::BOOTSTRAP_PORT
    );
    object(
        &objects,
        "ServiceAccount",
        names::SHARED_PROXY_SERVICE_ACCOUNT,
    );
    let cluster_scoped = [
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "Namespace",
    ];
    for o in objects
        .iter()
        .filter(|o| !cluster_scoped.contains(&o.kind()))
    {
        assert_eq!(
            o.value["metadata"]["namespace"],
            names::DEFAULT_NAMESPACE,
            "{}",
            o.describe()
        );
    }
    object(&objects, "Namespace", names::DEFAULT_NAMESPACE);
}

fn container<'a>(objects: &'a [ConfigObject], deployment: &str) -> &'a Value {
    csv::containers(object(objects, "Deployment", deployment))
        .next()
        .unwrap()
}

fn env<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
}

/// Long flags and environment variables a `coxswain` subcommand reads.
fn cli_env(path: &[&str]) -> BTreeSet<String> {
    let mut cmd = Cli::command();
    for name in path {
        cmd = cmd.find_subcommand(name).unwrap().clone();
    }
    cmd.get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn deployments_set_only_variables_their_role_reads() {
    let objects = default_objects();
    for (deployment, role) in [
        ("coxswain-controller", "controller"),
        ("coxswain-proxy", "proxy"),
    ] {
        let c = container(&objects, deployment);
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(&args[..2], ["serve", role]);
        let reads = cli_env(&["serve", role]);
        let vars: Vec<&Value> = c["env"].as_array().unwrap().iter().collect();
        for var in &vars {
            let name = var["name"].as_str().unwrap();
            let expanded = vars.iter().any(|v| {
                v["value"]
                    .as_str()
                    .is_some_and(|s| s.contains(&format!("$({name})")))
            });
            assert!(
                reads.contains(name) || expanded,
                "{deployment}: {name} is neither read by `coxswain serve {role}` nor used by another variable"
            );
        }
    }
    let ctl = container(&objects, "coxswain-controller");
    for var in ["COXSWAIN_NAMESPACE", "COXSWAIN_POD_NAME"] {
        assert!(
            env(ctl, var).unwrap()["valueFrom"]["fieldRef"].is_object(),
            "{var}"
        );
    }
}

#[test]
fn the_shared_proxy_dials_the_controller_services_with_its_audience_token() {
    let objects = default_objects();
    let proxy = object(&objects, "Deployment", "coxswain-proxy");
    let pod = &proxy.value["spec"]["template"]["spec"];
    assert_eq!(
        pod["serviceAccountName"],
        names::SHARED_PROXY_SERVICE_ACCOUNT
    );
    assert_eq!(pod["automountServiceAccountToken"], false);
    let c = container(&objects, "coxswain-proxy");
    // With the default namespace, the endpoints are the CLI's defaults.
    let expand = |name: &str| {
        env(c, name)
            .and_then(|v| v["value"].as_str())
            .unwrap()
            .replace("$(COXSWAIN_NAMESPACE)", names::DEFAULT_NAMESPACE)
    };
    let defaults = |flag: &str| {
        Cli::command()
            .find_subcommand("serve")
            .unwrap()
            .find_subcommand("proxy")
            .unwrap()
            .get_arguments()
            .find(|a| a.get_long() == Some(flag))
            .unwrap()
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(",")
    };
    for (var, flag) in [
        ("COXSWAIN_DISCOVERY_ENDPOINT", "discovery-endpoint"),
        (
            "COXSWAIN_DISCOVERY_BOOTSTRAP_ENDPOINT",
            "discovery-bootstrap-endpoint",
        ),
        ("COXSWAIN_DISCOVERY_TRUST_BUNDLE", "discovery-trust-bundle"),
        ("COXSWAIN_TOKEN_PATH", "token-path"),
    ] {
        assert_eq!(expand(var), defaults(flag), "{var}");
    }
    let volumes = pod["volumes"].as_array().unwrap();
    let token = volumes
        .iter()
        .find_map(|v| v["projected"]["sources"][0].get("serviceAccountToken"))
        .unwrap();
    assert_eq!(token["audience"], names::TOKEN_AUDIENCE);
    let trust = volumes.iter().find_map(|v| v.get("configMap")).unwrap();
    assert_eq!(trust["name"], names::TRUST_BUNDLE_CONFIGMAP);
    let mounts = c["volumeMounts"].as_array().unwrap();
    let mount_dirs: BTreeSet<&str> = mounts
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    // The snapshot cache is a directory of its own, on an emptyDir (the root is read-only).
    let cache = expand("COXSWAIN_SNAPSHOT_CACHE_DIR");
    let cache_volume = mounts
        .iter()
        .find(|m| m["mountPath"] == cache.as_str())
        .unwrap_or_else(|| panic!("COXSWAIN_SNAPSHOT_CACHE_DIR {cache} is not a mount"))["name"]
        .clone();
    assert!(
        volumes
            .iter()
            .any(|v| v["name"] == cache_volume && v.get("emptyDir").is_some()),
        "the snapshot cache is not an emptyDir"
    );
    for var in ["COXSWAIN_TOKEN_PATH", "COXSWAIN_DISCOVERY_TRUST_BUNDLE"] {
        let file = expand(var);
        let dir = Path::new(&file)
            .parent()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            mount_dirs.contains(dir.as_str()),
            "{var} {file} is not under a mount"
        );
    }
}

#[test]
fn nothing_is_bound_to_the_proxy_service_account_and_no_role_can_create_crds() {
    for o in default_objects() {
        if o.kind().ends_with("Binding") {
            for s in o.value["subjects"].as_array().unwrap() {
                assert_ne!(
                    s["name"],
                    names::SHARED_PROXY_SERVICE_ACCOUNT,
                    "{}",
                    o.describe()
                );
                assert_eq!(s["kind"], "ServiceAccount", "{}", o.describe());
            }
        }
        if o.kind().ends_with("Role") {
            for rule in o.value["rules"].as_array().unwrap() {
                let all = |key: &str| -> Vec<&str> {
                    rule[key]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter_map(Value::as_str)
                        .collect()
                };
                for key in ["apiGroups", "resources", "verbs"] {
                    assert!(!all(key).contains(&"*"), "{}: wildcard {key}", o.describe());
                }
                // Reading the Gateway API CRD's version annotation is fine; changing CRDs is not.
                if all("resources").contains(&"customresourcedefinitions") {
                    assert_eq!(all("verbs"), ["get"], "{}: CRD verbs", o.describe());
                    assert!(
                        rule["resourceNames"]
                            .as_array()
                            .is_some_and(|n| !n.is_empty()),
                        "{}: CRD access must name its CRDs",
                        o.describe()
                    );
                }
            }
        }
    }
}

#[test]
fn the_csv_follows_the_operatorhub_rules() {
    let b = bundle();
    let csv = csv_of(&b);
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(csv["metadata"]["name"], format!("coxswain.v{version}"));
    assert_eq!(csv["spec"]["version"], version);
    assert_eq!(csv["spec"]["minKubeVersion"], "1.30.0");
    let modes: Vec<(String, bool)> = csv["spec"]["installModes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["type"].as_str().unwrap().to_owned(),
                m["supported"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        modes
            .iter()
            .filter(|(_, s)| *s)
            .map(|(t, _)| t.as_str())
            .collect::<Vec<_>>(),
        ["AllNamespaces"]
    );
    assert_eq!(
        csv["metadata"]["annotations"]["capabilities"],
        "Seamless Upgrades"
    );
    assert_eq!(csv["metadata"]["annotations"]["categories"], "Networking");
    assert!(
        csv["spec"]["description"]
            .as_str()
            .unwrap()
            .contains("Gateway API CRDs")
    );
    // Gateway API is a documented prerequisite, never an OLM dependency.
    assert!(
        csv["spec"]["customresourcedefinitions"]
            .get("required")
            .is_none()
    );
    assert!(!b.files.keys().any(|p| p.ends_with("dependencies.yaml")));
    // Every example is of an owned kind, and every owned kind has one.
    let examples: Vec<Value> = serde_json::from_str(
        csv["metadata"]["annotations"]["alm-examples"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let owned: BTreeSet<(String, String)> = csv["spec"]["customresourcedefinitions"]["owned"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let group = o["name"].as_str().unwrap().split_once('.').unwrap().1;
            (
                format!("{group}/{}", o["version"].as_str().unwrap()),
                o["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let example_kinds: BTreeSet<(String, String)> = examples
        .iter()
        .map(|e| {
            (
                e["apiVersion"].as_str().unwrap().to_owned(),
                e["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(owned, example_kinds);
    assert_eq!(owned.len(), crd::all().len());
}

#[test]
fn both_deployments_are_in_the_install_strategy_and_the_proxy_gets_no_rules() {
    let csv = csv_of(&bundle());
    let install = &csv["spec"]["install"]["spec"];
    let deployments: Vec<&str> = install["deployments"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert_eq!(deployments, ["coxswain-controller", "coxswain-proxy"]);
    let proxy: Vec<&Value> = ["permissions", "clusterPermissions"]
        .iter()
        .flat_map(|k| install[*k].as_array().unwrap())
        .filter(|p| p["serviceAccountName"] == names::SHARED_PROXY_SERVICE_ACCOUNT)
        .collect();
    assert_eq!(proxy.len(), 1, "{proxy:?}");
    assert_eq!(proxy[0]["rules"], serde_json::json!([]));
    let related: Vec<&str> = csv["spec"]["relatedImages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["image"].as_str())
        .collect();
    assert_eq!(
        related,
        [format!(
            "ghcr.io/coxswain-labs/coxswain:v{}",
            env!("CARGO_PKG_VERSION")
        )]
    );
}

/// A copy of the repository's generator inputs to break on purpose.
fn scratch_copy() -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            let target = to.join(path.file_name().unwrap());
            if path.is_dir() {
                copy(&path, &target);
            } else {
                std::fs::copy(&path, &target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(&repo_root().join("config"), &dir.path().join("config"));
    std::fs::copy(repo_root().join("PROJECT"), dir.path().join("PROJECT")).unwrap();
    dir
}

fn edit(root: &Path, file: &str, from: &str, to: &str) {
    let path = root.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{file} has no {from:?}");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn a_field_without_a_descriptor_fails_generation() {
    let dir = scratch_copy();
    edit(
        dir.path(),
        "config/manifests/bases/coxswain.clusterserviceversion.yaml",
        "      - path: accessLog\n",
        "      - path: accessLogs\n",
    );
    let err = generate(&Layout::new(dir.path())).unwrap_err().to_string();
    assert!(err.contains("\"accessLogs\" is not a field"), "{err}");
    assert!(
        err.contains("spec.accessLog has no specDescriptors entry"),
        "{err}"
    );
}

#[test]
fn an_image_of_another_version_fails_generation() {
    let dir = scratch_copy();
    let err = generate_version(&Layout::new(dir.path()), "9.9.9")
        .unwrap_err()
        .to_string();
    assert!(err.contains("not tagged v9.9.9"), "{err}");
}

#[test]
fn a_rehearsal_is_the_same_build_under_the_next_version() {
    let version = env!("CARGO_PKG_VERSION");
    let (minor, patch) = version.rsplit_once('.').unwrap();
    let next = format!("{minor}.{}", patch.parse::<u32>().unwrap() + 1);
    let (tag, next_tag) = (format!("v{version}"), format!("v{next}"));
    let replaces = format!("coxswain.{tag}");
    let current = csv_of(&bundle());
    let rehearsal = csv_of(
        &generate_rehearsal(
            &Layout::new(repo_root()),
            Rehearsal {
                version: &next,
                replaces: &replaces,
            },
        )
        .unwrap_or_else(|e| panic!("{e}")),
    );
    assert_eq!(
        rehearsal["metadata"]["name"],
        format!("coxswain.{next_tag}")
    );
    assert_eq!(rehearsal["spec"]["version"], next.as_str());
    assert_eq!(rehearsal["spec"]["replaces"], replaces.as_str());
    // The same images under the new tag, everywhere the CSV names them.
    let images = |csv: &Value| {
        let text = serde_json::to_string(csv).unwrap();
        let mut found: Vec<String> = text
            .split('"')
            .filter(|s| s.starts_with("ghcr.io/"))
            .map(str::to_owned)
            .collect();
        found.sort();
        found
    };
    let retagged: Vec<String> = images(&current)
        .iter()
        .map(|i| csv::with_tag(i, &next_tag).unwrap())
        .collect();
    assert!(!retagged.is_empty());
    assert_eq!(images(&rehearsal), retagged);
    // Everything else is the release bundle's.
    let strip = |mut csv: Value| {
        csv["metadata"].as_object_mut().unwrap().remove("name");
        for key in ["version", "replaces"] {
            csv["spec"].as_object_mut().unwrap().remove(key);
        }
        let text = serde_json::to_string(&csv).unwrap();
        serde_json::from_str::<Value>(&text.replace(&next_tag, &tag)).unwrap()
    };
    assert_eq!(strip(rehearsal), strip(current));
}

#[test]
fn a_rehearsal_needs_a_semver_and_a_csv_name() {
    let layout = Layout::new(repo_root());
    let err = generate_rehearsal(
        &layout,
        Rehearsal {
            version: "0.1",
            replaces: "coxswain.v0.1.0",
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("MAJOR.MINOR.PATCH"), "{err}");
    let err = generate_rehearsal(
        &layout,
        Rehearsal {
            version: "0.1.1",
            replaces: "Coxswain 0.1.0",
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("CSV name"), "{err}");
}

#[test]
fn kinds_olm_refuses_fail_generation() {
    let dir = scratch_copy();
    std::fs::write(
        dir.path().join("config/proxy/extra.yaml"),
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: coxswain}\n",
    )
    .unwrap();
    edit(
        dir.path(),
        "config/proxy/kustomization.yaml",
        "- service.yaml\n",
        "- service.yaml\n- extra.yaml\n",
    );
    let err = generate(&Layout::new(dir.path())).unwrap_err().to_string();
    assert!(
        err.contains("GatewayClass coxswain") && err.contains("cannot be part"),
        "{err}"
    );
}

#[test]
fn write_then_check_round_trips_and_removes_stale_files() {
    let dir = scratch_copy();
    let layout = Layout::new(dir.path());
    let b = generate(&layout).unwrap();
    std::fs::create_dir_all(dir.path().join("bundle/manifests")).unwrap();
    std::fs::write(dir.path().join("bundle/manifests/old.yaml"), "x").unwrap();
    assert!(b.check(dir.path()).is_err());
    b.write(dir.path()).unwrap();
    b.check(dir.path()).unwrap();
    assert!(!dir.path().join("bundle/manifests/old.yaml").exists());
}
