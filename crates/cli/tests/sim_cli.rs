//! The `parcache sim` command line, run as a user runs it.

use crate::common;
use common::parcache;

#[test]
fn list_names_every_scenario() {
    let (ok, out, _) = parcache(&["sim", "list"]);
    assert!(ok);
    for name in [
        "kotz92-table",
        "kotz92-fig1",
        "kotz92-fig2",
        "kotz92-fig3",
        "kotz92-fig4",
        "kotz92-fig5",
        "capfs05-read",
        "paca96-sprite",
        "paca96-bandwidth",
        "all",
    ] {
        assert!(out.lines().any(|l| l.starts_with(name)), "{name} missing from:\n{out}");
    }
}

#[test]
fn table_json_has_the_documented_fields() {
    let (ok, out, err) = parcache(&["sim", "run", "kotz92-table", "--format", "json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["scenario"], "kotz92-table");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 12);
    for r in rows {
        for f in ["pattern", "record_blocks", "cache", "seconds", "paper_seconds"] {
            assert!(!r[f].is_null(), "row lacks {f}: {r}");
        }
        assert!(["none", "write-back"].contains(&r["cache"].as_str().unwrap()));
        assert!([1.0, 0.25].contains(&r["record_blocks"].as_f64().unwrap()));
    }
}

#[test]
fn figure_json_rows_and_plot() {
    let dir = std::env::temp_dir().join(format!("parcache-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("fig1.svg");
    let (ok, out, err) = parcache(&[
        "sim",
        "run",
        "kotz92-fig1",
        "--format",
        "json",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 40);
    for f in ["pattern", "policy", "buffers", "record_blocks", "compute_ms", "seconds"] {
        assert!(!rows[0][f].is_null(), "row lacks {f}");
    }
    let body = std::fs::read_to_string(&svg).unwrap();
    assert!(
        body.starts_with("<svg") && body.contains("write-full"),
        "not an SVG with a legend"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn free_parameters_reach_the_bare_model() {
    let (ok, out, err) = parcache(&[
        "sim",
        "kotz",
        "--pattern",
        "lw1",
        "--buffers",
        "0",
        "--request-overhead-ms",
        "0",
        "--buffer-overhead-ms",
        "0",
        "--format",
        "json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["result"]["seconds"].as_f64().unwrap(), 120.0);
}

#[test]
fn bad_input_is_named_and_fails() {
    let (ok, _, err) = parcache(&["sim", "run", "kotz93-table"]);
    assert!(!ok && err.contains("unknown scenario 'kotz93-table'"), "{err}");
    let (ok, _, err) = parcache(&["sim", "kotz", "--buffers", "5"]);
    assert!(
        !ok && err.contains("--buffers 5") && err.contains("20 processes"),
        "{err}"
    );
    let (ok, _, err) = parcache(&["sim", "kotz", "--policy", "write-fast"]);
    assert!(!ok && err.contains("write-fast"), "{err}");
    let (ok, _, err) = parcache(&["sim", "kotz", "--record-blocks", "0.3"]);
    assert!(!ok && err.contains("--record-blocks 0.3"), "{err}");
    // Options for one scenario, given with several: named, nothing run.
    let (ok, _, err) = parcache(&["sim", "run", "all", "--plot", "/nonexistent/x.svg"]);
    assert!(!ok && err.contains("--plot") && err.contains("'all'"), "{err}");
    let (ok, _, err) = parcache(&["sim", "run", "kotz92-*", "--format", "json"]);
    assert!(
        !ok && err.contains("--format json") && err.contains("'kotz92-*'"),
        "{err}"
    );
}

/// A pattern runs one paper's scenarios as `all` runs every one (the
/// suite's golden tests run each scenario and draw its plot; a second run
/// of all of them here would take minutes): the results and plots of each
/// in the directory, nothing of the others, and numbers equal to the
/// simulator's golden files.
#[test]
fn a_pattern_writes_results_and_plots_as_all_does() {
    let dir = std::env::temp_dir().join(format!("parcache-all-{}", std::process::id()));
    let (ok, out, err) = parcache(&["sim", "run", "kotz92-*", "--out", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("kotz92-fig5") && !out.contains("capfs05"), "{out}");
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../sim/tests/golden");
    for n in ["table", "fig1", "fig2", "fig3", "fig4", "fig5"] {
        let json = std::fs::read_to_string(dir.join(format!("kotz92-{n}.json"))).unwrap();
        let want = std::fs::read_to_string(golden.join(format!("kotz92-{n}.json"))).unwrap();
        assert_eq!(
            json.trim_end(),
            want.trim_end(),
            "kotz92-{n}.json differs from the golden file"
        );
        assert!(dir.join(format!("kotz92-{n}.txt")).exists(), "kotz92-{n}.txt missing");
        if n != "table" {
            assert!(dir.join(format!("kotz92-{n}.svg")).exists(), "kotz92-{n}.svg missing");
        }
    }
    let written = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(written, 6 * 2 + 5, "files other than the 1992 scenarios' written");
    let (ok, _, err) = parcache(&["sim", "run", "kotz93-*", "--out", dir.to_str().unwrap()]);
    assert!(!ok && err.contains("no scenario matches 'kotz93-*'"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
