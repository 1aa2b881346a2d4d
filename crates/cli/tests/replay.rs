//! `parcache sim replay` as a user runs it: a small CSV trace, a bad trace,
//! a bad policy.

use std::process::Command;

fn parcache(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_parcache"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_csv_trace_replays_and_bad_input_is_named() {
    let dir = std::env::temp_dir().join(format!("parcache-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.csv");
    let mut csv = String::from("time,node,process,file,op,offset,length\n0,a,1,/f,open,0,1\n");
    for i in 0..32u64 {
        csv.push_str(&format!("0.{i:03},a,1,/f,write,{},65536\n", i * 65536));
    }
    csv.push_str("0.5,a,1,/f,close,0,0\n");
    std::fs::write(&trace, &csv).unwrap();
    let t = trace.to_str().unwrap();
    let o = parcache(&["sim", "replay", t, "--set", "write=write-back", "--format", "json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["outcome"]["bytes_written"], 32 * 65536);
    assert_eq!(v["outcome"]["disk_write_bytes"], 32 * 65536);
    assert_eq!(v["policies"]["write"], "write-back");

    let o = parcache(&["sim", "replay", t, "--set", "write=sometimes"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("write=sometimes"));

    std::fs::write(&trace, "time,node,process,file,op,offset,length\n0,a,1,/f,seek,0,1\n").unwrap();
    let o = parcache(&["sim", "replay", t]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("t.csv") && err.contains("line 2"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
