//! The node's durable write cache (`--nv-dir`, `nv=on`; Biswas et al.
//! 1993) on real mounts: acknowledged writes survive kill -9 of the mount
//! at 100 points and are delivered by the next mount; a full NV cache
//! writes back by its policy and loses or reorders nothing; `sprite` opens
//! elsewhere recall NV-held blocks, and a node that died holding some
//! delivers them when it comes back.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common;
use common::{nodes, parcache, pattern, stat, wait_for, Cluster, Mounted};

/// Bytes of one record; slots of the test file hold one each.
const REC: usize = 16 << 10;

fn record(iter: u64, j: u64) -> Vec<u8> {
    pattern(REC, (iter << 32) | j)
}

fn nv_mount(c: &Cluster, at: &str, nv: &Path, mib: &str) -> Mounted {
    let nv = nv.to_str().unwrap();
    Mounted::with_args(&c.dir, c.dir.join(at), None, &["--nv-dir", nv, "--nv-mib", mib])
}

fn set(c: &Cluster, path: &str, settings: &[&str]) {
    let mut args = vec!["policy", "set", "--data", c.d(), path];
    args.extend_from_slice(settings);
    let (ok, _, err) = parcache(&args);
    assert!(ok, "policy set {settings:?}: {err}");
}

/// What the test knows of each slot: the last write acknowledged, and the
/// one in flight (which the log may or may not hold) when the mount died.
#[derive(Clone, Default)]
struct Slots {
    acked: Vec<Option<(u64, u64)>>,
    in_flight: Option<(usize, (u64, u64))>,
}

/// Checks every slot; an in-flight write found delivered counts as the
/// slot's last write from then on.
fn check(file: &Path, s: &mut Slots, when: &str) {
    let got = std::fs::read(file).unwrap_or_default();
    for (slot, want) in s.acked.clone().iter().enumerate() {
        let have = got.get(slot * REC..(slot + 1) * REC);
        let flying = s.in_flight.filter(|(f, _)| *f == slot).map(|(_, v)| record(v.0, v.1));
        let ok = match want {
            Some((i, j)) => have == Some(&record(*i, *j)[..]) || have.is_some() && have == flying.as_deref(),
            None => have.is_none_or(|h| h.iter().all(|&b| b == 0)) || have == flying.as_deref(),
        };
        let delivered = flying.is_some() && have == flying.as_deref();
        if !ok {
            let what = match have {
                None => "nothing (the file is shorter)".to_string(),
                Some(h) if h.iter().all(|&b| b == 0) => "zeros".to_string(),
                Some(h) => (0..100u64)
                    .flat_map(|i| (0..5000u64).map(move |j| (i, j)))
                    .find(|&(i, j)| record(i, j) == h)
                    .map_or("unknown bytes".to_string(), |v| format!("write {v:?}")),
            };
            panic!(
                "{when}: slot {slot} does not hold its last acknowledged write {want:?} (in flight {:?}): it holds {what}; file length {}",
                s.in_flight,
                got.len()
            );
        }
        if delivered {
            s.acked[slot] = s.in_flight.map(|(_, v)| v);
        }
    }
    s.in_flight = None;
}

#[test]
fn acknowledged_writes_survive_100_kill9s_of_the_mount() {
    let c = Cluster::up("nv-kill", 2);
    set(&c, "pc:/", &["nv=on", "write=threshold"]);
    let nv = c.dir.join("nv");
    // 128 slots of 16 KiB: 2 MiB over a 1 MiB NV cache, so write-backs
    // (threshold and immediate) happen between the kills too.
    let slots = 128;
    let mut s = Slots {
        acked: vec![None; slots],
        in_flight: None,
    };
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut total_acked = 0u64;
    for iter in 0..100u64 {
        let m = nv_mount(&c, "m", &nv, "1");
        let file = m.p("f");
        // What the previous mount acknowledged was delivered at this start.
        check(&file, &mut s, &format!("after kill {iter}"));
        let shared = Arc::new(Mutex::new(s.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (shared, stop, file) = (shared.clone(), stop.clone(), file.clone());
            std::thread::spawn(move || {
                let Ok(f) = std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(false)
                    .open(&file)
                else {
                    return 0;
                };
                let mut n = 0;
                for j in 0.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let slot = ((j * 37 + iter * 11) % slots as u64) as usize;
                    shared.lock().unwrap().in_flight = Some((slot, (iter, j)));
                    if f.write_all_at(&record(iter, j), (slot * REC) as u64).is_err() {
                        break;
                    }
                    let mut s = shared.lock().unwrap();
                    s.acked[slot] = Some((iter, j));
                    s.in_flight = None;
                    n += 1;
                }
                n
            })
        };
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_millis(20 + rng % 280));
        let mut m = m;
        m.kill9();
        stop.store(true, Ordering::SeqCst);
        total_acked += writer.join().unwrap();
        s = shared.lock().unwrap().clone();
    }
    let m = nv_mount(&c, "m", &nv, "1");
    check(&m.p("f"), &mut s, "after the last kill");
    assert!(
        total_acked > 500,
        "only {total_acked} writes were acknowledged over 100 runs"
    );
    eprintln!("100 kill -9 points, {total_acked} acknowledged writes, all intact");
    m.unmount();
}

#[test]
fn a_full_nv_cache_writes_back_by_its_policy_and_loses_or_reorders_nothing() {
    let c = Cluster::up("nv-full", 2);
    let nv = c.dir.join("nv");
    for (k, policy) in ["threshold", "lru-writeback", "periodic(interval=1s,age=1s)"]
        .iter()
        .enumerate()
    {
        let name = format!("f{k}");
        let m = nv_mount(&c, &format!("m{k}"), &nv, "1");
        let (ok, _, err) = parcache(&["cp", "--data", c.d(), "/dev/null", &format!("pc:/{name}")]);
        assert!(ok, "{err}");
        set(&c, &format!("pc:/{name}"), &["nv=on", &format!("write={policy}")]);
        // 4 MiB of slots over a 1 MiB NV cache, each slot written 3 times
        // in turn: the last version of each must be what stays.
        let slots = 256;
        let f = std::fs::OpenOptions::new().write(true).open(m.p(&name)).unwrap();
        for round in 0..3u64 {
            for slot in 0..slots {
                f.write_all_at(&record(round, slot as u64), (slot * REC) as u64)
                    .unwrap();
            }
        }
        let d = c.d().to_string();
        let n = wait_for(&d, "the NV cache's counters", |n| {
            stat(n, &m, "nv_writes") >= 3 * slots as u64
        });
        let (backs, immediate, absorbed) = (
            stat(&n, &m, "nv_write_backs"),
            stat(&n, &m, "nv_immediate"),
            stat(&n, &m, "nv_overwrites"),
        );
        eprintln!("{policy}: write-backs {backs}, immediate {immediate}, absorbed overwrites {absorbed}");
        assert!(
            backs >= 48,
            "{policy}: a 4 MiB file through a 1 MiB cache wrote back only {backs} blocks"
        );
        if *policy == "lru-writeback" {
            assert!(immediate > 0, "lru-writeback writes only when full: {immediate}");
        }
        // The mount dies with the file open and the cache full of dirty
        // blocks; the next mount delivers them.
        let mut m = m;
        m.kill9();
        drop(f);
        let m = nv_mount(&c, &format!("r{k}"), &nv, "1");
        let got = std::fs::read(m.p(&name)).unwrap();
        assert_eq!(got.len(), slots * REC, "{policy}: size after delivery");
        for slot in 0..slots {
            assert!(
                got[slot * REC..(slot + 1) * REC] == record(2, slot as u64)[..],
                "{policy}: slot {slot} is not its last write"
            );
        }
        m.unmount();
    }
}

#[test]
fn sprite_opens_elsewhere_recall_nv_blocks_and_a_dead_holder_delivers_them_on_return() {
    let c = Cluster::up("nv-sprite", 2);
    set(&c, "pc:/", &["nv=on", "write=threshold", "consistency=sprite"]);
    let nv = c.dir.join("nv-a");
    let a = nv_mount(&c, "a", &nv, "8");
    let b = Mounted::new(&c.dir, c.dir.join("b"));
    // A writes and closes: under sprite the blocks stay in its NV cache.
    let v1 = pattern(256 << 10, 1);
    std::fs::write(a.p("f"), &v1).unwrap();
    let d = c.d().to_string();
    let n = wait_for(&d, "A's NV cache holding the file", |n| {
        stat(n, &a, "nv_live_blocks") >= 4
    });
    assert_eq!(stat(&n, &a, "nv_write_backs"), 0, "nothing went down before a recall");
    // B's open recalls them.
    assert!(
        std::fs::read(b.p("f")).unwrap() == v1,
        "B reads A's NV-held bytes after the recall"
    );
    // B's close reaches the metadata server after its read returns (the
    // kernel sends FUSE's release on its own time). A's open for write
    // must come after it: with the file still open on B, sprite makes it
    // write-shared and uncached, and A's v2 would go straight to the data
    // servers (a full suite saw B read v2 below).
    std::thread::sleep(std::time::Duration::from_secs(2));
    // A writes a new version and dies holding it.
    // (Overwritten in place: a truncate would reach the servers at once.)
    let v2 = pattern(256 << 10, 2);
    let f = std::fs::OpenOptions::new().write(true).open(a.p("f")).unwrap();
    f.write_all_at(&v2, 0).unwrap();
    drop(f);
    wait_for(&d, "A's NV cache holding v2", |n| stat(n, &a, "nv_live_blocks") >= 4);
    let mut a = a;
    a.kill9();
    // Meanwhile B sees the data servers' bytes: v1 (its open waits for the
    // dead node's recall until the metadata server gives up on it).
    let seen = std::fs::read(b.p("f")).unwrap();
    assert!(
        seen == v1,
        "B sees v1 while A is down ({} bytes, v2: {})",
        seen.len(),
        seen == v2
    );
    // A comes back: its log delivers v2 before it serves, and B's next
    // open sees it.
    let a2 = nv_mount(&c, "a2", &nv, "8");
    assert!(std::fs::read(b.p("f")).unwrap() == v2, "B reads v2 once A delivered it");
    assert!(std::fs::read(a2.p("f")).unwrap() == v2);
    let n = nodes(&d);
    assert!(stat(&n, &a2, "nv_replayed") >= 4, "A delivered its blocks at start");
    a2.unmount();
    b.unmount();
}

#[test]
fn a_full_nv_disk_writes_through_and_loses_nothing() {
    let Some(disk) = common::SmallDisk::new("nv-full-disk", 2) else {
        return;
    };
    let c = Cluster::up("nv-disk", 2);
    set(&c, "pc:/", &["nv=on", "write=threshold"]);
    // A 16 MiB NV cache whose log's disk holds 2 MiB: 4 MiB of writes
    // fill it; every write still succeeds (through to the data servers).
    let m = nv_mount(&c, "m", &disk.0, "16");
    let want = pattern(4 << 20, 9);
    {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(m.p("f"))
            .unwrap();
        for (i, chunk) in want.chunks(64 << 10).enumerate() {
            f.write_all_at(chunk, (i << 16) as u64)
                .unwrap_or_else(|e| panic!("write {i} on a full NV disk: {e}"));
        }
    }
    let mut m = m;
    m.kill9();
    let m = nv_mount(&c, "m2", &disk.0, "16");
    assert!(std::fs::read(m.p("f")).unwrap() == want, "every byte after the kill");
    m.unmount();
}

/// NV-held blocks are durable: the node's syncer (Unix's 30 s update
/// daemon, 1 s here) leaves them to the write policy, which under
/// `threshold` keeps them while the cache has room.
#[test]
fn the_syncer_leaves_nv_blocks_to_their_write_policy() {
    let c = Cluster::up("nv-syncer", 2);
    set(&c, "pc:/", &["nv=on", "write=threshold", "consistency=sprite"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let secret = parcache_proto::Secret::load(&c.dir.join("secret")).unwrap();
        let cfg = parcache_client::NodeCacheConfig {
            syncer: parcache_core::Span::from_secs(1),
            nv: Some(parcache_client::NvConfig {
                dir: c.dir.join("nv"),
                bytes: 8 << 20,
            }),
            ..Default::default()
        };
        let fs = parcache_client::Fs::connect_with(c.info()["mds"].as_str().unwrap(), &secret, cfg)
            .await
            .unwrap();
        let a = fs.create("/f", 0o644, true).await.unwrap();
        let a = fs.open(&a, true).await.unwrap();
        fs.write_at(&a, 0, &pattern(256 << 10, 5)).await.unwrap();
        fs.close(&a, true).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let s = fs.node_stats();
        assert_eq!(s.nv_write_backs, 0, "the syncer wrote NV blocks down: {s:?}");
        assert_eq!(s.nv_live_blocks, 4, "{s:?}");
        fs.shutdown().await.unwrap();
        assert_eq!(fs.node_stats().nv_live_blocks, 0, "shutdown delivers them");
    });
}
