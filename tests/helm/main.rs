//! The Helm chart and the Dockerfile, checked without a cluster or a Docker engine: the chart has
//! what a production deployment needs, every value a template reads exists in values.yaml, and
//! the broker settings it writes are real settings.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use queen_broker::config::Config;
use serde_yaml_ng::Value;

fn repository() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).to_path_buf()
}

fn chart() -> PathBuf {
    repository().join("helm/queen")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn values() -> Value {
    serde_yaml_ng::from_str(&read(&chart().join("values.yaml"))).expect("values.yaml is YAML")
}

fn templates() -> Vec<(String, String)> {
    let mut templates: Vec<(String, String)> = std::fs::read_dir(chart().join("templates"))
        .expect("templates/")
        .map(|entry| entry.expect("an entry").path())
        .map(|path| (path.file_name().unwrap_or_default().to_string_lossy().into_owned(), read(&path)))
        .collect();
    templates.sort();
    templates
}

/// Every `.Values.a.b.c` path a template reads.
fn value_paths(template: &str) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    let mut rest = template;
    while let Some(at) = rest.find(".Values.") {
        rest = &rest[at + ".Values.".len()..];
        let path: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_').collect();
        paths.insert(path.trim_end_matches('.').to_owned());
    }
    paths
}

fn lookup<'a>(values: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(values, |node, key| node.get(key))
}

#[test]
fn the_chart_has_what_a_production_deployment_needs() {
    let chart_yaml: Value = serde_yaml_ng::from_str(&read(&chart().join("Chart.yaml"))).expect("Chart.yaml");
    assert_eq!(chart_yaml["apiVersion"], Value::from("v2"));
    assert_eq!(chart_yaml["name"], Value::from("queen"));
    let names: Vec<String> = templates().into_iter().map(|(name, _)| name).collect();
    for required in [
        "_helpers.tpl",
        "configmap.yaml",
        "deployment.yaml",
        "hpa.yaml",
        "pdb.yaml",
        "service.yaml",
        "servicemonitor.yaml",
    ] {
        assert!(names.iter().any(|n| n == required), "templates/{required} is missing");
    }
    let deployment = read(&chart().join("templates/deployment.yaml"));
    assert!(deployment.contains("kind: Deployment"));
    for probe in [
        "livenessProbe:\n            httpGet:\n              path: /health",
        "readinessProbe:\n            httpGet:\n              path: /ready",
    ] {
        assert!(deployment.contains(probe), "the deployment lacks {probe:?}");
    }
    assert!(deployment.contains("secretKeyRef"), "database credentials come from a Secret");
    assert!(
        deployment.contains("- name: QUEEN_ENCRYPTION_KEY\n              valueFrom:\n                secretKeyRef:"),
        "the encryption key comes from a Secret"
    );
    assert!(deployment.contains("resources:"));
    assert!(
        deployment.contains("mountPath: {{ .Values.buffer.mountPath }}")
            && read(&chart().join("templates/configmap.yaml"))
                .contains("dir = {{ .Values.buffer.mountPath | toJson }}"),
        "the push journal lives on a volume (the root filesystem is read-only), and the broker is told where"
    );
    assert!(read(&chart().join("templates/pdb.yaml")).contains("kind: PodDisruptionBudget"));
    assert!(
        read(&chart().join("templates/hpa.yaml")).contains("{{- if .Values.autoscaling.enabled }}"),
        "the HPA is optional"
    );
    assert!(
        read(&chart().join("templates/servicemonitor.yaml")).contains("{{- if .Values.serviceMonitor.enabled }}"),
        "the ServiceMonitor is optional"
    );
}

#[test]
fn every_value_a_template_reads_exists_in_values_yaml() {
    let values = values();
    let mut missing = Vec::new();
    for (name, template) in templates() {
        for path in value_paths(&template) {
            if lookup(&values, &path).is_none() {
                missing.push(format!("{name}: .Values.{path}"));
            }
        }
    }
    assert!(missing.is_empty(), "values.yaml lacks: {missing:#?}");
}

#[test]
fn every_value_is_documented() {
    let text = read(&chart().join("values.yaml"));
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let top_level = !line.starts_with(' ') && !line.starts_with('#') && line.contains(':');
        if top_level {
            let documented = lines[..i].iter().rev().take_while(|l| l.trim_start().starts_with('#')).count() > 0
                || lines[i + 1..].iter().take_while(|l| l.starts_with(' ')).any(|l| l.trim_start().starts_with("# --"));
            assert!(documented, "values.yaml: {line:?} has no comment saying what it is");
        }
    }
}

#[test]
fn the_broker_settings_the_chart_writes_are_real_settings() {
    let values = values();
    let config = values.get("config").cloned().expect("values.config");
    // Unknown sections or keys fail here: the typed settings refuse them.
    let parsed: Config = serde_yaml_ng::from_value(config).expect("values.config holds broker settings");
    parsed.validate().expect("and valid ones");
}

#[test]
fn the_dockerfile_builds_the_broker_in_one_stage_and_runs_it_unprivileged_in_another() {
    let dockerfile = read(&repository().join("Dockerfile"));
    let stages = dockerfile.lines().filter(|l| l.starts_with("FROM ")).count();
    assert!(stages >= 2, "a multi-stage build");
    assert!(dockerfile.contains("cargo build --release --locked --bin queen"));
    assert!(dockerfile.contains("COPY --from=build"));
    let user = dockerfile.lines().rev().find(|l| l.starts_with("USER ")).expect("a USER");
    assert_ne!(user.trim(), "USER root");
    assert!(dockerfile.contains("EXPOSE 6632"));
}
