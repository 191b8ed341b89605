//! The Helm chart and the Dockerfile, checked without a cluster or a Docker engine: the chart has
//! what a production deployment needs, every value a template reads exists in values.yaml, and
//! the broker settings it writes are real settings.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use queen_broker::config::{Config, ENV_ALIASES};
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
    assert!(
        deployment.contains("enableServiceLinks: false"),
        "Kubernetes' service-link variables (QUEEN_HTTP_PORT=tcp://...) would read as broker settings"
    );
    assert_eq!(
        values()["podSecurityContext"]["seccompProfile"]["type"],
        Value::from("RuntimeDefault"),
        "the restricted Pod Security Standard needs a seccomp profile"
    );
    assert_rendered_only_when("deployment.yaml", "type: Recreate", &["buffer.existingClaim"]);
    let seconds = |path: &str| lookup(&values(), path).and_then(Value::as_u64).expect(path);
    assert!(
        seconds("terminationGracePeriodSeconds")
            >= seconds("config.http.shutdown_timeout_seconds") + seconds("preStopSleepSeconds"),
        "Kubernetes would kill a broker before its requests under way finish"
    );
    assert!(
        deployment.contains("{{- if lt (int .Values.terminationGracePeriodSeconds) (int $drain) }}"),
        "a grace period shorter than the drain is refused"
    );
    let configmap = read(&chart().join("templates/configmap.yaml"));
    for secret in [r#"(eq $key "jwt_secret")"#, r#"(eq $section "encryption") (eq $key "key")"#] {
        assert!(configmap.contains(secret), "a secret given under config.* is refused, not rendered: {secret}");
    }
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

fn template(name: &str) -> String {
    read(&chart().join("templates").join(name))
}

/// The actions (`if`, `with`, `range`, `define`) a template has open at byte `at`, outermost
/// first; one whose `else` branch `at` is in reads `not (<action>)`.
fn guards_at(template: &str, at: usize) -> Vec<String> {
    let mut open: Vec<String> = Vec::new();
    let mut rest = &template[..at];
    while let Some(start) = rest.find("{{") {
        let Some(length) = rest[start..].find("}}") else { break };
        let action = rest[start + 2..start + length].trim_start_matches('-').trim_end_matches('-').trim();
        rest = &rest[start + length + 2..];
        match action.split_whitespace().next().unwrap_or_default() {
            "if" | "with" | "range" | "define" => open.push(action.to_owned()),
            "else" => {
                let top = open.pop().expect("an else inside an action");
                open.push(format!("not ({top}){}", action.strip_prefix("else").unwrap_or_default()));
            }
            "end" => {
                open.pop().expect("an end closes an action");
            }
            _ => {}
        }
    }
    open
}

/// Asserts that `needle` is in the template, and that wherever it is, the template renders it
/// only when every one of `values` is set: inside an `if` naming each, not in an `else`.
fn assert_rendered_only_when(name: &str, needle: &str, values: &[&str]) {
    let text = template(name);
    let places: Vec<usize> = text.match_indices(needle).map(|(at, _)| at).collect();
    assert!(!places.is_empty(), "templates/{name} lacks {needle:?}");
    for at in places {
        let guards = guards_at(&text, at);
        for value in values {
            let reference = format!(".Values.{value}");
            let guarded = guards.iter().any(|g| {
                g.starts_with("if ")
                    && g.split(|c: char| c.is_whitespace() || c == '(' || c == ')').any(|word| word == reference)
            });
            assert!(guarded, "templates/{name}: {needle:?} is rendered without {value} set (inside {guards:?})");
        }
        assert!(
            !guards.iter().any(|g| g.starts_with("not (")),
            "templates/{name}: {needle:?} sits in an else branch ({guards:?})"
        );
    }
}

/// Every setting path of the broker (`http.port`, `auth.tokens_file`, ...), unset ones included.
fn setting_exists(path: &str) -> bool {
    let settings = serde_json::to_value(Config::default()).expect("the settings serialize");
    path.split('.').try_fold(&settings, |node, key| node.get(key)).is_some()
}

/// The setting an environment variable sets: an upstream alias, or `QUEEN_<SECTION>__<KEY>`.
fn env_setting(name: &str) -> Option<String> {
    if let Some((_, path)) = ENV_ALIASES.iter().find(|(alias, _)| *alias == name) {
        return Some((*path).to_owned());
    }
    let (section, key) = name.strip_prefix("QUEEN_")?.split_once("__")?;
    Some(format!("{}.{}", section.to_lowercase(), key.to_lowercase()))
}

/// A Secret's file the broker reads: the volume holding it, where that is mounted, and the values
/// that must be set for the file to be there.
struct SecretFile {
    volume: &'static str,
    mount: &'static str,
    file: &'static str,
    when: &'static [&'static str],
}

const SECRET_FILES: &[SecretFile] = &[
    SecretFile { volume: "tls", mount: "/etc/queen/tls", file: "tls.crt", when: &["tls.existingSecret"] },
    SecretFile { volume: "tls", mount: "/etc/queen/tls", file: "tls.key", when: &["tls.existingSecret"] },
    SecretFile { volume: "pg-tls", mount: "/etc/queen/pg-tls", file: "ca.crt", when: &["database.tls.existingSecret"] },
    SecretFile {
        volume: "pg-tls",
        mount: "/etc/queen/pg-tls",
        file: "tls.crt",
        when: &["database.tls.existingSecret", "database.tls.clientCertificate"],
    },
    SecretFile {
        volume: "pg-tls",
        mount: "/etc/queen/pg-tls",
        file: "tls.key",
        when: &["database.tls.existingSecret", "database.tls.clientCertificate"],
    },
    SecretFile {
        volume: "auth",
        mount: "/etc/queen/auth",
        file: "tokens.toml",
        when: &["auth.existingSecret.name", "auth.existingSecret.tokensKey"],
    },
];

#[test]
fn each_secret_is_mounted_only_when_its_value_is_set_and_the_broker_is_pointed_at_its_files() {
    let deployment = template("deployment.yaml");
    for secret in SECRET_FILES {
        let SecretFile { volume, mount, file, when } = secret;
        // The volume and its mount need the values of the volume's first file (the ones every
        // file of it needs).
        let volume_when = SECRET_FILES.iter().find(|s| s.volume == *volume).expect("a row").when;
        let mounted = format!("- name: {volume}\n              mountPath: {mount}\n              readOnly: true\n");
        assert_rendered_only_when("deployment.yaml", &mounted, volume_when);
        let declared = format!("- name: {volume}\n          secret:\n            secretName: ");
        assert_rendered_only_when("deployment.yaml", &declared, volume_when);
        // The file is an item of that volume, under that name, only when the values are set.
        let start = deployment.find(&declared).expect("the volume");
        let block_end = deployment[start + 1..].find("\n        - name: ").map_or(deployment.len(), |n| start + 1 + n);
        let item = format!("path: {file}\n");
        let at =
            deployment[start..block_end].find(&item).unwrap_or_else(|| panic!("volume {volume} lacks the item {file}"))
                + start;
        let guards = guards_at(&deployment, at);
        for value in *when {
            assert!(
                guards.iter().any(|g| g.contains(&format!(".Values.{value}"))),
                "volume {volume}: {file} is there without {value} ({guards:?})"
            );
        }
        // Some setting names the file, and only when it is there.
        let path = format!("{mount}/{file}");
        let named: Vec<&str> =
            ["configmap.yaml", "deployment.yaml"].into_iter().filter(|t| template(t).contains(&path)).collect();
        assert!(!named.is_empty(), "no setting points the broker at {path}");
        for name in named {
            assert_rendered_only_when(name, &path, when);
        }
    }
    // Secrets read into the environment, only when their key is given.
    let jwt_secret = "- name: JWT_SECRET\n              valueFrom:\n                secretKeyRef:";
    assert_rendered_only_when(
        "deployment.yaml",
        jwt_secret,
        &["auth.existingSecret.name", "auth.existingSecret.jwtSecretKey"],
    );
    // And the defaults mount none of them.
    let values = values();
    for value in ["tls.existingSecret", "database.tls.existingSecret", "auth.existingSecret.name"] {
        assert_eq!(lookup(&values, value), Some(&Value::from("")), "{value} is empty by default");
    }
}

#[test]
fn every_environment_variable_and_config_file_key_the_chart_sets_is_a_broker_setting() {
    // Environment variables: `- name: X` entries in upper case (volumes and ports are lower case).
    let deployment = template("deployment.yaml");
    let names: Vec<&str> = deployment
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- name: "))
        .filter(|name| name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .collect();
    for expected in ["JWT_SECRET", "QUEEN_AUTH__TOKENS_FILE", "JWT_ENABLED", "JWT_ALGORITHM", "JWT_PUBLIC_KEY"] {
        assert!(names.contains(&expected), "the deployment does not set {expected}");
    }
    for name in &names {
        let setting =
            env_setting(name).unwrap_or_else(|| panic!("{name} is neither an alias nor QUEEN_<SECTION>__<KEY>"));
        assert!(setting_exists(&setting), "{name} sets {setting}, which is not a broker setting");
    }
    // The keys the ConfigMap writes itself (those of values.config are checked on their own).
    let configmap = template("configmap.yaml");
    let file = configmap.split_once("queen.toml: |").expect("a queen.toml").1;
    let mut section: Option<String> = None;
    let mut keys = Vec::new();
    for line in file.lines().map(str::trim) {
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = (!header.contains("{{")).then(|| header.to_owned());
        } else if let Some((key, _)) = line.split_once(" = ")
            && !key.contains("{{")
        {
            let section = section.as_deref().unwrap_or_else(|| panic!("{key} is outside a literal section"));
            keys.push(format!("{section}.{key}"));
        }
    }
    for expected in
        ["http.tls_cert_file", "http.tls_key_file", "http.allowed_hosts", "database.sslmode", "database.sslrootcert"]
    {
        assert!(keys.iter().any(|k| k == expected), "the ConfigMap does not write {expected}");
    }
    for key in &keys {
        assert!(setting_exists(key), "the ConfigMap writes {key}, which is not a broker setting");
    }
    assert_rendered_only_when("configmap.yaml", "sslmode = ", &["database.tls.sslmode"]);
    for jwt in ["JWT_JWKS_URL", "JWT_ISSUER", "JWT_AUDIENCE", "JWT_PUBLIC_KEY"] {
        assert!(names.contains(&jwt), "the deployment does not set {jwt}");
    }
}

#[test]
fn the_probes_and_the_service_monitor_speak_https_exactly_when_tls_is_on() {
    let helpers = template("_helpers.tpl");
    let define = "define \"queen.scheme\"";
    let https = helpers.find("}}HTTPS{{").expect("queen.scheme says HTTPS") + 2;
    assert_eq!(guards_at(&helpers, https), [define.to_owned(), "if .Values.tls.existingSecret".to_owned()]);
    let http = helpers.find("}}HTTP{{ end").expect("queen.scheme says HTTP otherwise") + 2;
    assert_eq!(guards_at(&helpers, http), [define.to_owned(), "not (if .Values.tls.existingSecret)".to_owned()]);

    let deployment = template("deployment.yaml");
    let probes: Vec<&str> = deployment.split("httpGet:\n").skip(1).collect();
    assert_eq!(probes.len(), 3, "the start-up, liveness and readiness probes");
    for probe in probes {
        let block: Vec<&str> = probe.lines().take_while(|l| l.starts_with("              ")).collect();
        assert!(
            block.iter().any(|l| l.trim() == "scheme: {{ include \"queen.scheme\" . }}"),
            "a probe without the scheme of the listener: {block:#?}"
        );
    }
    let monitor = template("servicemonitor.yaml");
    assert!(
        monitor.contains("scheme: {{ include \"queen.scheme\" . | lower }}"),
        "the ServiceMonitor scrapes with the listener's scheme"
    );
    assert_rendered_only_when("servicemonitor.yaml", "tlsConfig:", &["tls.existingSecret"]);
    assert!(template("NOTES.txt").contains("include \"queen.scheme\""), "the notes give the URL with its scheme");
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
    // Relative settings (buffer.dir) resolve against the working directory, which the user owns.
    let workdir = dockerfile.lines().rev().find(|l| l.starts_with("WORKDIR ")).expect("a WORKDIR");
    let workdir = workdir.trim_start_matches("WORKDIR ").trim();
    assert!(dockerfile.contains(&format!("chown 10001 {workdir}")), "the broker's user owns {workdir}");
    assert!(user.contains("10001"));
}
