//! `consistency-check`: every consistency plug-in run in the model of
//! several nodes and a server (`crate::consistency`), its histories checked
//! against the promises each plug-in makes (DESIGN.md §3; 2005 §3.6), with
//! the messages each needs. Not a table of a paper: the check the later
//! CAPFS scenarios build on.

use super::{Check, Output, Rows, RunOptions, Scenario};
use crate::consistency::history::{check, promises, Promise};
use crate::consistency::model::{run as run_model, Params};
use parcache_core::ConsistencyKind;
use serde::Serialize;

pub const SCENARIOS: [Scenario; 1] = [Scenario {
    name: "consistency-check",
    description:
        "every consistency plug-in, 3 nodes sharing a file of 4 blocks, histories checked against each promise",
}];

/// Seeds per plug-in.
const SEEDS: u64 = 20;

/// One plug-in's result.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub plugin: String,
    pub promises: Vec<String>,
    pub operations: usize,
    pub messages: u64,
    /// Reads that broke close-to-open, and read-after-write.
    pub broke_close_to_open: usize,
    pub broke_read_after_write: usize,
}

pub fn runs(name: &str) -> Option<usize> {
    (name == SCENARIOS[0].name).then_some(ConsistencyKind::ALL.len())
}

pub fn run(name: &str, opts: &RunOptions, done: &(dyn Fn() + Sync)) -> Option<Output> {
    if name != SCENARIOS[0].name {
        return None;
    }
    let rows: Vec<Row> = crate::parallel::map(
        &ConsistencyKind::ALL,
        opts.threads,
        |&kind| {
            let mut row = Row {
                plugin: kind.to_string(),
                promises: promises(kind).iter().map(|p| p.name().to_string()).collect(),
                operations: 0,
                messages: 0,
                broke_close_to_open: 0,
                broke_read_after_write: 0,
            };
            for s in 0..SEEDS {
                let o = run_model(
                    kind,
                    &Params {
                        seed: opts.seed.wrapping_add(s),
                        ..Params::default()
                    },
                );
                row.operations += o.history.len();
                row.messages += o.messages;
                row.broke_close_to_open += check(&o.history, &o.applied, Promise::CloseToOpen).len();
                row.broke_read_after_write += check(&o.history, &o.applied, Promise::ReadAfterWrite).len();
            }
            row
        },
        done,
    );
    let mut text = format!(
        "{:<15} {:<32} {:>10} {:>10} {:>14} {:>17}\n",
        "plug-in", "promises", "operations", "messages", "broke c-to-o", "broke read-after-w"
    );
    for r in &rows {
        text.push_str(&format!(
            "{:<15} {:<32} {:>10} {:>10} {:>14} {:>17}\n",
            r.plugin,
            if r.promises.is_empty() {
                "(none)".to_string()
            } else {
                r.promises.join(", ")
            },
            r.operations,
            r.messages,
            r.broke_close_to_open,
            r.broke_read_after_write
        ));
    }
    let mut checks = Vec::new();
    for (kind, r) in ConsistencyKind::ALL.iter().zip(&rows) {
        for p in promises(*kind) {
            let broke = match p {
                Promise::CloseToOpen => r.broke_close_to_open,
                Promise::ReadAfterWrite => r.broke_read_after_write,
            };
            checks.push(Check {
                claim: format!("{} keeps {}", r.plugin, p.name()),
                pass: broke == 0,
                detail: format!("{broke} reads broke it in {} operations", r.operations),
            });
        }
    }
    let by = |name: &str| rows.iter().find(|r| r.plugin == name).expect("every plug-in runs");
    checks.push(Check {
        claim: "the checker has teeth: none breaks close-to-open".into(),
        pass: by("none").broke_close_to_open > 0,
        detail: format!("{} reads", by("none").broke_close_to_open),
    });
    checks.push(Check {
        claim: "close-to-open does not give read-after-write (readers keep their open's view)".into(),
        pass: by("close-to-open").broke_read_after_write > 0,
        detail: format!("{} reads", by("close-to-open").broke_read_after_write),
    });
    checks.push(Check {
        claim: "stronger promises cost messages: sprite and posix send more than none".into(),
        pass: by("sprite").messages > by("none").messages && by("posix").messages > by("none").messages,
        detail: format!(
            "none {}, posix {}, sprite {}",
            by("none").messages,
            by("posix").messages,
            by("sprite").messages
        ),
    });
    Some(Output {
        scenario: String::new(),
        description: String::new(),
        seed: opts.seed,
        rows: Rows::Consistency(rows),
        checks,
        notes: vec![format!(
            "{SEEDS} seeds per plug-in; 3 nodes, 40 sessions each of up to 5 reads and writes, 100 us one-way latency, delayed write-back without eviction"
        )],
        figure: None,
        text,
    })
}
