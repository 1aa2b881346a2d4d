//! `import parcache` (crates/py/python/parcache wraps this module): the
//! simulator's scenarios, trace replay and the policy advisor, returning
//! rows as Python dicts, and the client library (read and write cluster
//! files without a mount). Results are the CLI's (`parcache sim run`,
//! `sim replay`, `advise`, `cp`), computed by the same code.

use parcache_client::Fs;
use parcache_sim::replay::advise::{self as advisor, RankBy, Space};
use parcache_sim::replay::{self as rp, Choice, ClusterModel};
use parcache_sim::scenario::{self, RunOptions};
use parcache_sim::trace::{self, Trace};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use std::sync::Arc;

/// A JSON value as Python objects (dicts, lists, str, int, float, None).
fn to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<PyObject> {
    use serde_json::Value as V;
    Ok(match v {
        V::Null => py.None(),
        V::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        V::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any().unbind(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any().unbind(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any().unbind(),
        },
        V::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        V::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(to_py(py, x)?)?;
            }
            l.into_any().unbind()
        }
        V::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any().unbind()
        }
    })
}

fn value_err(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// The names and descriptions of the simulator's scenarios.
#[pyfunction]
fn scenarios(py: Python<'_>) -> PyResult<PyObject> {
    let v: Vec<serde_json::Value> = scenario::list()
        .iter()
        .map(|s| serde_json::json!({"name": s.name, "description": s.description}))
        .collect();
    to_py(py, &serde_json::Value::Array(v))
}

/// Runs a named scenario (as `parcache sim run NAME`): a dict with its
/// rows, the checks against the paper and notes.
#[pyfunction]
#[pyo3(signature = (name, seed=None, threads=None))]
fn run_scenario(py: Python<'_>, name: &str, seed: Option<u64>, threads: Option<usize>) -> PyResult<PyObject> {
    let mut opts = RunOptions::default();
    if let Some(s) = seed {
        opts.seed = s;
    }
    if let Some(t) = threads {
        opts.threads = t.max(1);
    }
    let name = name.to_string();
    let out = py
        .allow_threads(move || scenario::run(&name, &opts, &|| {}).map(|o| o.json()))
        .map_err(value_err)?;
    let v: serde_json::Value = serde_json::from_str(&out).map_err(value_err)?;
    to_py(py, &v)
}

fn load(path: &str, window: Option<(f64, f64)>) -> PyResult<Trace> {
    let t = trace::load(std::path::Path::new(path)).map_err(value_err)?;
    Ok(match window {
        Some((a, b)) if b > a => t.window(a, b),
        Some((a, b)) => {
            return Err(value_err(format!(
                "window ({a}, {b}): the end must come after the start"
            )))
        }
        None => t,
    })
}

/// A cluster model from None (the built-in one), a dict of keys, or the
/// path of a TOML file (`parcache sim calibrate-cluster` writes one).
fn cluster_of(c: Option<&Bound<'_, PyAny>>) -> PyResult<ClusterModel> {
    let Some(c) = c else {
        return Ok(ClusterModel::default());
    };
    if let Ok(path) = c.extract::<String>() {
        let text = std::fs::read_to_string(&path).map_err(|e| PyOSError::new_err(format!("{path}: {e}")))?;
        return ClusterModel::from_toml(&text).map_err(|e| value_err(format!("{path}: {e}")));
    }
    let d = c.downcast::<PyDict>()?;
    let mut text = String::new();
    for (k, v) in d.iter() {
        let k: String = k.extract()?;
        let v = if let Ok(s) = v.extract::<String>() {
            format!("{s:?}")
        } else {
            v.str()?.to_string().to_lowercase()
        };
        text.push_str(&format!("{k} = {v}\n"));
    }
    ClusterModel::from_toml(&text).map_err(|e| value_err(format!("cluster: {e}")))
}

fn outcome_json(o: &rp::Outcome) -> serde_json::Value {
    let mut v = serde_json::to_value(o).expect("an outcome serialises");
    v.as_object_mut().expect("an object").remove("file_time");
    v
}

fn settings(c: &Choice) -> serde_json::Value {
    c.settings()
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.clone())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Replays a trace under one combination of policies (as `parcache sim
/// replay`): a dict with the trace's summary, the policies and the outcome.
#[pyfunction]
#[pyo3(signature = (trace, policies=None, cluster=None, window=None))]
fn replay(
    py: Python<'_>,
    trace: &str,
    policies: Option<&Bound<'_, PyDict>>,
    cluster: Option<&Bound<'_, PyAny>>,
    window: Option<(f64, f64)>,
) -> PyResult<PyObject> {
    let t = load(trace, window)?;
    let model = cluster_of(cluster)?;
    let mut choice = Choice::default();
    if let Some(p) = policies {
        for (k, v) in p.iter() {
            let (k, v): (String, String) = (k.extract()?, v.extract()?);
            choice.set(&format!("{k}={v}")).map_err(value_err)?;
        }
    }
    let o = py
        .allow_threads(|| rp::replay(&t, &model, &choice))
        .map_err(value_err)?;
    let v = serde_json::json!({
        "trace": trace,
        "summary": t.summary(),
        "notes": t.notes,
        "policies": settings(&choice),
        "outcome": outcome_json(&o),
    });
    to_py(py, &v)
}

/// Sweeps the combinations a trace's sharing allows (as `parcache
/// advise`): a dict with `ranked` (best first; each with its policies and
/// outcome), `directories` (a recommendation each) and `sharing`.
/// `only` narrows keys: {"write": ["write-back", "write-through"]}.
#[pyfunction]
#[pyo3(signature = (trace, only=None, cluster=None, window=None, threads=None, rank_by="io-time"))]
fn advise(
    py: Python<'_>,
    trace: &str,
    only: Option<&Bound<'_, PyDict>>,
    cluster: Option<&Bound<'_, PyAny>>,
    window: Option<(f64, f64)>,
    threads: Option<usize>,
    rank_by: &str,
) -> PyResult<PyObject> {
    let t = load(trace, window)?;
    let model = cluster_of(cluster)?;
    let by = match rank_by {
        "io-time" => RankBy::IoTime,
        "elapsed" => RankBy::Elapsed,
        other => return Err(value_err(format!("rank_by={other:?}: 'io-time' or 'elapsed'"))),
    };
    let share = advisor::sharing(&t);
    let nodes = if model.nodes == 0 { t.nodes.len() } else { model.nodes };
    let mut space = Space::for_trace(&share, nodes);
    if let Some(o) = only {
        for (k, v) in o.iter() {
            let k: String = k.extract()?;
            let vs: Vec<String> = match v.extract::<String>() {
                Ok(one) => vec![one],
                Err(_) => v.extract()?,
            };
            space
                .only(&format!("{k}={}", vs.join(",")))
                .map_err(|e| value_err(format!("only[{k:?}]: {e}")))?;
        }
    }
    let choices = space.choices();
    let threads = threads.unwrap_or_else(parcache_sim::parallel::default_threads).max(1);
    let runs = py
        .allow_threads(|| advisor::sweep(&t, &model, &choices, threads, &|| {}))
        .map_err(value_err)?;
    let a = advisor::advise(&t, runs, by);
    let ranked: Vec<serde_json::Value> = (0..a.ranked.len())
        .map(|i| {
            serde_json::json!({
                "rank": i + 1,
                "policies": settings(&a.ranked[i].choice),
                "correct_for_trace": a.safe[i],
                "default": i == a.default,
                "same_as": a.same_as[i].map(|j| j + 1),
                "outcome": outcome_json(&a.ranked[i].outcome),
            })
        })
        .collect();
    let dirs: Vec<serde_json::Value> = a
        .dirs
        .iter()
        .map(|d| {
            serde_json::json!({
                "dir": d.dir,
                "files": d.files,
                "sharing": d.sharing.name(),
                "policies": settings(&a.ranked[d.best].choice),
                "io_seconds": d.time,
                "default_io_seconds": d.default_time,
            })
        })
        .collect();
    let v = serde_json::json!({
        "trace": trace,
        "summary": t.summary(),
        "notes": t.notes,
        "sharing": a.sharing.iter().map(|(s, n)| (s.name().to_string(), serde_json::json!(n))).collect::<serde_json::Map<_, _>>(),
        "ranked": ranked,
        "directories": dirs,
        "unadvised": a.unadvised.iter().map(|(d, s)| serde_json::json!({"dir": d, "sharing": s.name()})).collect::<Vec<_>>(),
    });
    to_py(py, &v)
}

/// A node of a running cluster, without a mount: `Client(data="DIR")` for
/// a cluster started by `parcache up --data DIR`, or `Client(mds="ADDR",
/// secret_file="FILE")`. Paths are the cluster's (`/dir/file`).
#[pyclass]
struct Client {
    rt: tokio::runtime::Runtime,
    fs: Option<Arc<Fs>>,
}

fn os_err(path: &str, e: impl std::fmt::Display) -> PyErr {
    PyOSError::new_err(format!("{path}: {e}"))
}

impl Client {
    fn fs(&self) -> PyResult<Arc<Fs>> {
        self.fs
            .clone()
            .ok_or_else(|| PyOSError::new_err("the client was closed"))
    }
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (data=None, mds=None, secret_file=None))]
    fn new(data: Option<&str>, mds: Option<&str>, secret_file: Option<&str>) -> PyResult<Client> {
        let (mds, secret_path) = match (data, mds, secret_file) {
            (Some(dir), None, None) => {
                let f = format!("{dir}/cluster.json");
                let text = std::fs::read_to_string(&f).map_err(|e| {
                    os_err(
                        &f,
                        format!("{e} (no cluster here? start one with `parcache up --data {dir}`)"),
                    )
                })?;
                let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| os_err(&f, e))?;
                let mds = v["mds"]
                    .as_str()
                    .ok_or_else(|| os_err(&f, "no metadata server address in it"))?
                    .to_string();
                (mds, format!("{dir}/secret"))
            }
            (None, Some(m), Some(s)) => (m.to_string(), s.to_string()),
            _ => {
                return Err(value_err(
                    "which cluster? Client(data=DIR) or Client(mds=ADDR, secret_file=FILE)",
                ))
            }
        };
        let secret =
            parcache_proto::Secret::load(std::path::Path::new(&secret_path)).map_err(|e| os_err(&secret_path, e))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let fs = rt.block_on(Fs::connect(&mds, &secret)).map_err(|e| os_err(&mds, e))?;
        Ok(Client { rt, fs: Some(fs) })
    }

    /// The whole file.
    fn read<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyBytes>> {
        let fs = self.fs()?;
        let data = py
            .allow_threads(|| {
                self.rt.block_on(async {
                    let a = fs.resolve(path).await?;
                    let a = fs.open(&a, false).await?;
                    let size = fs.size_of(&a);
                    let d = fs.read_at(&a, 0, size).await;
                    fs.close(&a, false).await?;
                    d
                })
            })
            .map_err(|e| os_err(path, e))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Writes `data` as the whole file (made if missing); on return the
    /// bytes are with the data servers (the file was closed).
    fn write(&self, py: Python<'_>, path: &str, data: &[u8]) -> PyResult<()> {
        let fs = self.fs()?;
        py.allow_threads(|| {
            self.rt.block_on(async {
                let a = match fs.resolve(path).await {
                    Ok(a) => a,
                    Err(_) => fs.create(path, 0o644, false).await?,
                };
                let a = fs.open(&a, true).await?;
                let a = if a.size > data.len() as u64 {
                    fs.truncate(&a, data.len() as u64).await?
                } else {
                    a
                };
                fs.write_at(&a, 0, data).await?;
                fs.close(&a, true).await
            })
        })
        .map_err(|e| os_err(path, e))
    }

    /// The names in a directory.
    fn listdir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<String>> {
        let fs = self.fs()?;
        let entries = py
            .allow_threads(|| self.rt.block_on(fs.readdir(path)))
            .map_err(|e| os_err(path, e))?;
        Ok(entries
            .into_iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .filter(|n| n != "." && n != "..")
            .collect())
    }

    fn mkdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let fs = self.fs()?;
        py.allow_threads(|| self.rt.block_on(fs.mkdir(path, 0o755)))
            .map(|_| ())
            .map_err(|e| os_err(path, e))
    }

    /// Removes a file.
    fn remove(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let fs = self.fs()?;
        py.allow_threads(|| self.rt.block_on(fs.unlink(path)))
            .map_err(|e| os_err(path, e))
    }

    /// Sets one policy (as `parcache policy set PATH key=value`).
    fn set_policy(&self, py: Python<'_>, path: &str, key: &str, value: &str) -> PyResult<()> {
        let fs = self.fs()?;
        py.allow_threads(|| self.rt.block_on(fs.set_policy(path, key, value)))
            .map(|_| ())
            .map_err(|e| os_err(path, e))
    }

    /// The effective policies: {key: value}.
    fn policies(&self, py: Python<'_>, path: &str) -> PyResult<std::collections::BTreeMap<String, String>> {
        let fs = self.fs()?;
        py.allow_threads(|| {
            self.rt.block_on(async {
                let a = fs.resolve(path).await?;
                fs.effective_policies(a.handle).await
            })
        })
        .map(|v| v.into_iter().map(|(k, v, _)| (k, v)).collect())
        .map_err(|e| os_err(path, e))
    }

    /// Pushes what this node holds dirty and disconnects.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        if let Some(fs) = self.fs.take() {
            py.allow_threads(|| self.rt.block_on(fs.shutdown()))
                .map_err(|e| PyOSError::new_err(e.to_string()))?;
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &mut self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.close(py)
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scenarios, m)?)?;
    m.add_function(wrap_pyfunction!(run_scenario, m)?)?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(advise, m)?)?;
    m.add_class::<Client>()?;
    Ok(())
}
