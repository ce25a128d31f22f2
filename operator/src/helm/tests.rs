#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion

use super::*;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> Chart {
    generate(&repo_root()).unwrap()
}

#[test]
fn committed_chart_is_what_make_helm_generates() {
    let drift = chart().drift(&repo_root().join(DEFAULT_OUT_DIR)).unwrap();
    assert!(
        drift.is_empty(),
        "deploy/helm/coxswain is stale; run `make helm`:\n{}",
        drift.join("\n")
    );
}

#[test]
fn generation_is_deterministic() {
    assert_eq!(chart(), chart());
}

#[test]
fn every_object_but_the_namespace_has_a_template() {
    let objects = config::build(&repo_root().join("config/default")).unwrap();
    let chart = chart();
    for obj in &objects {
        let file = PathBuf::from(format!(
            "templates/{}_{}.yaml",
            obj.kind().to_ascii_lowercase(),
            obj.name()
        ));
        assert_eq!(
            chart.files.contains_key(&file),
            obj.kind() != "Namespace",
            "{}",
            file.display()
        );
    }
}

#[test]
fn values_default_to_what_config_default_says() {
    let chart = chart();
    let values: Value = serde_yaml::from_str(&chart.files[Path::new("values.yaml")]).unwrap();
    let objects = config::build(&repo_root().join("config/default")).unwrap();
    let deployment = |name: &str| {
        objects
            .iter()
            .find(|o| o.kind() == "Deployment" && o.name() == name)
            .unwrap()
            .value
            .clone()
    };
    for (key, name) in [
        ("controller", "coxswain-controller"),
        ("sharedPool", "coxswain-proxy"),
    ] {
        let d = deployment(name);
        assert_eq!(values[key]["replicas"], d["spec"]["replicas"], "{key}");
        assert_eq!(
            values[key]["resources"], d["spec"]["template"]["spec"]["containers"][0]["resources"],
            "{key}"
        );
        let image = format!(
            "{}:{}",
            values["image"]["repository"].as_str().unwrap(),
            values["image"]["tag"].as_str().unwrap()
        );
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["image"],
            image.as_str()
        );
    }
    assert_eq!(values["sharedPool"]["enabled"], true);
    assert_eq!(values["crds"]["install"], true);
    // The schema accepts exactly the keys values.yaml has.
    let schema: Value =
        serde_json::from_str(&chart.files[Path::new("values.schema.json")]).unwrap();
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&values), keys(&schema["properties"]));
    for section in keys(&values) {
        assert_eq!(
            keys(&values[&section]),
            keys(&schema["properties"][&section]["properties"]),
            "{section}"
        );
    }
}

#[test]
fn the_controller_template_takes_image_replicas_and_resources_from_values() {
    let chart = chart();
    let text = &chart.files[Path::new("templates/deployment_coxswain-controller.yaml")];
    assert!(
        text.contains("replicas: {{ .Values.controller.replicas }}\n"),
        "{text}"
    );
    assert!(
        text.contains("{{- toYaml .Values.controller.resources | nindent 10 }}"),
        "{text}"
    );
    assert_eq!(
        text.matches(&format!("\"{IMAGE_EXPR}\"")).count(),
        2,
        "{text}"
    );
    assert!(
        text.contains("namespace: {{ .Release.Namespace }}"),
        "{text}"
    );
    assert!(!text.contains("HELMPLACEHOLDER"), "{text}");
    assert!(!text.contains("coxswain-system"), "{text}");
}

#[test]
fn shared_pool_objects_and_crds_are_guarded_by_their_values() {
    let chart = chart();
    for (file, text) in &chart.files {
        let name = file.to_string_lossy();
        if text.contains("app.kubernetes.io/component: shared-proxy")
            && name != "templates/NOTES.txt"
        {
            assert!(
                text.contains("{{- if .Values.sharedPool.enabled }}"),
                "{name}"
            );
        }
        if name.starts_with("templates/customresourcedefinition_") {
            assert!(text.contains("{{- if .Values.crds.install }}"), "{name}");
            assert!(text.contains("helm.sh/resource-policy: keep"), "{name}");
        }
    }
}

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
    dir
}

fn edit(root: &Path, file: &str, from: &str, to: &str) {
    let path = root.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{file} has no {from:?}");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn two_images_fail_generation() {
    let dir = scratch_copy();
    edit(
        dir.path(),
        "config/proxy/deployment.yaml",
        "image: ghcr.io/coxswain-labs/coxswain:",
        "image: example.com/other:",
    );
    let err = generate(dir.path()).unwrap_err().to_string();
    assert!(err.contains("one image value"), "{err}");
}

#[test]
fn a_deployment_of_an_unknown_component_fails_generation() {
    let dir = scratch_copy();
    edit(
        dir.path(),
        "config/proxy/deployment.yaml",
        "app.kubernetes.io/component: shared-proxy\nspec:",
        "app.kubernetes.io/component: sidecar\nspec:",
    );
    let err = generate(dir.path()).unwrap_err().to_string();
    assert!(err.contains("\"sidecar\""), "{err}");
}

#[test]
fn write_then_check_round_trips_and_removes_stale_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("chart");
    let chart = chart();
    assert!(chart.check(&out).is_err());
    std::fs::create_dir_all(out.join("templates")).unwrap();
    std::fs::write(out.join("templates/old.yaml"), "x").unwrap();
    chart.write(&out).unwrap();
    assert!(!out.join("templates/old.yaml").exists());
    chart.check(&out).unwrap();
    std::fs::write(out.join("values.yaml"), "x").unwrap();
    let err = chart.check(&out).unwrap_err().to_string();
    assert!(
        err.contains("differs:") && err.contains("values.yaml"),
        "{err}"
    );
}
