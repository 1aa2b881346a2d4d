//! Discretionary caching (Vilayannur et al. 2003) on real servers: hints
//! set through each interface (the client library, `parcache hint`, the
//! xattr on a mount) send requests around the node's cache or the global
//! cache, as the counters prove; the runtime's decision to keep a block
//! out of the global cache sticks; and bypassed requests read the bytes
//! cached ones do.

use parcache_client::{Fs, HintList, NodeCacheConfig};
use std::sync::Arc;

use crate::common;
use common::{parcache, pattern, stat, three_nodes, wait_for, Cluster};

const BLOCK: u64 = 64 << 10;

async fn write_file(fs: &Fs, path: &str, bytes: &[u8]) {
    fs.create(path, 0o644, true).await.unwrap();
    let a = fs.open(&fs.resolve(path).await.unwrap(), true).await.unwrap();
    fs.write_at(&a, 0, bytes).await.unwrap();
    fs.close(&a, true).await.unwrap();
}

async fn read_block(fs: &Fs, path: &str, index: u64, want: &[u8]) {
    let a = fs.open(&fs.resolve(path).await.unwrap(), false).await.unwrap();
    let got = fs.read_at(&a, index * BLOCK, BLOCK).await.unwrap();
    fs.close(&a, false).await.unwrap();
    let w = &want[(index * BLOCK) as usize..((index + 1) * BLOCK) as usize];
    assert!(got == w, "{path}: block {index} differs");
}

#[test]
fn runtime_bypass_decides_once_and_the_decision_sticks() {
    let c = Cluster::up("disc-runtime", 2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let f = pattern(8 * BLOCK as usize, 3);
        write_file(&*c.fs().await, "/f", &f).await;
        // A node alone is every block's home. Reads go around its own
        // cache (a library hint), so each one reaches the global cache.
        let fs = c.fs().await;
        fs.set_policy("/f", "cooperative", "global(threshold=3)").await.unwrap();
        let all = fs.hint("/f", &"read:local=off".parse().unwrap()).await.unwrap();
        assert_eq!(all.to_string(), "read:local=off");
        // Segments of 4 blocks; threshold 3.
        read_block(&fs, "/f", 0, &f).await; // segment 0's first access: no check, kept
        read_block(&fs, "/f", 1, &f).await; // counter 2 <= 3: kept out, decided
        for _ in 0..3 {
            read_block(&fs, "/f", 0, &f).await; // hits; the counter reaches 5
        }
        read_block(&fs, "/f", 1, &f).await; // decided: around the global cache
        read_block(&fs, "/f", 2, &f).await; // counter 6 > 3: kept
        read_block(&fs, "/f", 2, &f).await; // a hit
        let s = fs.node_stats();
        assert_eq!(s.local_read_bypasses, 8, "{s:?}");
        assert_eq!(s.global_read_bypasses, 1, "block 1 went around once decided: {s:?}");
        assert_eq!(s.global_kept_out, 1, "{s:?}");
        assert_eq!((s.global_hits, s.global_misses), (4, 3), "{s:?}");
        assert!(s.segment_counters.iter().sum::<u64>() >= 1, "{s:?}");
        // The hint cleared, reads go through the node cache again.
        fs.clear_hints("/f").await.unwrap();
        assert!(fs.hints("/f").await.unwrap().is_empty());
        read_block(&fs, "/f", 3, &f).await;
        assert_eq!(fs.node_stats().local_read_bypasses, 8);
        fs.shutdown().await.unwrap();
    });
    let _ = parcache(&["down", "--data", c.d()]);
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const LEVELS: [&str; 4] = [
    "local=on,global=on",
    "local=off,global=on",
    "local=on,global=off",
    "local=off,global=off",
];

#[test]
fn bypassed_requests_read_and_write_the_same_bytes_as_cached_ones() {
    let c = Cluster::up("disc-bytes", 2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Two nodes in the tier, so homes are on both; a's cache holds 4
        // blocks, so its reads miss and its writes go down often.
        let secret = parcache_proto::Secret::load(&c.dir.join("secret")).unwrap();
        let small = NodeCacheConfig {
            pool_bytes: 4 * BLOCK,
            ..Default::default()
        };
        let a: Arc<Fs> = Fs::connect_with(c.info()["mds"].as_str().unwrap(), &secret, small)
            .await
            .unwrap();
        let b: Arc<Fs> = c.fs().await;
        a.join_tier("a".into(), "127.0.0.1:0").await.unwrap();
        b.join_tier("b".into(), "127.0.0.1:0").await.unwrap();
        // Each learns the other from its next heartbeat's answer.
        tokio::time::sleep(std::time::Duration::from_millis(5_500)).await;
        let len = 24 * BLOCK;
        let mut model = pattern(len as usize, 7);
        a.create("/g", 0o644, true).await.unwrap();
        a.set_policy("/g", "cooperative", "global(threshold=2)").await.unwrap();
        let h = a.open(&a.resolve("/g").await.unwrap(), true).await.unwrap();
        a.write_at(&h, 0, &model).await.unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for step in 0..300 {
            match rng.below(4) {
                // New hints over a random range, for reads or writes.
                0 => {
                    let start = rng.below(len);
                    let end = (start + 1 + rng.below(6 * BLOCK)).min(len);
                    let op = if rng.below(2) == 0 { "read" } else { "write" };
                    let rule = format!("{op}@{start}-{end}:{}", LEVELS[rng.below(4) as usize]);
                    let l: HintList = rule.parse().unwrap();
                    a.hint("/g", &l).await.unwrap();
                }
                1 => {
                    let off = rng.below(len - 1);
                    let n = (1 + rng.below(3 * BLOCK)).min(len - off);
                    let bytes: Vec<u8> = (0..n).map(|i| (i ^ step).wrapping_mul(31) as u8).collect();
                    a.write_at(&h, off, &bytes).await.unwrap();
                    model[off as usize..(off + n) as usize].copy_from_slice(&bytes);
                }
                _ => {
                    let off = rng.below(len - 1);
                    let n = (1 + rng.below(3 * BLOCK)).min(len - off);
                    let got = a.read_at(&h, off, n).await.unwrap();
                    assert!(
                        got == model[off as usize..(off + n) as usize],
                        "step {step}: read of {n} at {off} differs (hints {})",
                        a.hints("/g").await.unwrap()
                    );
                }
            }
        }
        a.close(&h, true).await.unwrap();
        // Another node reads what the first wrote, through and around.
        let hb = b.open(&b.resolve("/g").await.unwrap(), false).await.unwrap();
        let got = b.read_at(&hb, 0, len).await.unwrap();
        assert!(got == model, "b read g wrong");
        b.close(&hb, false).await.unwrap();
        let s = a.node_stats();
        assert!(
            s.local_read_bypasses > 0
                && s.local_write_bypasses > 0
                && s.global_read_bypasses > 0
                && s.global_write_bypasses > 0,
            "every kind of bypass happened: {s:?}"
        );
        for fs in [a, b] {
            fs.leave_tier().await.unwrap();
            fs.shutdown().await.unwrap();
        }
    });
    let _ = parcache(&["down", "--data", c.d()]);
}

#[test]
fn hints_from_the_command_line_and_the_xattr_take_effect_on_mounts() {
    let c = Cluster::up("disc-mount", 2);
    let (ok, _, err) = parcache(&["policy", "set", "--data", c.d(), "pc:/", "cooperative=global"]);
    assert!(ok, "{err}");
    let (a, b, m) = three_nodes(&c, &[]);
    // a writes f; b reads it through the global cache (misses at the
    // homes), then c finds its blocks there.
    let f = pattern(4 << 20, 1);
    std::fs::write(a.p("f"), &f).unwrap();
    assert!(std::fs::read(b.p("f")).unwrap() == f, "b read f wrong");
    assert!(std::fs::read(m.p("f")).unwrap() == f, "c read f wrong");
    wait_for(c.d(), "global hits for c's read", |n| {
        n.iter().map(|(_, s)| s["global_hits"].as_u64().unwrap()).sum::<u64>() >= 40
    });

    // `parcache hint`: g's reads go around the global cache.
    let g = pattern(1 << 20, 2);
    std::fs::write(a.p("g"), &g).unwrap();
    let (ok, out, err) = parcache(&["hint", "--data", c.d(), "pc:/g", "--read", "global=off"]);
    assert!(ok && out.contains("bypass=read:global=off"), "{out} {err}");
    assert!(std::fs::read(b.p("g")).unwrap() == g, "b read g wrong");
    wait_for(c.d(), "b's global read bypasses", |n| {
        stat(n, &b, "global_read_bypasses") >= 16
    });

    // The xattr: h's reads go around the node's own cache.
    let h = pattern(1 << 20, 3);
    std::fs::write(a.p("h"), &h).unwrap();
    let hp = m.p("h");
    let ok = std::process::Command::new("setfattr")
        .args(["-n", "user.parcache.bypass", "-v", "read@0-1M:local=off"])
        .arg(&hp)
        .status()
        .unwrap()
        .success();
    assert!(ok, "setfattr");
    let out = std::process::Command::new("getfattr")
        .args(["--absolute-names", "--only-values", "-n", "user.parcache.bypass"])
        .arg(&hp)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "read@0-1048576:local=off");
    assert!(std::fs::read(&hp).unwrap() == h, "c read h wrong");
    wait_for(c.d(), "c's local read bypasses", |n| {
        stat(n, &m, "local_read_bypasses") >= 16
    });
    // A bad hint is refused with the reason, and nothing changes.
    let bad = std::process::Command::new("setfattr")
        .args(["-n", "user.parcache.bypass", "-v", "read:local=maybe"])
        .arg(&hp)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let (ok, _, err) = parcache(&[
        "hint",
        "--data",
        c.d(),
        "pc:/h",
        "--range",
        "9-3",
        "--read",
        "local=off",
    ]);
    assert!(!ok && err.contains("empty"), "{err}");
    let (ok, out, _) = parcache(&["hint", "--data", c.d(), "pc:/h"]);
    assert!(!ok, "nothing to do is an error: {out}");

    // kill -9 a home that holds blocks of k (c wrote them through it): b
    // reads k's blocks from the data servers instead, every byte right.
    let k = pattern(2 << 20, 4);
    std::fs::write(m.p("k"), &k).unwrap();
    let mut a = a;
    a.kill9();
    assert!(
        std::fs::read(b.p("k")).unwrap() == k,
        "b read k wrong after a home died"
    );
    drop(a);
    b.unmount();
    m.unmount();
}

#[test]
fn sync_write_leaves_no_stale_copy_on_any_of_three_mounts() {
    use std::os::unix::fs::FileExt;
    let c = Cluster::up("disc-sync", 2);
    let (ok, _, err) = parcache(&["policy", "set", "--data", c.d(), "pc:/", "consistency=sync-write"]);
    assert!(ok, "{err}");
    let (a, b, m) = three_nodes(&c, &[]);
    let mut want = pattern(1 << 20, 5);
    std::fs::write(a.p("f"), &want).unwrap();
    // Every node opens f and reads it whole: each caches every block, and
    // keeps the file open (no open will revalidate anything).
    let open = |at: &common::Mounted| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(at.p("f"))
            .unwrap()
    };
    let files = [open(&a), open(&b), open(&m)];
    let whole = |f: &std::fs::File| {
        let mut buf = vec![0u8; 1 << 20];
        f.read_exact_at(&mut buf, 0).unwrap();
        buf
    };
    for f in &files {
        assert!(whole(f) == want);
    }
    // Each node in turn writes in place, inside a block and across two:
    // when the write returns, the others read the new bytes.
    for (round, (who, at, len)) in [(0, 70_000u64, 100usize), (1, 130_000, 5_000), (2, 1_000, 200_000)]
        .into_iter()
        .enumerate()
    {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + round * 13) as u8).collect();
        files[who].write_all_at(&bytes, at).unwrap();
        want[at as usize..at as usize + len].copy_from_slice(&bytes);
        for (i, f) in files.iter().enumerate() {
            assert!(whole(f) == want, "round {round}: node {i} read a stale copy");
        }
    }
    // kill -9 a node that caches every block: the next write waits for its
    // answer until the callback deadline (10 s), then goes on without it.
    let [fa, fb, fm] = files;
    drop(fb);
    let mut b = b;
    b.kill9();
    let t = std::time::Instant::now();
    let bytes = vec![0xabu8; 3_000];
    fm.write_all_at(&bytes, 300_000).unwrap();
    want[300_000..303_000].copy_from_slice(&bytes);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(30),
        "a write waited {:?} for a dead node",
        t.elapsed()
    );
    assert!(whole(&fa) == want, "node a read a stale copy after b died");
    drop(b);
    drop((fa, fm));
    a.unmount();
    m.unmount();
}
