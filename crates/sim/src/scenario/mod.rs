//! Named scenarios: each table and figure of the papers as one command
//! (DESIGN.md §4). A scenario plans its runs, runs them (in parallel, with
//! deterministic results), and returns rows, the checks that compare the
//! rows with what the paper reports, and optionally a plot.

pub mod biswas93;
pub mod capfs05;
pub mod consistency;
pub mod kotz92;
pub mod paca96;
pub mod paca96_sessions;
pub mod vilayannur03;

use crate::plot::Panel;
use serde::Serialize;
use std::path::Path;
use thiserror::Error;

/// A scenario's name and what it reproduces.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub description: &'static str,
}

/// How to run scenarios.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    pub seed: u64,
    pub threads: usize,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            seed: crate::kotz92::KotzParams::default().seed,
            threads: crate::parallel::default_threads(),
        }
    }
}

/// One comparison of our result with the paper's claim.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub claim: String,
    pub pass: bool,
    pub detail: String,
}

/// The rows of a scenario's result.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Rows {
    Table(Vec<kotz92::TableRow>),
    Figure(Vec<kotz92::FigureRow>),
    Consistency(Vec<consistency::Row>),
    Capfs(Vec<capfs05::Row>),
    Paca(Vec<paca96::Row>),
    Vilayannur(Vec<vilayannur03::Row>),
    Biswas(Vec<biswas93::Row>),
}

/// What a scenario produced.
#[derive(Serialize)]
pub struct Output {
    pub scenario: String,
    pub description: String,
    pub seed: u64,
    pub rows: Rows,
    pub checks: Vec<Check>,
    pub notes: Vec<String>,
    #[serde(skip)]
    pub(crate) figure: Option<(String, Vec<Panel>)>,
    #[serde(skip)]
    pub(crate) text: String,
}

impl Output {
    /// The result as a text table in the paper's layout, with the checks.
    pub fn table(&self) -> String {
        let mut s = format!("{} — {}\n\n{}", self.scenario, self.description, self.text);
        if !self.checks.is_empty() {
            s.push_str("\nChecks against the paper:\n");
            for c in &self.checks {
                s.push_str(&format!(
                    "  [{}] {} — {}\n",
                    if c.pass { "ok" } else { "MISS" },
                    c.claim,
                    c.detail
                ));
            }
        }
        for n in &self.notes {
            s.push_str(&format!("\nNote: {n}\n"));
        }
        s
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plain data serialises")
    }

    /// Whether this scenario draws a figure.
    pub fn has_plot(&self) -> bool {
        self.figure.is_some()
    }

    /// Draws the figure as SVG.
    pub fn plot(&self, path: &Path) -> Result<(), ScenarioError> {
        let (title, panels) = self
            .figure
            .as_ref()
            .ok_or_else(|| ScenarioError::NoPlot(self.scenario.clone()))?;
        crate::plot::draw(path, title, panels).map_err(ScenarioError::Plot)
    }
}

#[derive(Debug, Error)]
pub enum ScenarioError {
    #[error("unknown scenario '{0}'; `parcache sim list` shows them all")]
    Unknown(String),
    #[error("scenario '{0}' is a table and has no plot")]
    NoPlot(String),
    #[error("{0}")]
    Plot(String),
}

/// Every scenario, in the order `sim list` shows them.
pub fn list() -> Vec<Scenario> {
    let mut all = kotz92::SCENARIOS.to_vec();
    all.extend(consistency::SCENARIOS);
    all.extend(capfs05::SCENARIOS);
    all.extend(paca96::SCENARIOS);
    all.extend(paca96_sessions::SCENARIOS);
    all.extend(vilayannur03::SCENARIOS);
    all.extend(biswas93::SCENARIOS);
    all
}

pub fn find(name: &str) -> Result<Scenario, ScenarioError> {
    list()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| ScenarioError::Unknown(name.to_string()))
}

/// How many model runs a scenario makes (to size a progress bar).
pub fn runs(name: &str) -> Result<usize, ScenarioError> {
    kotz92::runs(name)
        .or_else(|| consistency::runs(name))
        .or_else(|| capfs05::runs(name))
        .or_else(|| paca96::runs(name))
        .or_else(|| paca96_sessions::runs(name))
        .or_else(|| vilayannur03::runs(name))
        .or_else(|| biswas93::runs(name))
        .ok_or_else(|| ScenarioError::Unknown(name.to_string()))
}

/// Runs a scenario; `done` is called after each model run.
pub fn run(name: &str, opts: &RunOptions, done: &(dyn Fn() + Sync)) -> Result<Output, ScenarioError> {
    let mut out = kotz92::run(name, opts, done)
        .or_else(|| consistency::run(name, opts, done))
        .or_else(|| capfs05::run(name, opts, done))
        .or_else(|| paca96::run(name, opts, done))
        .or_else(|| paca96_sessions::run(name, opts, done))
        .or_else(|| vilayannur03::run(name, opts, done))
        .or_else(|| biswas93::run(name, opts, done))
        .ok_or_else(|| ScenarioError::Unknown(name.to_string()))?;
    let s = find(name)?;
    out.scenario = s.name.to_string();
    out.description = s.description.to_string();
    Ok(out)
}
