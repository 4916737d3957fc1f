//! The Grafana dashboard the chart ships (`charts/lockstep/dashboards/
//! lockstep.json`) shows real data: it has the shape Grafana loads (panels
//! with queries, unique panel ids, a Prometheus data source variable, every
//! query scoped by the dashboard's variables), and every metric its PromQL
//! queries is one the real binary exports on `GET /metrics`.
//!
//! Why a test and not a review: a metric renamed in the code, or a
//! name misspelt in the dashboard, leaves a panel silently empty ("No data")
//! and nothing else complains. Here lockstep runs in front of the test
//! backend, serves a little traffic of every kind the dashboard charts (so
//! labelled families have their series), and the dashboard's metric names
//! are looked up in that scrape.
//!
//! The rendering of the dashboard's ConfigMap (label, opt-in) is checked
//! with the rest of the chart in tests/chart.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{json, Value};

use common::{sqlite_url, Backend, Client, Lockstep};

/// The matchers every metric selector of a panel carries, so the
/// dashboard's variables narrow every panel.
const SCOPE: [&str; 3] = [
    "namespace=~\"$namespace\"",
    "job=~\"$job\"",
    "instance=~\"$instance\"",
];

fn dashboard() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/lockstep/dashboards/lockstep.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()))
}

/// Every panel, those nested in collapsed rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("a panels array") {
        out.push(panel);
        if let Some(nested) = panel["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

/// Every PromQL expression of the dashboard, with where it comes from:
/// the panels' targets and the query variables.
fn expressions(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_else(|| {
                panic!(
                    "panel {:?}: a target without expr: {target}",
                    panel["title"]
                )
            });
            out.push((format!("panel {}", panel["title"]), expr.to_owned()));
        }
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if var["type"] == "query" {
            let query = match &var["query"] {
                Value::String(q) => q.clone(),
                q => q["query"].as_str().unwrap_or_default().to_owned(),
            };
            out.push((format!("variable {}", var["name"]), query));
        }
    }
    out
}

/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names a PromQL expression selects (in order, with repeats),
/// each with the text of its `{…}` selector ("" when it has none).
///
/// A small scanner, enough for what dashboards write: string literals,
/// range selectors and subqueries (`[…]`), Grafana variables (`$x`,
/// `${x}`), label matchers (`{…}`) and label lists (`by (…)`) are skipped,
/// so a label name, a label value, a duration or a function name is never
/// taken for a metric. Of the identifiers left, those that start with
/// `lockstep_` are metric names (lockstep prefixes all of its own).
fn metric_names(expr: &str) -> Vec<(String, String)> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out: Vec<(String, String)> = Vec::new();
    let mut i = 0;
    // Skips from an opening delimiter at `i` to just past its closing one,
    // stepping over string literals inside; returns the text between.
    let skip_group = |i: &mut usize, open: char, close: char| -> String {
        let start = *i + 1;
        let mut depth = 0;
        while *i < chars.len() {
            let c = chars[*i];
            if c == '"' || c == '\'' || c == '`' {
                skip_string(&chars, i);
                continue;
            }
            if c == open {
                depth += 1;
            } else if c == close {
                depth -= 1;
                if depth == 0 {
                    *i += 1;
                    return chars[start..*i - 1].iter().collect();
                }
            }
            *i += 1;
        }
        panic!("unclosed {open:?} in {expr:?}");
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            skip_string(&chars, &mut i);
        } else if c == '[' {
            skip_group(&mut i, '[', ']');
        } else if c == '{' {
            let selector = skip_group(&mut i, '{', '}');
            // The matchers of the metric just before, if it is one.
            if let Some(last) = out.last_mut() {
                if last.1.is_empty() && last_was_metric(&chars, i, &selector, &last.0) {
                    last.1 = selector;
                }
            }
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                skip_group(&mut i, '{', '}');
            } else {
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
            }
        } else if is_ident_start(c) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            if LABEL_LISTS.contains(&word.as_str()) && chars.get(j) == Some(&'(') {
                i = j;
                skip_group(&mut i, '(', ')');
            } else if word.starts_with("lockstep_") {
                out.push((word, String::new()));
            }
        } else if c.is_ascii_digit() {
            // A number (0.99, 1e3): its letters are no identifier.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Whether the `{…}` that ended at `end` directly follows the metric
/// `name` (only whitespace between them).
fn last_was_metric(chars: &[char], end: usize, selector: &str, name: &str) -> bool {
    let open = end - selector.chars().count() - 2;
    let before: String = chars[..open].iter().collect();
    before.trim_end().ends_with(name)
}

fn skip_string(chars: &[char], i: &mut usize) {
    let quote = chars[*i];
    *i += 1;
    while *i < chars.len() {
        match chars[*i] {
            '\\' if quote != '`' => *i += 2,
            c if c == quote => {
                *i += 1;
                return;
            }
            _ => *i += 1,
        }
    }
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The series names a Prometheus scraping `text` stores: every sample's
/// name, and every declared family (`# TYPE`) even before it has a series,
/// a histogram as its `_bucket`, `_sum` and `_count` series.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(decl) = line.strip_prefix("# TYPE ") {
            let (name, kind) = decl.split_once(' ').expect("# TYPE name kind");
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            } else {
                names.insert(name.to_owned());
            }
        } else if !line.is_empty() && !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

/// The sample names of `text` (series that have a value now).
fn sampled_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l[..l.find(['{', ' ']).unwrap_or(l.len())].to_owned())
        .collect()
}

/// `"where: name"` for every metric of `expressions` that `exported` lacks.
fn unknown_metrics(expressions: &[(String, String)], exported: &BTreeSet<String>) -> Vec<String> {
    let mut unknown = Vec::new();
    for (place, expr) in expressions {
        for (name, _) in metric_names(expr) {
            if !exported.contains(&name) {
                unknown.push(format!("{place}: {name} in {expr}"));
            }
        }
    }
    unknown
}

#[test]
fn the_scanner_finds_metric_names_and_nothing_else() {
    let expr = "histogram_quantile(0.99, sum by (le, lockstep_label) (rate(\
                lockstep_a_bucket{job=~\"$job\", x=\"lockstep_in_a_string\"}[$__rate_interval]))) \
                / on (instance) group_left (version) lockstep_b \
                + sum without (lockstep_c) (increase(lockstep_d_total[5m:1m])) * 1e3 \
                + ${lockstep_var} + $lockstep_var2";
    let names = metric_names(expr);
    assert_eq!(
        names,
        vec![
            (
                "lockstep_a_bucket".to_owned(),
                "job=~\"$job\", x=\"lockstep_in_a_string\"".to_owned()
            ),
            ("lockstep_b".to_owned(), String::new()),
            ("lockstep_d_total".to_owned(), String::new()),
        ]
    );
}

#[test]
fn the_dashboard_has_the_shape_grafana_loads() {
    let d = dashboard();
    for key in ["title", "uid"] {
        assert!(d[key].as_str().is_some_and(|s| !s.is_empty()), "no {key}");
    }
    assert!(d["schemaVersion"].as_u64().is_some(), "no schemaVersion");

    // A data source variable of type prometheus, and the scoping variables.
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no ${name} variable"))
    };
    let datasource = var("datasource");
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
    for name in ["namespace", "job", "instance"] {
        let v = var(name);
        assert_eq!(v["type"], "query", "${name}");
        assert_eq!(v["datasource"]["uid"], "${datasource}", "${name}");
        // "All" must match series without the label too (a Prometheus
        // outside Kubernetes has no namespace label).
        assert_eq!(v["includeAll"], true, "${name}");
        assert_eq!(v["allValue"], ".*", "${name}");
    }

    // Panels: unique ids, a place on the grid, and queries against the
    // chosen data source.
    let panels = panels(&d);
    let mut ids = BTreeSet::new();
    let mut queries = 0;
    for panel in &panels {
        let title = &panel["title"];
        let id = panel["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("panel {title} has no numeric id"));
        assert!(ids.insert(id), "panel id {id} ({title}) is used twice");
        for key in ["h", "w", "x", "y"] {
            assert!(
                panel["gridPos"][key].as_u64().is_some(),
                "panel {title}: no gridPos.{key}"
            );
        }
        let x = panel["gridPos"]["x"].as_u64().unwrap();
        let w = panel["gridPos"]["w"].as_u64().unwrap();
        assert!(x + w <= 24, "panel {title} is wider than the grid");
        if panel["type"] == "row" {
            continue;
        }
        assert!(
            panel["type"].as_str().is_some_and(|t| !t.is_empty()),
            "panel {title} has no type"
        );
        assert_eq!(
            panel["datasource"],
            json!({"type": "prometheus", "uid": "${datasource}"}),
            "panel {title}"
        );
        let targets = panel["targets"]
            .as_array()
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| panic!("panel {title} has no targets"));
        let mut refs = BTreeSet::new();
        for target in targets {
            let expr = target["expr"]
                .as_str()
                .filter(|e| !e.trim().is_empty())
                .unwrap_or_else(|| panic!("panel {title}: a target without expr"));
            let ref_id = target["refId"].as_str().expect("refId");
            assert!(refs.insert(ref_id), "panel {title}: refId {ref_id} twice");
            let names = metric_names(expr);
            assert!(
                !names.is_empty(),
                "panel {title}: {expr} queries no lockstep metric"
            );
            for (name, selector) in names {
                for matcher in SCOPE {
                    assert!(
                        selector.contains(matcher),
                        "panel {title}: {name} is not narrowed by {matcher} in {expr}"
                    );
                }
            }
            queries += 1;
        }
    }
    assert!(queries >= 20, "only {queries} queries");
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let backend = Backend::start();
    backend
        .seed("/articles/1", json!({"title": "dashboard"}))
        .await;
    let data = tempfile::tempdir().unwrap();
    let database = sqlite_url(data.path());
    let lockstep = Lockstep::builder()
        .upstream(backend.url())
        .database(&database)
        .start();
    let c = Client::new();
    let item = lockstep.proxy_url_for("/articles/1");
    let lock = lockstep.admin_url_for("/locks/job:dashboard");

    // One of each: a versioned read, a write, a stale write (conflict), a
    // passthrough, and a lock acquired, contended and released.
    let read = c.get(&item).send().await;
    assert_eq!(read.status, 200, "{read:?}");
    let write = c
        .patch(&item, json!({"title": "b"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(write.status, 200, "{write:?}");
    let stale = c
        .patch(&item, json!({"title": "c"}))
        .if_match(1)
        .send()
        .await;
    assert_eq!(stale.status, 409, "{stale:?}");
    let plain = c
        .get(lockstep.proxy_url_for("/echo/dashboard"))
        .send()
        .await;
    assert_eq!(plain.status, 200, "{plain:?}");
    let acquired = c
        .post(&lock, json!({"owner": "a", "ttl_ms": 30000}))
        .send()
        .await;
    assert_eq!(acquired.status, 200, "{acquired:?}");
    let contended = c
        .post(&lock, json!({"owner": "b", "ttl_ms": 30000}))
        .send()
        .await;
    assert_eq!(contended.status, 409, "{contended:?}");
    let released = c.delete(&lock).header("lock-owner", "a").send().await;
    assert_eq!(released.status, 204, "{released:?}");

    // A statement that fails: another process holds the SQLite file's
    // write lock for longer than lockstep's busy timeout (5 s), so the
    // acquire fails closed and the statement is counted as an error.
    let options: sqlx::sqlite::SqliteConnectOptions = database.parse().unwrap();
    let mut holder: sqlx::SqliteConnection =
        sqlx::Connection::connect_with(&options).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut holder)
        .await
        .unwrap();
    let busy = c
        .post(
            lockstep.admin_url_for("/locks/job:busy"),
            json!({"owner": "a", "ttl_ms": 30000}),
        )
        .send()
        .await;
    assert_eq!(busy.status, 503, "{busy:?}");
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();

    let scrape = c.get(lockstep.admin_url_for("/metrics")).send().await;
    assert_eq!(scrape.status, 200, "{scrape:?}");
    let text = scrape.text();
    let exported = exported_names(&text);
    let sampled = sampled_names(&text);

    let d = dashboard();
    let expressions = expressions(&d);
    let unknown = unknown_metrics(&expressions, &exported);
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics lockstep does not export:\n{}\n\nexported: {exported:?}",
        unknown.join("\n")
    );

    // The traffic made the labelled families the dashboard charts: every
    // queried metric has a series.
    let queried: BTreeSet<String> = expressions
        .iter()
        .flat_map(|(_, e)| metric_names(e))
        .map(|(name, _)| name)
        .collect();
    let empty: Vec<&String> = queried.difference(&sampled).collect();
    assert!(
        empty.is_empty(),
        "queried metrics without a series after the traffic: {empty:?}"
    );
    // The panels chart the families the operators asked for.
    for family in [
        "lockstep_http_requests_total",
        "lockstep_http_request_duration_seconds_bucket",
        "lockstep_version_conflicts_total",
        "lockstep_version_unknown_outcome_bumps_total",
        "lockstep_version_drift_bumps_total",
        "lockstep_lock_conflicts_total",
        "lockstep_lock_held_seconds_bucket",
        "lockstep_upstream_request_duration_seconds_bucket",
        "lockstep_db_query_duration_seconds_bucket",
    ] {
        assert!(queried.contains(family), "no panel queries {family}");
    }

    // The check fails on a name lockstep does not export: one letter off.
    let misspelt = [(
        "panel test".to_owned(),
        "sum(rate(lockstep_http_request_total{job=~\"$job\"}[$__rate_interval]))".to_owned(),
    )];
    assert_eq!(
        unknown_metrics(&misspelt, &exported).len(),
        1,
        "a misspelt metric went unnoticed"
    );
}
