//! `mount --record` and `parcache advise` as a user runs them: two mounts
//! (two nodes) of a real cluster record a hand-off of files, the traces
//! merge by concatenation, the advisor sees the sharing, ranks, and sets
//! its recommendations on the cluster; bad input is named before any work.

use crate::common;
use common::{parcache, Cluster, Mounted, SmallDisk};

#[test]
fn recorded_runs_replay_advise_and_apply() {
    let c = Cluster::up("advise", 2);
    let base = c.dir.join("work");
    std::fs::create_dir_all(&base).unwrap();
    let (ta, tb) = (base.join("a.jsonl"), base.join("b.jsonl"));
    let a = Mounted::with_args(&c.dir, base.join("a"), None, &["--record", ta.to_str().unwrap()]);
    // A second mount may not write into somebody's trace.
    std::fs::create_dir_all(base.join("x")).unwrap();
    let (ok, _, err) = parcache(&[
        "mount",
        "--data",
        c.d(),
        base.join("x").to_str().unwrap(),
        "--record",
        ta.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("a.jsonl") && err.contains("--record"), "{err}");

    std::fs::create_dir_all(a.p("job/out")).unwrap();
    let data: Vec<u8> = (0..(512u32 << 10)).map(|i| (i % 251) as u8).collect();
    std::fs::write(a.p("job/out/part"), &data).unwrap();
    // copy_file_range inside the mount is recorded as reads and writes.
    let o = std::process::Command::new("cp")
        .arg(a.p("job/out/part"))
        .arg(a.p("job/out/copy"))
        .output()
        .unwrap();
    assert!(o.status.success());
    a.unmount();
    let b = Mounted::with_args(&c.dir, base.join("b"), None, &["--record", tb.to_str().unwrap()]);
    assert_eq!(std::fs::read(b.p("job/out/part")).unwrap(), data);
    b.unmount();

    let ra = std::fs::read_to_string(&ta).unwrap();
    let recs: Vec<serde_json::Value> = ra.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let count = |file: &str, op: &str| {
        recs.iter()
            .filter(|r| r["file"] == file && r["op"] == op)
            .map(|r| r["length"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(
        count("/job/out/part", "write"),
        data.len() as u64,
        "every written byte recorded"
    );
    assert_eq!(
        count("/job/out/copy", "write"),
        data.len() as u64,
        "cp's copy_file_range recorded"
    );
    assert!(recs.iter().any(|r| r["file"] == "/job/out/part" && r["op"] == "close"));

    // Two nodes' traces, merged as the docs say.
    let all = base.join("all.jsonl");
    std::fs::write(&all, format!("{ra}{}", std::fs::read_to_string(&tb).unwrap())).unwrap();
    let all = all.to_str().unwrap();
    // A model of this machine and cluster, measured, is what replay reads.
    let model = base.join("here.toml");
    let (ok, _, err) = parcache(&[
        "sim",
        "calibrate-cluster",
        "--dir",
        base.to_str().unwrap(),
        "--mib",
        "4",
        "--data",
        c.d(),
        "--out",
        model.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("meta_us =") && err.contains("disk_mbps ="), "{err}");
    let (ok, out, err) = parcache(&[
        "sim",
        "replay",
        all,
        "--format",
        "json",
        "--cluster",
        model.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["cluster"]["meta_us"].as_f64().unwrap() > 0.0);
    assert_ne!(
        v["cluster"]["meta_us"].as_f64(),
        Some(40.0),
        "measured, not the default"
    );
    let (ok, out, err) = parcache(&["sim", "replay", all, "--format", "json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["summary"]["nodes"], 2);
    assert_eq!(v["summary"]["write_shared_files"], 1);

    let plot = base.join("cmp.svg");
    let (ok, out, err) = parcache(&[
        "advise",
        all,
        "--only",
        "replacement=lru",
        "--only",
        "cooperative=none",
        "--format",
        "json",
        "--plot",
        plot.to_str().unwrap(),
        "--apply",
        "pc:/applied",
        "--data",
        c.d(),
    ]);
    assert!(ok, "{err}");
    let json_end = out.rfind("\n}").map(|i| i + 2).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out[..json_end]).unwrap();
    assert_eq!(v["sharing"]["shared in turn"], 1, "{}", v["sharing"]);
    let ranked = v["ranked"].as_array().unwrap();
    // The private copy lets `none` in: 7 write × 4 prefetch × 6 caching
    // plug-ins, posix once (the default among them).
    assert_eq!(ranked.len(), 7 * 4 * 6 + 1);
    assert!(ranked.iter().filter(|r| r["default"] == true).count() == 1);
    let dirs = v["directories"].as_array().unwrap();
    let out_dir = dirs.iter().find(|d| d["dir"] == "/job/out").unwrap();
    assert_ne!(
        out_dir["policies"]["consistency"], "none",
        "a shared directory never gets consistency=none"
    );
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("consistency="),
        "the plot names the policies"
    );
    // --apply made the directory and set the recommendation on it.
    assert!(out.contains("applied to pc:/applied"), "{out}");
    let (ok, got, err) = parcache(&["policy", "get", "--data", c.d(), "pc:/applied"]);
    assert!(ok, "{err}");
    let want = format!("prefetch={}", out_dir["policies"]["prefetch"].as_str().unwrap());
    assert!(got.contains(&want) && got.contains("set here"), "{got}");
}

#[test]
fn advise_names_bad_input_before_sweeping() {
    let dir = std::env::temp_dir().join(format!("parcache-advise-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = dir.join("t.csv");
    std::fs::write(&t, "time,node,process,file,op,offset,length\n5,a,1,/f,write,0,4096\n").unwrap();
    let t = t.to_str().unwrap();
    // A missing trace, said once (it was said twice, message and cause).
    let (ok, _, err) = parcache(&["advise", "/no/such/trace.csv"]);
    assert!(!ok && err.matches("No such file").count() == 1, "{err}");
    let (ok, _, err) = parcache(&["advise", t, "--apply", "/not/cluster"]);
    assert!(!ok && err.contains("pc:/DIR"), "{err}");
    let (ok, _, err) = parcache(&["advise", t, "--apply", "pc:/x"]);
    assert!(!ok && err.contains("--data"), "{err}");
    let (ok, _, err) = parcache(&["sim", "calibrate-cluster", "--dir", "/no/such/dir", "--mib", "1"]);
    assert!(!ok && err.contains("/no/such/dir"), "{err}");
    let (ok, _, err) = parcache(&["advise", t, "--window", "10..20"]);
    assert!(!ok && err.contains("no reads or writes"), "{err}");
    let (ok, _, err) = parcache(&["advise", t, "--only", "write=maybe"]);
    assert!(!ok && err.contains("--only write=maybe"), "{err}");
    let (ok, out, err) = parcache(&["advise", t, "--only", "write=write-back,write-through", "--top", "3"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("recommended per directory") && out.contains("pc:/ "),
        "{out}"
    );
    // Not on a terminal, the sweep still says what it does.
    assert!(
        err.contains("advise: replaying") && err.contains("combinations of"),
        "{err}"
    );
    // A greedy search says so, and replays fewer than the whole space.
    let (ok, out, err) = parcache(&["advise", t, "--search", "greedy", "--format", "json"]);
    assert!(ok && err.contains("searching key by key"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["search"], "greedy");
    let (replayed, all) = (v["replayed"].as_u64().unwrap(), v["combinations"].as_u64().unwrap());
    assert!(replayed > 1 && replayed < all / 3, "{replayed} of {all}");
    let (ok, out, _) = parcache(&["advise", t, "--search", "greedy"]);
    assert!(ok && out.contains("(greedy search)"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_full_disk_stops_the_recording_not_the_mount() {
    let Some(disk) = SmallDisk::new("record-full-disk", 1) else {
        return;
    };
    let c = Cluster::up("record-full", 2);
    let trace = disk.0.join("t.jsonl");
    let log = c.dir.join("mount.log");
    let m = Mounted::with_args(
        &c.dir,
        c.dir.join("mnt"),
        Some(&log),
        &["--record", trace.to_str().unwrap()],
    );
    // Thousands of small writes: far more trace lines than 1 MiB holds.
    let mut f = std::fs::File::create(m.p("many")).unwrap();
    use std::io::Write;
    let page = [7u8; 512];
    for _ in 0..6_000 {
        f.write_all(&page).unwrap();
        f.sync_data().unwrap();
    }
    drop(f);
    assert_eq!(
        std::fs::metadata(m.p("many")).unwrap().len(),
        6_000 * 512,
        "the mount went on"
    );
    m.unmount();
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("recording stopped"), "{said}");
    // What was recorded replays (a last line cut short is left out).
    let (ok, out, err) = parcache(&["sim", "replay", trace.to_str().unwrap(), "--format", "json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["summary"]["writes"].as_u64().unwrap() > 100);
}
