//! The Helm chart (`charts/lockstep`) and the binary cannot drift apart:
//! every lockstep.toml the chart renders passes `lockstep check-config`,
//! the SQLite ones start a real lockstep that versions a read, the values
//! the chart refuses are refused with its own message, the chart's
//! values know exactly the keys of `config/lockstep.toml`, and the Grafana
//! dashboard renders only when asked for, with the sidecar's label (its
//! queries are checked against the binary in tests/dashboard.rs).
//!
//! helm comes from `LOCKSTEP_HELM` (scripts/test sets it), else
//! `.tools/bin/helm` (scripts/chart-tools puts it there). Without either the
//! tests fail, unless `LOCKSTEP_TEST_SKIP_HELM=1`, where they skip loudly.
//! scripts/chart-check validates the rendered manifests against Kubernetes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{check_config, Backend, Client, Lockstep};
use serde::Deserialize;
use serde_json::{json, Value};
use tempfile::TempDir;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    repo().join("charts/lockstep")
}

/// The helm binary, or `None` (after saying so) when the tests may skip.
fn helm() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LOCKSTEP_HELM") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "LOCKSTEP_HELM={} does not exist; run scripts/chart-tools",
            path.display()
        );
        return Some(path);
    }
    let tools = repo().join(".tools/bin/helm");
    if tools.is_file() {
        return Some(tools);
    }
    if std::env::var("LOCKSTEP_TEST_SKIP_HELM").as_deref() == Ok("1") {
        eprintln!(
            "SKIPPED: LOCKSTEP_TEST_SKIP_HELM=1 and no helm; the chart is NOT checked against the binary"
        );
        return None;
    }
    panic!(
        "no helm: run scripts/chart-tools (installs .tools/bin/helm), set LOCKSTEP_HELM, \
         or set LOCKSTEP_TEST_SKIP_HELM=1 to skip the chart tests"
    );
}

/// `helm template lockstep charts/lockstep [-f VALUES] [ARGS…]`.
fn render(helm: &Path, values: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(helm);
    cmd.arg("template").arg("lockstep").arg(chart());
    if let Some(values) = values {
        cmd.arg("-f").arg(values);
    }
    cmd.args(args).stdin(Stdio::null());
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", helm.display()))
}

/// Renders and returns the documents; panics with helm's message on failure.
fn rendered(helm: &Path, values: Option<&Path>, args: &[&str]) -> Vec<Value> {
    let output = render(helm, values, args);
    assert!(
        output.status.success(),
        "helm template with {values:?} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("helm prints UTF-8");
    yaml_documents(&text)
}

fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("helm printed valid YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The lockstep.toml of the rendered ConfigMap, if there is one.
fn lockstep_toml(docs: &[Value]) -> Option<String> {
    docs.iter()
        .find(|d| d["kind"] == "ConfigMap" && d["data"]["lockstep.toml"].is_string())
        .map(|d| d["data"]["lockstep.toml"].as_str().unwrap().to_owned())
}

/// `charts/lockstep/ci/*.yaml` (not the `unsafe/` ones), sorted.
fn ci_values() -> Vec<PathBuf> {
    yaml_files(&chart().join("ci"))
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The bearer token of [`with_test_secrets`]'s tokens file.
const TEST_TOKEN: &str = "chart-test-token-3c9a";

/// `toml` with the files the chart mounts from Secrets (TLS pair, admin
/// client CA, lock API tokens) replaced by test files in `dir`: one
/// self-signed certificate (also the CA) and a tokens file holding
/// [`TEST_TOKEN`]. The real ones exist only in the Pod.
fn with_test_secrets(toml: &str, dir: &Path) -> String {
    let pair = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = dir.join("tls.crt");
    let key = dir.join("tls.key");
    let tokens = dir.join("tokens");
    std::fs::write(&cert, pair.cert.pem()).unwrap();
    std::fs::write(&key, pair.signing_key.serialize_pem()).unwrap();
    std::fs::write(&tokens, format!("# test\n{TEST_TOKEN}\n")).unwrap();
    toml.lines()
        .map(|line| {
            let file = match line.split_once(" = ").map(|(k, _)| k) {
                Some("cert_file" | "admin_cert_file" | "admin_client_ca_file") => &cert,
                Some("key_file" | "admin_key_file") => &key,
                Some("api_tokens_file") => &tokens,
                _ => return line.to_owned(),
            };
            let (name, _) = line.split_once(" = ").unwrap();
            format!("{name} = {:?}", file.display().to_string())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes `toml` to a temp file and runs `lockstep check-config` on it.
fn check_toml(toml: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lockstep.toml");
    std::fs::write(&path, toml).unwrap();
    check_config(&path)
}

#[test]
fn every_config_the_chart_renders_passes_check_config() {
    let Some(helm) = helm() else { return };
    let mut cases: Vec<Option<PathBuf>> = vec![None];
    cases.extend(ci_values().into_iter().map(Some));
    let mut checked = Vec::new();
    for values in &cases {
        let docs = rendered(&helm, values.as_deref(), &[]);
        let Some(toml) = lockstep_toml(&docs) else {
            continue;
        };
        let secrets = tempfile::tempdir().unwrap();
        let toml = with_test_secrets(&toml, secrets.path());
        let output = check_toml(&toml);
        assert!(
            output.status.success(),
            "lockstep check-config refuses the config rendered from {values:?}:\n{}\n{toml}",
            stderr(&output)
        );
        checked.push(values.clone());
    }
    // Default values, sqlite-single, postgres-ha, sidecar-only at least.
    assert!(checked.len() >= 4, "only {checked:?} rendered a ConfigMap");
}

/// Starts lockstep from the config `values` render, in front of a real
/// backend on a fresh SQLite file, and does a versioned read. Returned in
/// drop order: lockstep stops before its database directory goes.
async fn serve_rendered_config(helm: &Path, values: Option<&Path>) -> (Lockstep, Backend, TempDir) {
    let docs = rendered(helm, values, &[]);
    let toml = lockstep_toml(&docs).expect("a ConfigMap with lockstep.toml");
    assert!(
        toml.contains("url = \"sqlite://"),
        "{values:?} is not a SQLite config:\n{toml}"
    );
    let backend = Backend::start();
    backend
        .seed("/articles/1", json!({"title": "from the chart"}))
        .await;
    let data = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", data.path().join("x.db").display());
    let lockstep = Lockstep::builder()
        .raw_config(toml)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--admin-listen")
        .arg("127.0.0.1:0")
        .arg("--upstream")
        .arg(backend.url())
        .arg("--database")
        .arg(&database)
        .start();
    let client = Client::new();
    let health = client.get(lockstep.admin_url_for("/healthz")).send().await;
    assert_eq!(health.status, 200, "{health:?}");
    let ready = client.get(lockstep.admin_url_for("/readyz")).send().await;
    assert_eq!(ready.status, 200, "{ready:?}");
    let read = client
        .get(lockstep.proxy_url_for("/articles/1"))
        .send()
        .await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(read.etag().as_deref(), Some("\"1\""), "{read:?}");
    assert_eq!(read.json()["version"], 1, "{read:?}");
    assert_eq!(read.json()["title"], "from the chart", "{read:?}");
    // The database file is the one given on the command line.
    assert!(data.path().join("x.db").exists());
    (lockstep, backend, data)
}

#[tokio::test]
async fn default_values_start_lockstep_and_version_a_read() {
    let Some(helm) = helm() else { return };
    let _running = serve_rendered_config(&helm, None).await;
}

#[tokio::test]
async fn sqlite_values_start_lockstep_with_their_settings() {
    let Some(helm) = helm() else { return };
    let values = chart().join("ci/sqlite-single.yaml");
    let (lockstep, _backend, _data) = serve_rendered_config(&helm, Some(&values)).await;
    let client = Client::new();
    // ci/sqlite-single.yaml sets require_precondition = true and
    // conflict_status = 412.
    let unconditional = client
        .patch(lockstep.proxy_url_for("/articles/1"), json!({"title": "x"}))
        .send()
        .await;
    assert_eq!(unconditional.status, 428, "{unconditional:?}");
    let stale = client
        .patch(lockstep.proxy_url_for("/articles/1"), json!({"title": "x"}))
        .if_match(7)
        .send()
        .await;
    assert_eq!(stale.status, 412, "{stale:?}");
    // exclusive_writes = true on the order lines: a matching If-None-Match
    // is answered from the version table (the backend has no such item).
    let cached = client
        .get(lockstep.proxy_url_for("/orders/1/lines/2"))
        .header("if-none-match", "\"1\"")
        .send()
        .await;
    assert_eq!(cached.status, 304, "{cached:?}");
    let lock = client
        .post(
            lockstep.admin_url_for("/locks/job:1"),
            json!({"owner": "chart", "ttl_ms": 5000}),
        )
        .send()
        .await;
    assert_eq!(lock.status, 200, "{lock:?}");
    assert_eq!(lock.json()["acquired"], true, "{lock:?}");
}

/// The volume mount of `name` in the lockstep container.
fn lockstep_mount<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no {name} mount in {container}"))
}

#[tokio::test]
async fn guarded_lock_values_mount_the_secrets_and_lockstep_enforces_the_tokens() {
    let Some(helm) = helm() else { return };
    let values = chart().join("ci/locks-guarded.yaml");
    let docs = rendered(&helm, Some(&values), &[]);
    let toml = lockstep_toml(&docs).unwrap();
    for line in [
        "admin_client_ca_file = \"/etc/lockstep/admin-client-ca/ca.pem\"",
        "api_tokens_file = \"/etc/lockstep/lock-tokens/tokens\"",
        "proxy_prefix = \"/_lockstep\"",
    ] {
        assert!(toml.contains(line), "no {line:?} in\n{toml}");
    }
    let pod = &of_kind(&docs, "Deployment")[0]["spec"]["template"]["spec"];
    let volumes = pod["volumes"].as_array().unwrap();
    for (volume, secret) in [
        ("lockstep-lock-tokens", "orders-lock-tokens"),
        ("lockstep-admin-client-ca", "orders-lock-clients-ca"),
    ] {
        let v = volumes
            .iter()
            .find(|v| v["name"] == volume)
            .unwrap_or_else(|| panic!("no {volume} volume: {volumes:?}"));
        assert_eq!(v["secret"]["secretName"], secret, "{v}");
    }
    let container = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "lockstep")
        .unwrap();
    let tokens = lockstep_mount(container, "lockstep-lock-tokens");
    assert_eq!(tokens["mountPath"], "/etc/lockstep/lock-tokens");
    // A subPath mount is never updated: rotation needs the whole Secret.
    assert!(tokens.get("subPath").is_none(), "{tokens}");
    assert_eq!(
        lockstep_mount(container, "lockstep-admin-client-ca")["mountPath"],
        "/etc/lockstep/admin-client-ca"
    );
    // The kubelet has no client certificate: TCP probes.
    for probe in ["livenessProbe", "readinessProbe"] {
        assert!(
            container[probe]["tcpSocket"].is_object(),
            "{probe}: {}",
            container[probe]
        );
    }

    // The rendered config, with test files for the Secrets, passes the
    // check and serves: the lock API on both listeners wants the token.
    // TLS is left out of the run (plain HTTP clients); tests/tls.rs covers
    // client certificates.
    let secrets = tempfile::tempdir().unwrap();
    let toml = with_test_secrets(&toml, secrets.path());
    let output = check_toml(&toml);
    assert!(output.status.success(), "{}\n{toml}", stderr(&output));
    let plain: String = toml
        .lines()
        .filter(|l| !l.contains("cert_file") && !l.contains("key_file") && !l.contains("ca_file"))
        .map(|l| format!("{l}\n"))
        .collect();
    let data = tempfile::tempdir().unwrap();
    let lockstep = Lockstep::builder()
        .raw_config(plain)
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--admin-listen")
        .arg("127.0.0.1:0")
        .arg("--database")
        .arg(format!("sqlite://{}", data.path().join("x.db").display()))
        .start();
    let client = Client::new();
    for url in [
        lockstep.proxy_url_for("/_lockstep/locks/job:1"),
        lockstep.admin_url_for("/locks/job:2"),
    ] {
        let body = json!({"owner": "chart", "ttl_ms": 5000});
        let refused = client.post(&url, body.clone()).send().await;
        assert_eq!(refused.status, 401, "{refused:?}");
        let lock = client
            .post(&url, body)
            .header("authorization", format!("Bearer {TEST_TOKEN}"))
            .send()
            .await;
        assert_eq!(lock.status, 200, "{lock:?}");
    }
}

#[test]
fn unsafe_values_are_refused_with_the_charts_own_message() {
    let Some(helm) = helm() else { return };
    let files = yaml_files(&chart().join("ci/unsafe"));
    for name in [
        "sqlite-3-replicas.yaml",
        "lease-not-above-timeout.yaml",
        "sqlite-emptydir-unacknowledged.yaml",
    ] {
        assert!(
            files.iter().any(|f| f.ends_with(name)),
            "ci/unsafe/{name} is missing"
        );
    }
    for values in files {
        let text = std::fs::read_to_string(&values).unwrap();
        let expected = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} has no '# expect:' line", values.display()));
        let output = render(&helm, Some(&values), &[]);
        assert!(
            !output.status.success(),
            "{} rendered; the chart must refuse it",
            values.display()
        );
        let message = stderr(&output);
        assert!(
            message.contains(expected),
            "{} was refused, but not with {expected:?}:\n{message}",
            values.display()
        );
    }
}

/// The documents of one kind.
fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// The Deployment's strategy type and its `lockstep-data` volume.
fn strategy_and_data_volume(docs: &[Value]) -> (String, Value) {
    let deployments = of_kind(docs, "Deployment");
    assert_eq!(deployments.len(), 1, "{docs:?}");
    let spec = &deployments[0]["spec"];
    let volume = spec["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "lockstep-data")
        .cloned()
        .expect("a lockstep-data volume");
    (
        spec["strategy"]["type"].as_str().unwrap().to_owned(),
        volume,
    )
}

#[test]
fn sqlite_versions_live_on_a_persistent_volume_claim_by_default() {
    let Some(helm) = helm() else { return };
    let docs = rendered(&helm, None, &[]);
    let claims = of_kind(&docs, "PersistentVolumeClaim");
    assert_eq!(claims.len(), 1, "the default renders no claim: {docs:?}");
    let claim = claims[0];
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1Gi");
    assert_eq!(claim["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    assert_eq!(
        claim["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    let (strategy, volume) = strategy_and_data_volume(&docs);
    // Never two Pods on one SQLite file, not even during a rollout.
    assert_eq!(strategy, "Recreate");
    assert_eq!(
        volume["persistentVolumeClaim"]["claimName"], claim["metadata"]["name"],
        "{volume}"
    );

    // Size and class come from the values; an existing claim replaces ours.
    let docs = rendered(
        &helm,
        None,
        &[
            "--set",
            "persistence.size=5Gi",
            "--set",
            "persistence.storageClass=fast-ssd",
        ],
    );
    let claim = of_kind(&docs, "PersistentVolumeClaim")[0];
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "5Gi");
    assert_eq!(claim["spec"]["storageClassName"], "fast-ssd");
    let docs = rendered(&helm, None, &["--set", "persistence.existingClaim=mine"]);
    assert!(of_kind(&docs, "PersistentVolumeClaim").is_empty());
    let (strategy, volume) = strategy_and_data_volume(&docs);
    assert_eq!(strategy, "Recreate");
    assert_eq!(volume["persistentVolumeClaim"]["claimName"], "mine");
}

#[test]
fn an_emptydir_for_sqlite_needs_the_acknowledgement_that_versions_reset() {
    let Some(helm) = helm() else { return };
    let output = render(&helm, None, &["--set", "persistence.enabled=false"]);
    assert!(
        !output.status.success(),
        "an emptyDir rendered without the acknowledgement"
    );
    let message = stderr(&output);
    for words in [
        "lockstep chart: persistence.enabled=false puts the SQLite database on an emptyDir",
        "every version starts again at 1",
        "persistence.ephemeral.iUnderstandVersionsResetOnReschedule=true",
    ] {
        assert!(message.contains(words), "no {words:?} in:\n{message}");
    }

    let docs = rendered(
        &helm,
        None,
        &[
            "--set",
            "persistence.enabled=false",
            "--set",
            "persistence.ephemeral.iUnderstandVersionsResetOnReschedule=true",
        ],
    );
    assert!(of_kind(&docs, "PersistentVolumeClaim").is_empty());
    let (strategy, volume) = strategy_and_data_volume(&docs);
    assert_eq!(strategy, "Recreate");
    assert_eq!(volume["emptyDir"], json!({}), "{volume}");

    // PostgreSQL keeps nothing in the Pod: no volume, no acknowledgement.
    let docs = rendered(
        &helm,
        None,
        &[
            "--set",
            "persistence.enabled=false",
            "--set",
            "database.existingSecret=db",
        ],
    );
    assert!(of_kind(&docs, "PersistentVolumeClaim").is_empty());
}

#[test]
fn tls_values_render_keys_the_binary_knows() {
    let Some(helm) = helm() else { return };
    let docs = rendered(
        &helm,
        None,
        &[
            "--set",
            "tls.existingSecret=lockstep-tls",
            "--set",
            "tls.admin=true",
        ],
    );
    let toml = lockstep_toml(&docs).unwrap();
    for line in [
        "cert_file = \"/etc/lockstep/tls/tls.crt\"",
        "key_file = \"/etc/lockstep/tls/tls.key\"",
        "admin_cert_file = \"/etc/lockstep/tls/tls.crt\"",
        "admin_key_file = \"/etc/lockstep/tls/tls.key\"",
    ] {
        assert!(toml.contains(line), "no {line:?} in\n{toml}");
    }
    let output = check_toml(&toml);
    if output.status.success() {
        return;
    }
    let message = stderr(&output);
    // The files exist only in the Pod: a check that opens them fails here,
    // and that still shows the keys were understood.
    if message.contains("/etc/lockstep/tls/") {
        eprintln!("check-config read the TLS keys and looked for the files: {message}");
        return;
    }
    // Until lockstep documents the TLS keys in config/lockstep.toml, it may
    // not know them yet; once it does, the chart must write the same names.
    let documented = std::fs::read_to_string(repo().join("config/lockstep.toml")).unwrap();
    if !documented.contains("cert_file") {
        eprintln!(
            "SKIPPED: lockstep does not have the TLS keys yet (config/lockstep.toml names no \
             cert_file); check-config said: {message}"
        );
        return;
    }
    panic!("check-config refuses the chart's TLS keys:\n{message}\n{toml}");
}

/// `section.key` names of a TOML-like tree (`resources` left out).
fn keys(tree: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (section, table) in tree.as_object().expect("a table of sections") {
        if section == "resources" {
            continue;
        }
        for key in table.as_object().expect("a section is a table").keys() {
            out.insert(format!("{section}.{key}"));
        }
    }
    out
}

#[test]
fn chart_values_know_every_config_key_with_its_default() {
    // Needs no helm: values.yaml against config/lockstep.toml.
    let values: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap())
            .unwrap();
    let chart_config = &values["config"];
    let shipped: toml::Table = std::fs::read_to_string(repo().join("config/lockstep.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let shipped = serde_json::to_value(&shipped).unwrap();
    // Set by the chart from its ports, backend and database values.
    let chart_owned: BTreeSet<String> = [
        "server.listen",
        "server.admin_listen",
        "server.cert_file",
        "server.key_file",
        "server.admin_cert_file",
        "server.admin_key_file",
        "upstream.url",
        "upstream.ca_file",
        "database.url",
        "locks.api_tokens_file",
        "server.admin_client_ca_file",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let in_chart = keys(chart_config);
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(chart().join("values.schema.json")).unwrap())
            .unwrap();
    let sections = &schema["properties"]["config"]["properties"];
    let mut in_schema = BTreeSet::new();
    for (section, table) in sections.as_object().unwrap() {
        if section == "resources" {
            continue;
        }
        for key in table["properties"].as_object().unwrap().keys() {
            in_schema.insert(format!("{section}.{key}"));
        }
    }
    assert_eq!(
        in_chart, in_schema,
        "charts/lockstep/values.yaml `config` and values.schema.json must list the same keys"
    );
    let in_shipped: BTreeSet<String> = keys(&shipped).difference(&chart_owned).cloned().collect();
    assert_eq!(
        in_chart, in_shipped,
        "charts/lockstep/values.yaml `config` and config/lockstep.toml must list the same keys"
    );
    for key in &in_chart {
        let (section, name) = key.split_once('.').unwrap();
        let ours = &chart_config[section][name];
        let theirs = &shipped[section][name];
        // Logs are JSON in a cluster (one object per line for collectors).
        if key == "log.format" {
            assert_eq!(ours, "json");
            continue;
        }
        assert!(
            ours == theirs || ours.as_f64().is_some() && ours.as_f64() == theirs.as_f64(),
            "{key}: the chart's default {ours} differs from config/lockstep.toml's {theirs}"
        );
    }
}

/// The ConfigMaps holding a Grafana dashboard (`lockstep.json`).
fn dashboards(docs: &[Value]) -> Vec<&Value> {
    of_kind(docs, "ConfigMap")
        .into_iter()
        .filter(|d| d["data"].get("lockstep.json").is_some())
        .collect()
}

#[test]
fn the_grafana_dashboard_renders_only_when_enabled_with_the_sidecars_label() {
    let Some(helm) = helm() else { return };
    let docs = rendered(&helm, None, &[]);
    assert!(dashboards(&docs).is_empty(), "rendered by default");
    assert!(
        !serde_json::to_string(&docs)
            .unwrap()
            .contains("grafana_dashboard"),
        "the sidecar's label on something by default"
    );

    let docs = rendered(&helm, None, &["--set", "dashboard.enabled=true"]);
    let found = dashboards(&docs);
    assert_eq!(found.len(), 1, "{docs:?}");
    let map = found[0];
    assert_eq!(map["metadata"]["name"], "lockstep-dashboard");
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        map["metadata"]["labels"]["app.kubernetes.io/name"],
        "lockstep"
    );
    assert!(map["metadata"].get("annotations").is_none(), "{map}");
    assert!(map["metadata"].get("namespace").is_none(), "{map}");
    // The chart's file as it is: no template touched it.
    let shipped: Value = serde_json::from_str(
        &std::fs::read_to_string(chart().join("dashboards/lockstep.json")).unwrap(),
    )
    .unwrap();
    let rendered_json: Value =
        serde_json::from_str(map["data"]["lockstep.json"].as_str().unwrap()).unwrap();
    assert_eq!(rendered_json, shipped);

    // The sidecar's label, folder annotation and namespace are the user's.
    let docs = rendered(
        &helm,
        None,
        &[
            "--set",
            "dashboard.enabled=true",
            "--set",
            "dashboard.label=example.com/dashboard",
            "--set-string",
            "dashboard.labelValue=yes",
            "--set",
            "dashboard.folder=Shop services",
            "--set",
            "dashboard.folderAnnotation=k8s-sidecar-target-directory",
            "--set",
            "dashboard.namespace=monitoring",
            "--set",
            "dashboard.labels.team=orders",
            "--set",
            "dashboard.annotations.owner=platform",
        ],
    );
    let map = dashboards(&docs)[0];
    let meta = &map["metadata"];
    assert_eq!(meta["namespace"], "monitoring");
    assert_eq!(meta["labels"]["example.com/dashboard"], "yes");
    assert!(meta["labels"].get("grafana_dashboard").is_none(), "{meta}");
    assert_eq!(meta["labels"]["team"], "orders");
    assert_eq!(
        meta["annotations"],
        json!({"k8s-sidecar-target-directory": "Shop services", "owner": "platform"})
    );

    // With sidecarOnly too: the metrics are the same whoever owns the Pod.
    let docs = rendered(
        &helm,
        Some(&chart().join("ci/sidecar-only.yaml")),
        &["--set", "dashboard.enabled=true"],
    );
    assert_eq!(dashboards(&docs).len(), 1, "{docs:?}");
    assert!(lockstep_toml(&docs).is_some());

    // A label key Kubernetes would refuse is refused at render time.
    let output = render(
        &helm,
        None,
        &[
            "--set",
            "dashboard.enabled=true",
            "--set",
            "dashboard.label=not a key",
        ],
    );
    assert!(!output.status.success(), "an invalid label key rendered");
    assert!(
        stderr(&output).contains("/dashboard/label"),
        "{}",
        stderr(&output)
    );
}
