//! Helpers shared by the command-line tests.

use parcache_client::Fs;
use parcache_proto::Secret;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A test's own directory, `$TMP/parcache-TAG-PID`, emptied. Tests of one
/// binary run at once in one process, so a tag used twice would let one
/// test delete the other's cluster under it: that panics here instead.
pub fn scratch(tag: &str) -> PathBuf {
    static TAKEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        !taken.iter().any(|t| t == tag),
        "two tests of this binary use the scratch directory tag {tag:?}"
    );
    taken.push(tag.to_string());
    let d = std::env::temp_dir().join(format!("parcache-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Runs the `parcache` binary; returns success, stdout and stderr.
pub fn parcache(args: &[&str]) -> (bool, String, String) {
    let (ok, out, err) = parcache_bytes(args);
    (ok, String::from_utf8_lossy(&out).into(), err)
}

/// [`parcache`] with its output as bytes (`cat` of a file).
pub fn parcache_bytes(args: &[&str]) -> (bool, Vec<u8>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_parcache"))
        .args(args)
        .env("PARCACHE_LOG", "warn")
        .output()
        .expect("the parcache binary runs");
    (o.status.success(), o.stdout, String::from_utf8_lossy(&o.stderr).into())
}

/// `status`'s chunk line: (named by recipes, stored).
pub fn chunk_counts(d: &str) -> (u64, u64) {
    let (_, out, _) = parcache(&["status", "--data", d]);
    let Some(line) = out.lines().find(|l| l.starts_with("chunks")) else {
        return (0, 0);
    };
    let nums: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (nums[0], nums[1])
}

/// A cluster started with `parcache up` in a temporary directory, stopped
/// (or killed) and removed when dropped.
pub struct Cluster {
    pub dir: PathBuf,
}

impl Cluster {
    pub fn up(name: &str, iods: u32) -> Cluster {
        let c = Cluster { dir: scratch(name) };
        c.start(iods);
        c
    }
    pub fn start(&self, iods: u32) {
        let (ok, _, err) = parcache(&["up", "--data", self.d(), "--iods", &iods.to_string()]);
        assert!(ok, "parcache up: {err}");
    }
    pub fn d(&self) -> &str {
        self.dir.to_str().unwrap()
    }
    /// Makes the root's new files content-addressed under `consistency`;
    /// returns success and stderr.
    pub fn cas_root(&self, consistency: &str) -> (bool, String) {
        let c = format!("consistency={consistency}");
        let (ok, _, err) = parcache(&["policy", "set", "--data", self.d(), "pc:/", "store=cas", &c]);
        (ok, err)
    }
    pub fn info(&self) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(self.dir.join("cluster.json")).unwrap()).unwrap()
    }
    pub async fn fs(&self) -> std::sync::Arc<Fs> {
        let secret = Secret::load(&self.dir.join("secret")).unwrap();
        Fs::connect(self.info()["mds"].as_str().unwrap(), &secret)
            .await
            .unwrap()
    }
    pub fn pids(&self) -> Vec<u32> {
        self.info()["pids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_u64().unwrap() as u32)
            .collect()
    }
    pub fn kill9(&self, pid: u32) {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        // Wait until it is gone (or a zombie of an exited parent).
        for _ in 0..2000 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty() || stat.contains(") Z ") {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let (ok, _, _) = parcache(&["down", "--data", self.d()]);
        if !ok {
            for p in self.pids() {
                self.kill9(p);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The handles of the parts the data servers of the cluster in `dir` hold
/// (a part's file is named by its handle, in hexadecimal).
pub fn parts_in(dir: &Path) -> Vec<u64> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.parent().unwrap().ends_with("objects") {
                let name = p.file_name().unwrap().to_str().unwrap();
                out.push(u64::from_str_radix(name, 16).unwrap());
            }
        }
    }
    out.sort_unstable();
    out
}

/// Whether `dir` is a mount point now.
pub fn mounted(dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap();
    // As bytes: a test's mount point need not be UTF-8.
    parcache_fuse::mount_table(&std::fs::read("/proc/mounts").unwrap())
        .iter()
        .any(|e| e.at == dir)
}

pub struct Mounted {
    pub child: Child,
    pub at: PathBuf,
}

impl Mounted {
    pub fn new(cluster: &Path, at: PathBuf) -> Mounted {
        Mounted::logging(cluster, at, None)
    }

    /// A mount whose log (warnings and up) goes to `log`.
    pub fn logging(cluster: &Path, at: PathBuf, log: Option<&Path>) -> Mounted {
        Mounted::with_args(cluster, at, log, &[])
    }

    /// A mount with `extra` options, its log (warnings and up) to `log`.
    pub fn with_args(cluster: &Path, at: PathBuf, log: Option<&Path>, extra: &[&str]) -> Mounted {
        std::fs::create_dir_all(&at).unwrap();
        let stderr = match log {
            Some(l) => Stdio::from(std::fs::File::create(l).unwrap()),
            None => Stdio::inherit(),
        };
        let child = Command::new(env!("CARGO_BIN_EXE_parcache"))
            .args(["mount", "--data", cluster.to_str().unwrap(), at.to_str().unwrap()])
            .args(extra)
            .env("PARCACHE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !mounted(&at) {
            assert!(t.elapsed() < Duration::from_secs(20), "{} did not mount", at.display());
            std::thread::sleep(Duration::from_millis(50));
        }
        Mounted { child, at }
    }
    pub fn p(&self, rel: &str) -> PathBuf {
        self.at.join(rel)
    }
    /// Unmounts as a user would; the mount process pushes its dirty data and exits 0.
    pub fn unmount(mut self) {
        // The kernel releases a file closed just now in the background: a
        // user seeing "busy" tries again a moment later, and so does this.
        let t = Instant::now();
        let o = loop {
            let o = Command::new("fusermount3").arg("-u").arg(&self.at).output().unwrap();
            let busy = String::from_utf8_lossy(&o.stderr).contains("busy");
            if o.status.success() || !busy || t.elapsed() > Duration::from_secs(5) {
                break o;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(
            o.status.success(),
            "fusermount3 -u {}: {}",
            self.at.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                assert!(s.success(), "parcache mount exited with {s}");
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "parcache mount did not exit");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Mounted {
    /// kill -9 of the mount process, then its dead mount is detached
    /// (`fusermount3 -u -z`), as `parcache status` tells a user to.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        let _ = self.child.wait();
        let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(&self.at).status();
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if mounted(&self.at) {
            let _ = Command::new("fusermount3").arg("-u").arg(&self.at).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The mount point, if it is empty now (the cooperative tests'
        // points sit beside the cluster's directory, outside it).
        let _ = std::fs::remove_dir(&self.at);
    }
}

/// A file's bytes: `seed` mixed with each 8-byte word's position, so a
/// block read from the wrong place or version shows.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len / 8)
        .flat_map(|i| ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed).to_le_bytes())
        .collect()
}

/// Where `got` differs from `want`, by 64 KiB block: each differing
/// block's index and what it holds instead (`old`'s bytes there, zeros,
/// or something else), for a failed comparison's message.
pub fn blocks_differing(got: &[u8], want: &[u8], old: &[u8]) -> String {
    const B: usize = 64 << 10;
    if got.len() != want.len() {
        return format!("{} bytes, not {}", got.len(), want.len());
    }
    let what = |i: usize| {
        let (s, e) = (i * B, ((i + 1) * B).min(got.len()));
        if old.len() >= e && got[s..e] == old[s..e] {
            "old".to_string()
        } else if got[s..e].iter().all(|&b| b == 0) {
            "zeros".to_string()
        } else {
            format!("other({})", pages_like(&got[s..e], &want[s..e], old.get(s..e)))
        }
    };
    let bad: Vec<String> = (0..got.len().div_ceil(B))
        .filter(|&i| got[i * B..((i + 1) * B).min(got.len())] != want[i * B..((i + 1) * B).min(want.len())])
        .map(|i| format!("{i}:{}", what(i)))
        .collect();
    format!(
        "{} of {} blocks differ: {}",
        bad.len(),
        got.len().div_ceil(B),
        bad.join(" ")
    )
}

/// Which 4 KiB pages of a block that is neither the wanted, the old nor
/// zeros are which: runs such as "0-7 want, 8-15 old".
fn pages_like(got: &[u8], want: &[u8], old: Option<&[u8]>) -> String {
    const P: usize = 4096;
    let kind = |i: usize| {
        let (s, e) = (i * P, ((i + 1) * P).min(got.len()));
        if got[s..e] == want[s..e] {
            "want"
        } else if old.is_some_and(|o| got[s..e] == o[s..e]) {
            "old"
        } else if got[s..e].iter().all(|&b| b == 0) {
            "zeros"
        } else {
            "other"
        }
    };
    let mut runs: Vec<(usize, usize, &str)> = Vec::new();
    for i in 0..got.len().div_ceil(P) {
        match runs.last_mut() {
            Some((_, end, k)) if *k == kind(i) => *end = i,
            _ => runs.push((i, i, kind(i))),
        }
    }
    runs.iter()
        .map(|(a, b, k)| format!("pages {a}-{b} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Each entry of `parcache status`'s list `list` ("servers", "nodes"):
/// its name and its counters.
fn status_list(d: &str, list: &str) -> Vec<(String, serde_json::Value)> {
    let (ok, out, err) = parcache(&["status", "--data", d, "--format", "json"]);
    assert!(ok, "status: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[list]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e["stats"].clone()))
        .collect()
}

/// Each server's name and counters, as `parcache status` shows them.
pub fn server_stats(d: &str) -> Vec<(String, serde_json::Value)> {
    status_list(d, "servers")
}

/// The nodes as `status --format json` lists them: (mount point, stats).
pub fn nodes(d: &str) -> Vec<(String, serde_json::Value)> {
    status_list(d, "nodes")
}

pub fn stat(nodes: &[(String, serde_json::Value)], m: &Mounted, key: &str) -> u64 {
    let name = std::fs::canonicalize(&m.at).unwrap().display().to_string();
    nodes
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, s)| s[key].as_u64().unwrap())
}

/// Waits (up to 20 s) until the nodes' reported counters satisfy `ok`;
/// heartbeats carry them every 5 s.
pub fn wait_for(
    d: &str,
    what: &str,
    ok: impl Fn(&[(String, serde_json::Value)]) -> bool,
) -> Vec<(String, serde_json::Value)> {
    let t = Instant::now();
    loop {
        let n = nodes(d);
        if ok(&n) {
            return n;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{what}: never; nodes {n:#?}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Three mounts with `extra` options; returns once each has heard of all
/// three (a heartbeat after the last one joined).
pub fn three_nodes(c: &Cluster, extra: &[&str]) -> (Mounted, Mounted, Mounted) {
    let at = |n: &str| -> PathBuf { c.dir.parent().unwrap().join(format!("{}-{n}", c.dir.display())) };
    let a = Mounted::with_args(&c.dir, at("a"), None, extra);
    let b = Mounted::with_args(&c.dir, at("b"), None, extra);
    let m = Mounted::with_args(&c.dir, at("c"), None, extra);
    wait_for(c.d(), "three nodes listed", |n| n.len() == 3);
    // Each node learns the members from its next heartbeat's answer.
    std::thread::sleep(Duration::from_millis(5_500));
    (a, b, m)
}

/// Where the node mounted at `m` answers its peers, as `parcache status
/// --format json` lists it.
pub fn node_addr(d: &str, m: &Mounted) -> String {
    let (ok, out, err) = parcache(&["status", "--data", d, "--format", "json"]);
    assert!(ok, "status: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let name = std::fs::canonicalize(&m.at).unwrap().display().to_string();
    v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == name.as_str())
        .and_then(|n| n["addr"].as_str())
        .unwrap_or_else(|| panic!("{name} is not listed with its address: {v}"))
        .to_string()
}

pub fn sum(n: &[(String, serde_json::Value)], key: &str) -> u64 {
    n.iter().map(|(_, s)| s[key].as_u64().unwrap()).sum()
}

/// A size-limited directory: a tmpfs of `mib` MiB (root only). `None`,
/// with a message, where this machine cannot make one.
pub struct SmallDisk(pub PathBuf);

impl SmallDisk {
    pub fn new(tag: &str, mib: u32) -> Option<SmallDisk> {
        let p = scratch(tag);
        std::fs::create_dir_all(&p).unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m"),
                "tmpfs",
                p.to_str().unwrap(),
            ])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("SKIPPED: cannot mount a {mib} MiB tmpfs here (not root?); the full-disk test needs one");
            let _ = std::fs::remove_dir(&p);
            return None;
        }
        Some(SmallDisk(p))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The minor page faults process `pid` has taken so far (`/proc/PID/stat`,
/// field 10).
pub fn minor_faults(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's name, which is in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split_whitespace().nth(7).unwrap().parse().unwrap()
}
