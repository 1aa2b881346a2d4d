//! A whole cluster started with `parcache up`, used through the client
//! library and the command line, as a user would.

use parcache_client::Fs;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::{parcache, Cluster};

/// Files of 0 B to 256 MiB, aligned and unaligned, written in random pieces
/// in random order and read back at random offsets, against a model, under
/// every write policy of the node cache: through the writing node's cache,
/// and after `fsync` through another node's cold one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_written_and_read_at_random_offsets_match_the_model() {
    let c = Cluster::up("integrity", 4);
    let fs = c.fs().await;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(3);
    for w in parcache_core::WritePolicyKind::ALL {
        let dir = format!("/{}", w.name());
        fs.mkdir(&dir, 0o755).await.unwrap();
        fs.set_policy(&dir, "write", &w.to_string()).await.unwrap();
        integrity_in(&c, &fs, &dir, &mut rng).await;
    }
    let other = c.fs().await;
    let policies = other
        .policies_of(&other.resolve("/lru-writeback/f6").await.unwrap())
        .await
        .unwrap();
    assert_eq!(policies.write, parcache_core::WritePolicyKind::LruWriteback);
    big_and_truncate(&c, &fs, &mut rng).await;
}

async fn integrity_in(c: &Cluster, fs: &Fs, dir: &str, rng: &mut rand_pcg::Pcg64) {
    for (i, &size) in [0usize, 1, 4095, 65536, 65537, (1 << 20) + 7, 3 << 20]
        .iter()
        .enumerate()
    {
        let path = format!("{dir}/f{i}");
        let a = fs.create(&path, 0o644, true).await.unwrap();
        let model: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
        // Cut the file into random pieces and write them in random order.
        let mut cuts = vec![0, size];
        for _ in 0..(size / 50_000).clamp(1, 40) {
            cuts.push(rng.gen_range(0..=size));
        }
        cuts.sort();
        let mut pieces: Vec<(usize, usize)> = cuts.windows(2).map(|w| (w[0], w[1])).filter(|p| p.0 < p.1).collect();
        for k in (1..pieces.len()).rev() {
            pieces.swap(k, rng.gen_range(0..=k));
        }
        for (s, e) in pieces {
            fs.write_at(&a, s as u64, &model[s..e]).await.unwrap();
        }
        assert_eq!(
            fs.read_at(&a, 0, size as u64 + 10).await.unwrap(),
            model,
            "{path} whole, from the writer's cache"
        );
        fs.fsync(&a).await.unwrap();
        let a = fs.resolve(&path).await.unwrap();
        assert_eq!(a.size, size as u64, "{path}");
        let cold = c.fs().await;
        assert!(
            cold.read_at(&a, 0, size as u64 + 10).await.unwrap() == model,
            "{path} whole, from another node after fsync"
        );
        for _ in 0..20 {
            let off = rng.gen_range(0..=size);
            let len = rng.gen_range(0..=(size - off).min(300_000) + 5);
            let got = fs.read_at(&a, off as u64, len as u64).await.unwrap();
            assert_eq!(&got[..], &model[off..(off + len).min(size)], "{path} at {off}+{len}");
        }
    }
}

async fn big_and_truncate(c: &Cluster, fs: &Fs, rng: &mut rand_pcg::Pcg64) {
    // 256 MiB, sequentially in 8 MiB requests, then random reads.
    let big = fs.create("/big", 0o644, true).await.unwrap();
    let piece: Vec<u8> = (0..8 << 20)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    for k in 0..32u64 {
        let mut p = piece.clone();
        p[0] = k as u8;
        fs.write_at(&big, k << 23, &p).await.unwrap();
    }
    fs.close(&big, true).await.unwrap();
    let big = fs.resolve("/big").await.unwrap();
    assert_eq!(big.size, 256 << 20);
    let cold = c.fs().await;
    for _ in 0..20 {
        let off = rng.gen_range(0..256u64 << 20);
        let got = cold.read_at(&big, off, 1000).await.unwrap();
        for (j, b) in got.iter().enumerate() {
            let pos = off + j as u64;
            let within = (pos % (8 << 20)) as usize;
            let want = if within == 0 { (pos >> 23) as u8 } else { piece[within] };
            assert_eq!(*b, want, "/big at {pos}");
        }
    }
    // Overwrites and truncation.
    let f = fs.resolve("/write-back/f5").await.unwrap();
    fs.write_at(&f, 100, b"overwritten").await.unwrap();
    let f = fs.truncate(&f, 105).await.unwrap();
    let got = fs.read_at(&f, 95, 100).await.unwrap();
    assert_eq!(got.len(), 10);
    assert_eq!(&got[5..], b"overw");
    let f = fs.truncate(&f, 70_000).await.unwrap();
    let got = fs.read_at(&f, 105, 70_000).await.unwrap();
    assert!(got.iter().all(|&b| b == 0), "a file extended by truncate reads zeros");
}

/// `parcache rm` frees a file's parts on the data servers before it
/// returns, a small file's too: a file of up to 1 MiB has its parts
/// removed in the background, which the command used to end before, so
/// their space stayed taken until `parcache gc` (found with a copy that
/// filled a small disk: deleting the file left the disk full).
#[test]
fn rm_frees_a_small_files_parts_before_it_returns() {
    let c = Cluster::up("rm-frees", 3);
    let parts = || -> usize {
        (0..3)
            .map(|i| std::fs::read_dir(c.dir.join(format!("iod-{i}/objects"))).map_or(0, |d| d.count()))
            .sum()
    };
    let src = c.dir.join("small.bin");
    std::fs::write(&src, vec![7u8; 300_000]).unwrap();
    for name in ["pc:/a", "pc:/b"] {
        let (ok, _, err) = parcache(&["cp", "--data", c.d(), src.to_str().unwrap(), name]);
        assert!(ok, "{err}");
    }
    // Four whole blocks and a piece over three servers: the whole blocks
    // are in the block stores now.
    assert!(parts() >= 2, "{} parts stored", parts());
    for name in ["pc:/a", "pc:/b"] {
        let (ok, _, err) = parcache(&["rm", "--data", c.d(), name]);
        assert!(ok, "{err}");
    }
    assert_eq!(parts(), 0, "parts left after rm");
}

/// `parcache cp` in and out, byte-identical; the command line's errors name the path.
#[test]
fn cp_round_trips_and_errors_name_the_path() {
    let c = Cluster::up("cp", 3);
    let src = c.dir.join("in.bin");
    let data: Vec<u8> = (0..(5 << 20) + 123).map(|i: u32| (i % 251) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let (ok, _, err) = parcache(&["mkdir", "--data", c.d(), "pc:/dir"]);
    assert!(ok, "{err}");
    let (ok, _, err) = parcache(&["cp", "--data", c.d(), src.to_str().unwrap(), "pc:/dir/"]);
    assert!(ok, "{err}");
    let out = c.dir.join("out.bin");
    let (ok, _, err) = parcache(&["cp", "--data", c.d(), "pc:/dir/in.bin", out.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&out).unwrap() == data);
    // Out to a device that cannot be synced (a read benchmark's sink).
    let (ok, _, err) = parcache(&["cp", "--data", c.d(), "pc:/dir/in.bin", "/dev/null"]);
    assert!(ok, "cp to /dev/null: {err}");
    let (ok, stdout, _) = parcache(&["ls", "--data", c.d(), "pc:/dir"]);
    assert!(
        ok && stdout.contains("in.bin") && stdout.contains(&data.len().to_string()),
        "{stdout}"
    );
    let (ok, _, err) = parcache(&["cat", "--data", c.d(), "pc:/dir/missing"]);
    assert!(!ok && err.contains("missing") && err.contains("not found"), "{err}");
    let (ok, _, err) = parcache(&["rm", "--data", c.d(), "pc:/dir"]);
    assert!(!ok && err.contains("not empty"), "{err}");
    for op in ["rm", "mkdir"] {
        let (ok, _, err) = parcache(&[op, "--data", c.d(), "pc:/"]);
        assert!(
            !ok && err.contains("the root directory is always there"),
            "{op} pc:/: {err}"
        );
    }
    let (ok, _, err) = parcache(&["policy", "set", "--data", c.d(), "pc:/dir", "write=write-fool"]);
    assert!(!ok && err.contains("write-fool"), "{err}");
    let (ok, stdout, err) = parcache(&[
        "policy",
        "set",
        "--data",
        c.d(),
        "pc:/dir",
        "write=write-full",
        "stripe_unit=128K",
    ]);
    assert!(ok && stdout.contains("stripe_unit=131072"), "{err}");
    let (ok, stdout, _) = parcache(&["stat", "--data", c.d(), "pc:/dir/in.bin"]);
    assert!(ok && stdout.contains("stripe unit 65536"), "{stdout}");
    // A file created in the directory now inherits its stripe unit.
    let (ok, _, err) = parcache(&["cp", "--data", c.d(), src.to_str().unwrap(), "pc:/dir/second"]);
    assert!(ok, "{err}");
    let (_, stdout, _) = parcache(&["stat", "--data", c.d(), "pc:/dir/second"]);
    assert!(stdout.contains("stripe unit 131072"), "{stdout}");
    let (ok, _, err) = parcache(&["cp", "--data", c.d(), "pc:/dir/in.bin", "pc:/copy"]);
    assert!(ok, "{err}");
    let (ok, _, err) = parcache(&["up", "--data", c.d()]);
    assert!(!ok && err.contains("already running"), "{err}");
}

/// The local Unix sockets a loopback cluster also listens on
/// (`/proc/net/unix` lists abstract names with `@`), as a user sees them:
/// a file copied in by TCP (`PARCACHE_TRANSPORT=tcp`) reads back the same
/// by the local sockets, and after `kill -9` of a data server and a
/// restart on the same ports its name is bound again.
#[test]
fn loopback_servers_listen_on_local_sockets_and_tcp_still_serves() {
    let c = Cluster::up("local-sockets", 2);
    let listed = |c: &Cluster| -> Vec<String> {
        let info = c.info();
        let unix = std::fs::read_to_string("/proc/net/unix").unwrap();
        let mut addrs = vec![info["mds"].as_str().unwrap().to_string()];
        addrs.extend(
            info["iods"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string()),
        );
        addrs
            .into_iter()
            .filter(|a| !unix.lines().any(|l| l.ends_with(&format!(" @parcache-{a}"))))
            .collect()
    };
    assert_eq!(listed(&c), Vec::<String>::new(), "servers without a local socket");
    let src = c.dir.join("in.bin");
    let data: Vec<u8> = (0..(3 << 20) + 77).map(|i: u32| (i % 253) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_parcache"))
        .args(["cp", "--data", c.d(), src.to_str().unwrap(), "pc:/in.bin"])
        .env("PARCACHE_TRANSPORT", "tcp")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = c.dir.join("out.bin");
    let (ok, _, err) = parcache(&["cp", "--data", c.d(), "pc:/in.bin", out.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        std::fs::read(&out).unwrap() == data,
        "bytes differ between the two transports"
    );
    c.kill9(c.pids()[0]);
    let (ok, _, err) = parcache(&["down", "--data", c.d()]);
    assert!(ok, "{err}");
    c.start(2);
    assert_eq!(
        listed(&c),
        Vec::<String>::new(),
        "servers without a local socket after a restart"
    );
    let (ok, _, err) = parcache(&["cp", "--data", c.d(), "pc:/in.bin", out.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&out).unwrap() == data, "bytes differ after the restart");
}

/// A data server that is down: the client names it after a bounded number of tries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_is_named() {
    let c = Cluster::up("down", 2);
    let fs = c.fs().await;
    fs.set_retries(2);
    let a = fs.create("/x", 0o644, true).await.unwrap();
    fs.write_at(&a, 0, &vec![7u8; 200_000]).await.unwrap();
    fs.fsync(&a).await.unwrap();
    let a = fs.resolve("/x").await.unwrap();
    // Another node, whose cache does not hold the file.
    let fs = c.fs().await;
    fs.set_retries(2);
    // Capacity is the data servers' disks, and status shows every server.
    let st = fs.statfs().await.unwrap();
    assert!(
        st.capacity_bytes > 0 && st.free_bytes <= st.capacity_bytes && st.files >= 2,
        "{st:?}"
    );
    let (ok, out, err) = parcache(&["status", "--data", c.d()]);
    assert!(
        ok && out.matches(" up ").count() == 3 && out.contains("threshold"),
        "{out}{err}"
    );
    let (ok, out, err) = parcache(&["status", "--data", c.d(), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert!(ok && v["servers"].as_array().unwrap().len() == 3, "{out}");
    assert!(
        v["servers"][0]["stats"]["capacity_bytes"].as_u64().unwrap() > 0,
        "{out}"
    );
    let iod0 = c.info()["iods"][0].as_str().unwrap().to_string();
    c.kill9(c.pids()[0]);
    let e = fs.read_at(&a, 0, 200_000).await.unwrap_err().to_string();
    assert!(e.contains(&iod0) && e.contains("2 tries"), "{e}");
    // A server down: named in the text, null in the JSON, exit non-zero.
    let (ok, out, err) = parcache(&["status", "--data", c.d(), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert!(!ok && err.contains("1 of 3 servers are down"), "{err}");
    assert!(
        v["servers"][1]["stats"].is_null() && v["servers"][1]["address"] == iod0.as_str(),
        "{out}"
    );
}

/// kill -9 a data server, then the metadata server (then the rest), in the
/// middle of a workload, at random moments; restart with `parcache up`;
/// every write acknowledged by `fsync` before the crash is there, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9_of_the_servers() {
    let c = Cluster::up("crash", 3);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(11);
    let mut acked: Vec<(String, u64, Vec<u8>)> = vec![];
    let rounds = 50;
    for round in 0..rounds {
        let fs = c.fs().await;
        fs.set_retries(1);
        // Everything acknowledged so far is intact.
        for (path, off, data) in &acked {
            let a = fs
                .resolve(path)
                .await
                .unwrap_or_else(|e| panic!("round {round}: {path}: {e}"));
            let got = fs.read_at(&a, *off, data.len() as u64).await.unwrap();
            assert!(
                got == *data,
                "round {round}: acknowledged write to {path} at {off} lost"
            );
        }
        let path = format!("/r{round}");
        let writer = {
            let (fs, path) = (fs.clone(), path.clone());
            let seed = rng.gen::<u64>();
            tokio::spawn(async move {
                let mut r = rand_pcg::Pcg64::seed_from_u64(seed);
                let mut done = vec![];
                let Ok(a) = fs.create(&path, 0o644, true).await else {
                    return done;
                };
                for k in 0..10_000u64 {
                    let len = r.gen_range(1..200_000usize);
                    let data: Vec<u8> = (0..len).map(|_| r.gen()).collect();
                    let off = k * 200_000;
                    if fs.write_at(&a, off, &data).await.is_err() || fs.fsync(&a).await.is_err() {
                        break;
                    }
                    done.push((path.clone(), off, data));
                }
                done
            })
        };
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..120))).await;
        let pids = c.pids();
        let (iods, mds) = (&pids[..pids.len() - 1], pids[pids.len() - 1]);
        c.kill9(iods[rng.gen_range(0..iods.len())]);
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..20))).await;
        c.kill9(mds);
        for &p in iods {
            c.kill9(p);
        }
        acked.extend(writer.await.unwrap());
        c.start(3);
    }
    assert!(acked.len() > rounds, "only {} writes acknowledged", acked.len());
    eprintln!(
        "{rounds} kill points; {} acknowledged writes, all intact after restarts",
        acked.len()
    );
    let _ = Path::new(&c.dir);
}

/// `delay_commit` (CAPFS 2005 §3.6): a node's writes are stored at once
/// but committed at its fsync or close, in one forced commit; the node
/// reads its own writes before, other nodes see them after; the changes
/// of a node that never closes are lost whole (the file keeps its last
/// commit). Without force_commit the setting is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_commits_reach_other_nodes_at_fsync_and_close() {
    let c = Cluster::up("delay", 2);
    let (ok, err) = c.cas_root("seq-1(delay_commit=on)");
    assert!(!ok && err.contains("needs force_commit=on"), "{err}");
    let (ok, err) = c.cas_root("for-1(delay_commit=on)");
    assert!(ok, "{err}");
    let (a_fs, b_fs) = (c.fs().await, c.fs().await);
    let a = a_fs.create("/d", 0o644, true).await.unwrap();
    let a = a_fs.open(&a, true).await.unwrap();
    a_fs.write_at(&a, 0, &[1u8; 65536]).await.unwrap();
    a_fs.write_at(&a, 100_000, &[2u8; 20_000]).await.unwrap();
    let mut want = vec![1u8; 65536];
    want.resize(100_000, 0);
    want.extend([2u8; 20_000]);
    assert!(
        a_fs.read_at(&a, 0, 200_000).await.unwrap() == want,
        "the writer reads its own writes"
    );
    let b = b_fs.open(&b_fs.resolve("/d").await.unwrap(), false).await.unwrap();
    assert!(
        b_fs.read_at(&b, 0, 200_000).await.unwrap().is_empty(),
        "not committed yet"
    );
    a_fs.fsync(&a).await.unwrap();
    assert!(
        b_fs.read_at(&b, 0, 200_000).await.unwrap() == want,
        "committed at fsync"
    );
    a_fs.write_at(&a, 0, &[3u8; 16384]).await.unwrap();
    want[..16384].fill(3);
    a_fs.close(&a, true).await.unwrap();
    assert!(
        b_fs.read_at(&b, 0, 200_000).await.unwrap() == want,
        "committed at close"
    );
    // A node gone without closing: its delayed changes never reach the file.
    let a = a_fs.open(&a, true).await.unwrap();
    a_fs.write_at(&a, 0, &[4u8; 120_000]).await.unwrap();
    drop(a_fs);
    assert!(
        b_fs.read_at(&b, 0, 200_000).await.unwrap() == want,
        "the last commit stays, whole"
    );
}

/// A content-addressed file over several recipe pages (1,024 chunks each):
/// written across page boundaries and sparsely far out, read back from
/// another node, cut, removed; collection then finds every chunk unnamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipes_span_pages_and_removal_releases_them() {
    let c = Cluster::up("pages", 2);
    let (ok, err) = c.cas_root("seq-1");
    assert!(ok, "{err}");
    let (a_fs, b_fs) = (c.fs().await, c.fs().await);
    let a = a_fs.create("/p", 0o644, true).await.unwrap();
    let chunk = 16u64 << 10;
    // Chunks 1,000 to 1,100 (across the first page boundary), and chunk 5,000.
    let mid: Vec<u8> = (0..101 * chunk).map(|i| (i / chunk) as u8 ^ (i as u8)).collect();
    a_fs.write_at(&a, 1000 * chunk, &mid).await.unwrap();
    a_fs.write_at(&a, 5000 * chunk + 7, b"far out").await.unwrap();
    a_fs.fsync(&a).await.unwrap();
    let b = b_fs.resolve("/p").await.unwrap();
    assert_eq!(b.size, 5000 * chunk + 14);
    assert!(b_fs.read_at(&b, 1000 * chunk, mid.len() as u64).await.unwrap() == mid);
    assert_eq!(
        b_fs.read_at(&b, 5000 * chunk, 14).await.unwrap(),
        b"\0\0\0\0\0\0\0far out"
    );
    assert!(
        b_fs.read_at(&b, 2000 * chunk, 100)
            .await
            .unwrap()
            .iter()
            .all(|&x| x == 0),
        "a hole"
    );
    // Cut inside the first page's range: chunks past it are gone.
    a_fs.truncate(&a, 1050 * chunk + 1).await.unwrap();
    let b = b_fs.resolve("/p").await.unwrap();
    let back = b_fs.read_at(&b, 1000 * chunk, 200 * chunk).await.unwrap();
    assert_eq!(back.len() as u64, 50 * chunk + 1);
    assert!(back[..] == mid[..back.len()]);
    a_fs.unlink("/p").await.unwrap();
    let (ok, out, err) = parcache(&["gc", "--data", c.d(), "--older-than", "0"]);
    let removed: u64 = out
        .split_whitespace()
        .zip(out.split_whitespace().skip(1))
        .find(|(_, w)| *w == "named")
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(0);
    assert!(
        ok && removed >= 102,
        "every chunk of the removed file is collected: {out}{err}"
    );
    let (named, stored) = common::chunk_counts(c.d());
    assert_eq!((named, stored), (0, 0), "{out}");
}

/// Whether data server `addr` still holds any byte of file `handle`.
async fn holds_part(c: &Cluster, addr: &str, handle: u64) -> bool {
    let secret = parcache_proto::Secret::load(&c.dir.join("secret")).unwrap();
    let conn = parcache_proto::Client::connect(addr, &secret).await.unwrap();
    let req = parcache_proto::Request::Read {
        handle,
        offset: 0,
        len: 1 << 20,
        need: 0,
    };
    let (_, data) = conn.call(&req, &[]).await.unwrap();
    !data.is_empty()
}

/// Whether data server `n` of the cluster has a part file for `handle`
/// (empty or not).
fn part_file(c: &Cluster, n: usize, handle: u64) -> bool {
    c.dir.join(format!("iod-{n}/objects/{handle:016x}")).exists()
}

/// A file never written asks the data servers nothing when removed, and
/// they hold nothing of it; one truncated while empty (its parts made,
/// empty, on every data server) has them removed with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_file_never_written_or_truncated_while_empty_leaves_no_part() {
    let c = Cluster::up("removal-empty", 2);
    let fs = c.fs().await;
    let never = fs.create("/never", 0o644, true).await.unwrap();
    fs.close(&never, true).await.unwrap();
    let cut = fs.create("/cut", 0o644, true).await.unwrap();
    fs.truncate(&cut, 0).await.unwrap();
    fs.close(&cut, true).await.unwrap();
    for n in 0..2 {
        assert!(
            !part_file(&c, n, never.handle),
            "data server {n} holds a part of a file never written"
        );
        assert!(
            part_file(&c, n, cut.handle),
            "data server {n}: the truncate made no part (the test is void)"
        );
    }
    fs.unlink("/never").await.unwrap();
    fs.unlink("/cut").await.unwrap();
    fs.shutdown().await.unwrap();
    for n in 0..2 {
        assert!(
            !part_file(&c, n, cut.handle),
            "data server {n} still holds the truncated file's part"
        );
    }
}

/// A file at its first version and empty may still have parts when
/// another node created it (or an earlier run of this node, killed while
/// writing it before reporting anything): its removal asks the data
/// servers, and the part goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreported_part_of_a_file_created_elsewhere_goes_with_it() {
    let c = Cluster::up("removal-elsewhere", 2);
    let writer = c.fs().await;
    let f = writer.create("/killed", 0o644, true).await.unwrap();
    // The writer's write-back reached data server 0 of the file's layout;
    // it died before its close reported the size.
    let first = f.layout.as_ref().unwrap().servers[0] as usize;
    let secret = parcache_proto::Secret::load(&c.dir.join("secret")).unwrap();
    let addr = c.info()["iods"][first].as_str().unwrap().to_string();
    let conn = parcache_proto::Client::connect(&addr, &secret).await.unwrap();
    let req = parcache_proto::Request::WriteBuffered {
        handle: f.handle,
        offset: 0,
    };
    let (r, _) = conn.call(&req, &[9u8; 4096]).await.unwrap();
    assert!(matches!(r, parcache_proto::Response::Written { .. }), "{r:?}");
    assert!(holds_part(&c, &addr, f.handle).await);
    let other = c.fs().await;
    other.unlink("/killed").await.unwrap();
    other.shutdown().await.unwrap();
    assert!(
        !holds_part(&c, &addr, f.handle).await && !part_file(&c, first, f.handle),
        "the unreported part stayed behind"
    );
}

/// Removing a small file's last name returns once the metadata server has
/// removed it; its data servers drop its parts after, and `shutdown` waits
/// for them (SIGSTOP of one server holds that back). A large file's parts
/// are gone when its removal returns: the space is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_files_data_goes_after_the_unlink_and_before_shutdown_returns() {
    let c = Cluster::up("removal", 2);
    let iods: Vec<String> = c.info()["iods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let fs = c.fs().await;
    let small = fs.create("/small", 0o644, true).await.unwrap();
    fs.write_at(&small, 0, &vec![7u8; 100_000]).await.unwrap();
    fs.fsync(&small).await.unwrap();
    let big = fs.create("/big", 0o644, true).await.unwrap();
    fs.write_at(&big, 0, &vec![8u8; 3 << 20]).await.unwrap();
    fs.fsync(&big).await.unwrap();
    for a in &iods {
        assert!(holds_part(&c, a, small.handle).await && holds_part(&c, a, big.handle).await);
    }

    // The big file: both parts gone when the unlink returns.
    fs.unlink("/big").await.unwrap();
    for a in &iods {
        assert!(!holds_part(&c, a, big.handle).await, "{a} still holds the big file");
    }

    // The small file with its second data server stopped: the unlink
    // returns, shutdown does not until the server runs again.
    let pid = c.pids()[1];
    let sig = |s: &str| {
        std::process::Command::new("kill")
            .args([s, &pid.to_string()])
            .status()
            .unwrap()
    };
    sig("-STOP");
    let unlinked = tokio::time::timeout(Duration::from_secs(20), fs.unlink("/small")).await;
    let fs2 = fs.clone();
    let shut = tokio::spawn(async move { fs2.shutdown().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waited = !shut.is_finished();
    sig("-CONT");
    unlinked
        .expect("the unlink of a small file waits for no data server")
        .unwrap();
    assert!(waited, "shutdown returned while a removal was under way");
    shut.await.unwrap().unwrap();
    for a in &iods {
        assert!(!holds_part(&c, a, small.handle).await, "{a} still holds the small file");
    }
}

/// Opens `path` as a node's program would (its first open there asks for
/// the attributes and policies in one request), reads it whole and closes
/// it; returns the bytes and how many block reads went to data servers.
async fn read_as_opened(fs: &Fs, path: &str) -> (Vec<u8>, u64) {
    let before = fs.node_stats().server_reads;
    let a = fs.resolve(path).await.unwrap();
    let a = fs.getattr_to_open(a.handle).await.unwrap();
    let a = fs.open(&a, false).await.unwrap();
    let got = fs.read_at(&a, 0, 1 << 20).await.unwrap();
    fs.close(&a, false).await.unwrap();
    (got, fs.node_stats().server_reads - before)
}

/// Data on metadata: a small file's size report carries its content to
/// the metadata server, which gives it with the file's attributes at
/// another node's first open, so that node reads it from no data server.
/// The copy stands only for the version it was reported at: a node that
/// reports a change made on blocks older than another node's change
/// (it kept the file open across that change) leaves no copy, and every
/// reader sees both changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_files_content_comes_with_its_attributes_while_current() {
    let c = Cluster::up("small-copy", 2);
    let w = c.fs().await;
    let a = w.create("/s", 0o644, true).await.unwrap();
    let mut model = vec![b'x'; 5000];
    w.write_at(&a, 0, &model).await.unwrap();
    w.flush(&a).await.unwrap();
    let r = c.fs().await;
    let (got, fetched) = read_as_opened(&r, "/s").await;
    assert!(got == model, "the first reader read wrong bytes");
    assert_eq!(fetched, 0, "the first reader asked the data servers");

    // Another node changes bytes 0..10 and closes, while `w` keeps the
    // file open with its blocks of before; `w` then changes byte 100.
    let other = c.fs().await;
    let o = other.resolve("/s").await.unwrap();
    let o = other.getattr_to_open(o.handle).await.unwrap();
    let o = other.open(&o, true).await.unwrap();
    other.write_at(&o, 0, &[b'b'; 10]).await.unwrap();
    other.close(&o, true).await.unwrap();
    model[..10].fill(b'b');
    w.write_at(&a, 100, b"a").await.unwrap();
    w.close(&a, true).await.unwrap();
    model[100] = b'a';

    let fresh = c.fs().await;
    let (got, fetched) = read_as_opened(&fresh, "/s").await;
    assert!(got == model, "a new node read a stale copy: {:?}", &got[..12]);
    assert!(fetched > 0, "the copy of the writer's stale blocks was kept");
    // The first reader opens again: its blocks are of an older version.
    let (got, _) = read_as_opened(&r, "/s").await;
    assert!(got == model, "the first reader kept its old blocks");

    // A report from up-to-date blocks (the writer read the file first)
    // keeps a copy again.
    let o = other.getattr_to_open(o.handle).await.unwrap();
    let o = other.open(&o, true).await.unwrap();
    assert!(other.read_at(&o, 0, 1 << 20).await.unwrap() == model);
    other.write_at(&o, 4999, b"z").await.unwrap();
    other.close(&o, true).await.unwrap();
    model[4999] = b'z';
    let last = c.fs().await;
    let (got, fetched) = read_as_opened(&last, "/s").await;
    assert!(got == model, "wrong bytes after a current report");
    assert_eq!(fetched, 0, "no copy after a current report");
    for fs in [w, r, other, fresh, last] {
        fs.shutdown().await.unwrap();
    }
}

/// Requests of the ninth session's kinds that are wrong are refused, and
/// say why: a lease on a directory's names for a client that is no node,
/// or on a file; a size report whose content is not the size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_watch_and_small_report_requests_are_refused_with_a_reason() {
    use parcache_proto::{Client, ErrorCode, Request, Response, Secret};
    let c = Cluster::up("bad-requests", 1);
    let fs = c.fs().await;
    let f = fs.create("/f", 0o644, true).await.unwrap();
    fs.close(&f, true).await.unwrap();
    let secret = Secret::load(&c.dir.join("secret")).unwrap();
    let conn = Client::connect(c.info()["mds"].as_str().unwrap(), &secret)
        .await
        .unwrap();
    let refused = |r: Response, code: ErrorCode, says: &str| match r {
        Response::Error(e) => {
            assert_eq!(e.code, code, "{}", e.message);
            assert!(e.message.contains(says), "{}", e.message);
        }
        other => panic!("accepted: {other:?}"),
    };
    let root = Request::WatchDir {
        dir: parcache_proto::ROOT,
    };
    let (r, _) = conn.call(&root, &[]).await.unwrap();
    refused(r, ErrorCode::BadRequest, "node");
    let watch_file = Request::As {
        node: 7,
        req: Box::new(Request::WatchDir { dir: f.handle }),
    };
    let (r, _) = conn.call(&watch_file, &[]).await.unwrap();
    refused(r, ErrorCode::NotDir, "not a directory");
    let report = Request::WrittenSmall {
        handle: f.handle,
        size: 10,
        base: f.version,
    };
    let (r, _) = conn.call(&report, b"short").await.unwrap();
    refused(r, ErrorCode::Invalid, "5 bytes of content for a size of 10");
    assert_eq!(
        fs.getattr(f.handle).await.unwrap().size,
        0,
        "the refused report changed the file"
    );
    fs.shutdown().await.unwrap();
}

/// Servers of a running cluster killed under a mount: `parcache up` again
/// restarts only those, at their addresses, and the mount (never
/// unmounted) reads back what it wrote before; with every server running
/// it is refused, as are `--iods` and `--port-base` for a partial restart.
#[test]
fn up_restarts_only_the_servers_that_are_down() {
    let c = Cluster::up("restart-down", 3);
    let m = common::Mounted::new(&c.dir, c.dir.join("mnt"));
    let data = common::pattern(5 << 20, 11);
    // Synced: a metadata server killed loses what nobody synced in its
    // last second (docs/cluster.md), as a local file system does.
    let mut f = std::fs::File::create(m.p("f.bin")).unwrap();
    std::io::Write::write_all(&mut f, &data).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let before = c.info();
    let pids = c.pids();
    let (ok, _, err) = parcache(&["up", "--data", c.d()]);
    assert!(!ok && err.contains("already running"), "{err}");
    // Every server up, a mount asked for: it is made; and made again
    // after its process was killed (its dead mount point cleared).
    let mnt3 = c.dir.join("mnt3");
    for round in 0..2 {
        let (ok, out, err) = parcache(&["up", "--data", c.d(), "--mount", mnt3.to_str().unwrap()]);
        assert!(ok && out.contains("mounted on"), "round {round}: {out}{err}");
        assert!(std::fs::read(mnt3.join("f.bin")).unwrap() == data, "round {round}");
        let pid = String::from_utf8(
            Command::new("pgrep")
                .args(["-f", &format!("mount --data {} {}$", c.d(), mnt3.display())])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        c.kill9(pid.trim().parse().expect("the mount's process"));
    }
    assert_eq!(c.pids(), pids, "no server was restarted");
    // Data server 1 and the metadata server (last of the pids) die.
    c.kill9(pids[1]);
    c.kill9(pids[3]);
    for bad in [["--iods", "3"], ["--port-base", "40000"]] {
        let (ok, _, err) = parcache(&["up", "--data", c.d(), bad[0], bad[1]]);
        assert!(!ok && err.contains("restarts the others"), "{err}");
    }
    let (ok, out, err) = parcache(&["up", "--data", c.d()]);
    assert!(ok, "{err}");
    assert!(
        out.contains("restarted the data server 1") && out.contains("restarted the metadata server"),
        "{out}"
    );
    assert!(
        !out.contains("data server 0") && !out.contains("data server 2"),
        "{out}"
    );
    let now = c.pids();
    assert_eq!((now[0], now[2]), (pids[0], pids[2]), "running servers were restarted");
    assert!(now[1] != pids[1] && now[3] != pids[3]);
    assert_eq!(c.info()["iods"], before["iods"], "a data server moved");
    assert_eq!(c.info()["mds"], before["mds"], "the metadata server moved");
    assert!(
        std::fs::read(m.p("f.bin")).unwrap() == data,
        "the mount read other bytes back"
    );
    // The mount reconnects: a new file, synced to the restarted servers,
    // and both files read by another node, whose cache holds neither.
    let more = common::pattern(3 << 20, 12);
    let mut f = std::fs::File::create(m.p("g.bin")).unwrap();
    std::io::Write::write_all(&mut f, &more).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let other = common::Mounted::new(&c.dir, c.dir.join("mnt2"));
    assert!(
        std::fs::read(other.p("f.bin")).unwrap() == data,
        "f.bin differs on another node"
    );
    assert!(
        std::fs::read(other.p("g.bin")).unwrap() == more,
        "g.bin differs on another node"
    );
    let (ok, out, err) = parcache(&["status", "--data", c.d()]);
    assert!(ok && out.matches(" up ").count() == 4, "{out}{err}");
    other.unmount();
    m.unmount();
}

/// The data servers' read misses and dirty blocks, summed, from `status`.
fn iod_counters(c: &Cluster) -> (u64, u64) {
    let [misses, dirty] = iod_sums(c, ["read_misses", "dirty_blocks"]);
    (misses, dirty)
}

/// Writes `data` into the cluster as `/f.bin` with `parcache cp`.
fn copy_in(c: &Cluster, data: &[u8]) {
    let src = c.dir.join("src.bin");
    std::fs::write(&src, data).unwrap();
    let (ok, _, err) = parcache(&["cp", "--data", c.d(), src.to_str().unwrap(), "pc:/f.bin"]);
    assert!(ok, "{err}");
}

/// `/f.bin`'s bytes, read with `parcache cp`, every block through its data
/// server (whose counters the tests read), none from its part's file.
fn copy_out(c: &Cluster) -> Vec<u8> {
    let out = c.dir.join("out.bin");
    let (ok, _, err) = parcache(&[
        "cp",
        "--no-local-reads",
        "--data",
        c.d(),
        "pc:/f.bin",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    std::fs::read(&out).unwrap()
}

/// The counters `keys` of `parcache status`, each summed over the data
/// servers.
fn iod_sums<const N: usize>(c: &Cluster, keys: [&str; N]) -> [u64; N] {
    let all = common::server_stats(c.d());
    let iods: Vec<&serde_json::Value> = all
        .iter()
        .filter(|(n, _)| n.starts_with("iod"))
        .map(|(_, s)| s)
        .collect();
    keys.map(|k| iods.iter().map(|s| s[k].as_u64().expect("a counter")).sum())
}

/// Each server's counter `key` in `parcache status`, by name.
fn server_counts(c: &Cluster, key: &str) -> std::collections::BTreeMap<String, u64> {
    common::server_stats(c.d())
        .into_iter()
        .map(|(n, s)| (n, s[key].as_u64().expect("a counter")))
        .collect()
}

/// An `fsync` syncs the data servers its node changed something on since
/// its last sync there, not every server of the file's layout, and the
/// metadata server only when the node changed something there: 4 KiB
/// written costs one data server's sync, an `fsync` with nothing new none,
/// 256 KiB (a stripe unit on each of four servers) all four. What was
/// synced reads back through another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsync_syncs_only_the_servers_its_node_changed_something_on() {
    let c = Cluster::up("fsync-servers", 4);
    let fs = c.fs().await;
    let a = fs.create("/f", 0o644, true).await.unwrap();
    let moved = |before: &std::collections::BTreeMap<String, u64>| -> Vec<String> {
        let now = server_counts(&c, "syncs");
        now.iter()
            .filter(|(k, v)| before[*k] != **v)
            .map(|(k, v)| format!("{k}+{}", v - before[k]))
            .collect()
    };
    fs.write_at(&a, 0, &[1u8; 4096]).await.unwrap();
    let before = server_counts(&c, "syncs");
    fs.fsync(&a).await.unwrap();
    let m = moved(&before);
    assert!(
        m.len() == 2 && m.iter().filter(|s| s.starts_with("iod")).count() == 1 && m.contains(&"mds+1".to_string()),
        "one data server and the metadata server synced once each: {m:?}"
    );
    let before = server_counts(&c, "syncs");
    fs.fsync(&a).await.unwrap();
    let m = moved(&before);
    assert!(m.is_empty(), "nothing new to sync, yet: {m:?}");
    let data = common::pattern(256 << 10, 31);
    fs.write_at(&a, 0, &data).await.unwrap();
    let before = server_counts(&c, "syncs");
    fs.fsync(&a).await.unwrap();
    let m = moved(&before);
    assert_eq!(m.len(), 5, "every data server and the metadata server: {m:?}");
    let other = c.fs().await;
    let b = other.resolve("/f").await.unwrap();
    assert!(
        other.read_at(&b, 0, 1 << 20).await.unwrap() == data,
        "other bytes read back"
    );
    fs.close(&a, true).await.unwrap();
}

/// A data server reads its store around the page cache, so its own cache
/// reads ahead of a sequential reader: a cold read of a file in 8 MiB
/// pieces finds blocks of each later piece fetched already. Each block is
/// fetched once, a miss or a prefetch, and nothing past a part's end.
#[test]
fn a_data_server_reads_ahead_of_a_sequential_reader_up_to_its_parts_end() {
    let c = Cluster::up("iod-read-ahead", 2);
    let data = common::pattern((16 << 20) + 5000, 22);
    copy_in(&c, &data);
    let (ok, _, err) = parcache(&["drop-caches", "--data", c.d()]);
    assert!(ok, "{err}");
    let keys = ["read_misses", "read_hits", "prefetch_hits", "prefetches"];
    let before = iod_sums(&c, keys);
    assert!(copy_out(&c) == data, "other bytes read back");
    let after = iod_sums(&c, keys);
    let [misses, hits, prefetch_hits, prefetches] = [0, 1, 2, 3].map(|i| after[i] - before[i]);
    assert!(
        prefetch_hits > 0 && hits >= prefetch_hits,
        "reads found blocks read ahead: {hits} hits, {prefetch_hits} on prefetched blocks, {misses} misses"
    );
    assert_eq!(
        misses + prefetches,
        257,
        "each of the 256 whole blocks and the last one fetched once ({misses} misses, {prefetches} prefetches)"
    );
}

/// `parcache drop-caches` empties every data server's cache, dirty blocks
/// written down first: a file the servers' caches held is read from their
/// stores after it (each block missed or read ahead), with its bytes,
/// partly written blocks included. A stopped cluster is named.
#[test]
fn drop_caches_empties_the_data_servers_caches_and_loses_nothing() {
    let c = Cluster::up("drop-caches", 2);
    let data = common::pattern((1 << 20) + 5000, 21);
    copy_in(&c, &data);
    let read_back = || assert!(copy_out(&c) == data, "other bytes read back");
    let (m0, dirty) = iod_counters(&c);
    assert!(dirty > 0, "the partly written last block is dirty in its server's log");
    read_back();
    let [m1, p1] = iod_sums(&c, ["read_misses", "prefetches"]);
    assert_eq!(m1, m0, "the servers' caches held every block");
    let (ok, stdout, err) = parcache(&["drop-caches", "--data", c.d()]);
    assert!(
        ok && stdout.contains("emptied the caches of 2 data servers"),
        "{stdout}{err}"
    );
    assert_eq!(iod_counters(&c).1, 0, "dirty blocks were written down");
    read_back();
    let [m2, p2] = iod_sums(&c, ["read_misses", "prefetches"]);
    let (missed, ahead) = (m2 - m1, p2 - p1);
    assert_eq!(
        missed + ahead,
        17,
        "every block of the file came from the stores again, 16 whole and the last \
         ({missed} missed, {ahead} read ahead)"
    );
    let (ok, _, _) = parcache(&["down", "--data", c.d()]);
    assert!(ok);
    let (ok, _, err) = parcache(&["drop-caches", "--data", c.d()]);
    assert!(!ok && err.contains("is stopped"), "{err}");
}

/// A cluster's directory removed under its running daemons and a mount
/// (`rm -rf DIR`, a user's slip): `down --data DIR` finds them by their
/// command lines and stops them, the mount's mount point freed too.
/// Before, `down` said "no cluster here" and they ran on, found by nothing.
/// A second `down` finds nothing and says so.
#[test]
fn down_stops_a_cluster_whose_directory_was_removed_under_it() {
    let c = Cluster::up("removed-dir", 2);
    let pids = c.pids();
    let at = c.dir.with_extension("mnt");
    let m = common::Mounted::new(&c.dir, at.clone());
    let mount_pid = m.child.id();
    std::fs::remove_dir_all(&c.dir).unwrap();
    let (ok, out, err) = parcache(&["down", "--data", c.d()]);
    assert!(ok, "down: {out}{err}");
    assert!(err.contains("is gone") && err.contains(&pids[0].to_string()), "{err}");
    let t = std::time::Instant::now();
    while pids
        .iter()
        .chain([&mount_pid])
        .any(|&p| std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| !s.contains(") Z ")))
    {
        assert!(t.elapsed() < Duration::from_secs(40), "still running after down");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!common::mounted(&at), "the mount point is free");
    drop(m);
    let (ok, _, err) = parcache(&["down", "--data", c.d()]);
    assert!(!ok && err.contains("no cluster here"), "{err}");
    // Its Drop's `down` fails, and finds no pids to kill (cluster.json gone).
    std::mem::forget(c);
}

/// A data server killed while a cold read's blocks land in a node cache's
/// own buffers (read from the socket straight into them): the read goes
/// on over a new connection once the server is back, and returns the file
/// as written, never a buffer left half filled by the lost connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_server_killed_during_a_cold_read_leaves_no_wrong_byte() {
    const MIB: usize = 1 << 20;
    let c = Cluster::up("landing", 4);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(21);
    let model: Arc<Vec<u8>> = Arc::new((0..16 * MIB).map(|_| rng.gen()).collect());
    let fs = c.fs().await;
    let a = fs.create("/big", 0o644, true).await.unwrap();
    fs.write_at(&a, 0, &model).await.unwrap();
    fs.fsync(&a).await.unwrap();
    for round in 0..5 {
        // A new node: its cache is cold, every block comes from the servers.
        let reader = c.fs().await;
        let a = reader.resolve("/big").await.unwrap();
        let read = tokio::spawn(async move {
            let mut out = vec![0u8; 16 * MIB];
            for (k, piece) in out.chunks_mut(MIB).enumerate() {
                let n = reader.read_into(&a, (k * MIB) as u64, piece).await?;
                assert_eq!(n, MIB);
            }
            anyhow::Ok(out)
        });
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..30))).await;
        let iods = c.pids();
        c.kill9(iods[rng.gen_range(0..iods.len() - 1)]);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (ok, _, err) = tokio::task::block_in_place(|| parcache(&["up", "--data", c.d()]));
        assert!(ok, "round {round}: parcache up: {err}");
        let got = read
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: the read failed: {e:#}"));
        if got != *model {
            let bad = got.iter().zip(model.iter()).position(|(a, b)| a != b).unwrap();
            panic!(
                "round {round}: wrong bytes from offset {bad} (block {})",
                bad / (64 << 10)
            );
        }
    }
}

/// Opens `path` on node `fs`, reads `len` bytes at each of `offsets` and
/// closes it.
async fn read_pieces_opened(fs: &Fs, path: &str, offsets: &[u64], len: u64) -> Vec<Vec<u8>> {
    let a = fs.resolve(path).await.unwrap();
    let a = fs.getattr_to_open(a.handle).await.unwrap();
    let a = fs.open(&a, false).await.unwrap();
    let mut out = Vec::new();
    for &o in offsets {
        out.push(fs.read_at(&a, o, len).await.unwrap());
    }
    fs.close(&a, false).await.unwrap();
    out
}

/// A node of cluster `c` with node cache settings `cfg`.
async fn node_with(c: &Cluster, cfg: parcache_client::NodeCacheConfig) -> std::sync::Arc<Fs> {
    let secret = parcache_proto::Secret::load(&c.dir.join("secret")).unwrap();
    let mds = c.info()["mds"].as_str().unwrap().to_string();
    Fs::connect_with(&mds, &secret, cfg).await.unwrap()
}

/// Reads 300 bytes at each of `offsets` on `fs` in four rounds, each a
/// new open, checking them against `want`; returns how much each of the
/// two counters `count` picks moved in each round.
async fn four_rounds(
    fs: &Fs,
    offsets: &[u64],
    want: &[Vec<u8>],
    count: impl Fn(&parcache_proto::NodeStats) -> (u64, u64),
) -> Vec<(u64, u64)> {
    let mut seen = Vec::new();
    for _ in 0..4 {
        let before = count(&fs.node_stats());
        assert!(
            read_pieces_opened(fs, "/f", offsets, 300).await == want,
            "wrong bytes read"
        );
        let after = count(&fs.node_stats());
        seen.push((after.0 - before.0, after.1 - before.1));
    }
    seen
}

/// A cluster of two data servers (`tag`) and a node that wrote `/f`
/// whole, `mib` MiB of `byte(i)` at offset `i`, and closed it: the file,
/// as written, is returned beside them.
async fn two_servers_with_f(tag: &str, mib: u64, byte: impl Fn(u64) -> u8) -> (Cluster, Arc<Fs>, Vec<u8>) {
    let c = Cluster::up(tag, 2);
    let w = c.fs().await;
    let a = w.create("/f", 0o644, true).await.unwrap();
    let model: Vec<u8> = (0..mib << 20).map(byte).collect();
    w.write_at(&a, 0, &model).await.unwrap();
    w.close(&a, true).await.unwrap();
    (c, w, model)
}

/// Node `w` opens `/f` again and writes 100 bytes of 7 at `at` (a part
/// of a block: logged at its data server, not in the part's file yet),
/// closes it, and the same goes into `model`.
async fn sevens_at(w: &Fs, at: u64, model: &mut [u8]) {
    let o = w.resolve("/f").await.unwrap();
    let o = w.getattr_to_open(o.handle).await.unwrap();
    let o = w.open(&o, true).await.unwrap();
    w.write_at(&o, at, &[7u8; 100]).await.unwrap();
    w.close(&o, true).await.unwrap();
    model[at as usize..at as usize + 100].fill(7);
}

/// A random reader's few pages of a block the node cache lacks come from
/// the part's file alone, around the node cache (docs/client.md, "Local
/// reads"), twice; the block's third miss reads it whole into the node
/// cache, whose copy answers after that. Bytes at any offset, as the
/// servers would answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_reads_read_only_their_pages_until_a_block_is_missed_a_third_time() {
    const MIB: u64 = 1 << 20;
    let (c, w, model) = two_servers_with_f("read-pages", 8, |i| (i * 7 % 251) as u8).await;
    // Far apart, not 4 KiB aligned, some across a page boundary.
    let offsets: Vec<u64> = (1..9).map(|i| ((i * 3) % 8) * MIB + 4050 * i + 65536).collect();
    let want: Vec<Vec<u8>> = offsets
        .iter()
        .map(|&o| model[o as usize..o as usize + 300].to_vec())
        .collect();
    let r = c.fs().await;
    let seen = four_rounds(&r, &offsets, &want, |s| (s.local_part_reads, s.local_part_short)).await;
    let [(reads1, short1), (reads2, short2), (reads3, short3), (reads4, _)] = seen[..] else {
        unreachable!()
    };
    assert!(
        short1 >= 6 && reads1 == short1 && short2 == short1 && reads2 == short2,
        "first and second touches read their pages only: {seen:?}"
    );
    assert!(short3 == 0 && reads3 >= 6, "third touches read whole blocks: {seen:?}");
    assert_eq!(reads4, 0, "then the node cache answers: {seen:?}");

    // A node that does not read part files (another machine's, say) asks
    // the data servers for the pages alone (`ReadPages`), in the same
    // rounds.
    let remote = parcache_client::NodeCacheConfig {
        local_reads: false,
        ..Default::default()
    };
    let n = node_with(&c, remote).await;
    let seen = four_rounds(&n, &offsets, &want, |s| (s.server_page_reads, s.server_reads)).await;
    assert_eq!(n.node_stats().local_part_reads, 0);
    let [(pages1, _), (pages2, _), (pages3, blocks3), (pages4, blocks4)] = seen[..] else {
        unreachable!()
    };
    assert!(
        pages1 >= 6 && pages2 == pages1,
        "first and second touches: pages from the servers: {seen:?}"
    );
    assert!(pages3 == 0 && blocks3 >= 6, "third touches: whole blocks: {seen:?}");
    assert_eq!((pages4, blocks4), (0, 0), "then the node cache answers: {seen:?}");

    // Another node changes 100 bytes of a block (logged at its server,
    // not in its store yet): the server answers those pages through its
    // log and cache, not from its store.
    let mut model = model;
    sevens_at(&w, offsets[3] + 10, &mut model).await;
    let want: Vec<Vec<u8>> = offsets
        .iter()
        .map(|&o| model[o as usize..o as usize + 300].to_vec())
        .collect();
    let before = n.node_stats().server_page_reads;
    assert!(
        read_pieces_opened(&n, "/f", &offsets, 300).await == want,
        "a data server answered pages from its store without a logged change"
    );
    assert!(n.node_stats().server_page_reads - before >= 6);
    for fs in [w, r, n] {
        fs.shutdown().await.unwrap();
    }
}

/// Local reads (docs/client.md): a node on the data servers' machine reads
/// a random reader's missed blocks from their part files. It sees what
/// the servers would answer: another node's change, logged at a data
/// server and not yet in the part's file, once its open finds the file
/// changed; its own write after it sent it; and it reads nothing itself
/// with `local_reads` off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_reads_read_part_files_and_see_every_change_the_servers_would_answer() {
    const MIB: u64 = 1 << 20;
    // Whole blocks: they go to the part files directly, not to the log.
    let (c, w, mut model) = two_servers_with_f("local-reads", 16, |i| (i % 251) as u8).await;
    // Far apart: each a random reader's fetch, not a sequential one's;
    // blocks of both data servers' parts.
    let offsets: Vec<u64> = (0..8).map(|i| ((i * 5) % 16) * MIB + (65536 + 4096) * i).collect();
    let want = |model: &[u8]| -> Vec<Vec<u8>> {
        offsets
            .iter()
            .map(|&o| model[o as usize..(o + 4096) as usize].to_vec())
            .collect()
    };

    let r = c.fs().await;
    assert!(read_pieces_opened(&r, "/f", &offsets, 4096).await == want(&model));
    let local = r.node_stats().local_part_reads;
    assert!(local >= 4, "{local} local reads of 8 random blocks");

    // Another node changes 100 bytes inside a block `r` read: logged at
    // its data server (a part of a block), not in the part's file.
    sevens_at(&w, offsets[3] + 10, &mut model).await;
    // `r` opens again: its cached blocks and part files go; the changed
    // block, logged at its server, is read through it, the others still
    // from their files.
    let before = r.node_stats();
    let got = read_pieces_opened(&r, "/f", &offsets, 4096).await;
    assert!(
        got == want(&model),
        "a node read a part's file without another node's change"
    );
    let after = r.node_stats();
    let (local, refused) = (
        after.local_part_reads - before.local_part_reads,
        after.local_part_refused - before.local_part_refused,
    );
    assert!(refused >= 1, "the logged block was read through its server");
    assert!(
        local >= 5,
        "{local} of 8 blocks read from their files after one changed"
    );

    // A node's own change: logged at the data server, so the part file it
    // read before lacks it. With a pool of 16 blocks, reading 4 MiB
    // elsewhere pushes the changed block out of its cache; reading it again
    // must not come from that file.
    let small = parcache_client::NodeCacheConfig {
        pool_bytes: MIB,
        ..Default::default()
    };
    let s = node_with(&c, small).await;
    let h = s.resolve("/f").await.unwrap();
    let h = s.getattr_to_open(h.handle).await.unwrap();
    let h = s.open(&h, true).await.unwrap();
    // A block of a part whose server still lends its file (the other
    // holds the logged change above).
    let mut mine = None;
    for &o in &offsets {
        let before = s.node_stats().local_part_reads;
        assert!(s.read_at(&h, o, 4096).await.unwrap() == model[o as usize..o as usize + 4096]);
        if s.node_stats().local_part_reads > before {
            mine = Some(o);
            break;
        }
    }
    let mine = mine.unwrap_or_else(|| panic!("no block came from its part's file: {:?}", s.node_stats()));
    s.write_at(&h, mine + 10, &[9u8; 10]).await.unwrap();
    s.flush(&h).await.unwrap();
    model[mine as usize + 10..mine as usize + 20].fill(9);
    assert!(s.read_at(&h, 10 * MIB, 4 * MIB).await.unwrap() == model[10 * MIB as usize..14 * MIB as usize]);
    let got = s.read_at(&h, mine, 4096).await.unwrap();
    assert!(
        got == model[mine as usize..mine as usize + 4096],
        "a node read a part's file without its own change"
    );
    s.close(&h, true).await.unwrap();

    // A node told not to reads through the data servers only.
    let off = parcache_client::NodeCacheConfig {
        local_reads: false,
        ..Default::default()
    };
    let n = node_with(&c, off).await;
    assert!(read_pieces_opened(&n, "/f", &offsets, 4096).await == want(&model));
    assert_eq!(n.node_stats().local_part_reads, 0);
    for fs in [w, r, s, n] {
        fs.shutdown().await.unwrap();
    }
}

/// A node's readers are shown no size another task's write makes before
/// its bytes are in the node cache: with several threads answering a
/// mount's requests, a `stat` in the middle of an appending write showed
/// its size and the kernel read zeros there. One task appends 256 KiB
/// pieces; two read up to the size the node shows, over and over, and
/// check every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reader_is_shown_the_size_of_a_write_whose_bytes_have_not_landed() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const PIECE: usize = 256 << 10;
    let c = Cluster::up("landed-size", 2);
    let w = c.fs().await;
    let a = w.create("/grows", 0o644, true).await.unwrap();
    let data: Arc<Vec<u8>> = Arc::new((0..160 * PIECE).map(|i| (i % 251) as u8 + 1).collect());
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (w, a, data, done) = (w.clone(), a.clone(), data.clone(), done.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; data.len()];
                let mut reads = 0u64;
                while !done.load(Ordering::SeqCst) {
                    let now = w.getattr(a.handle).await.unwrap();
                    let shown = w.size_of(&now) as usize;
                    let n = w.read_into(&a, 0, &mut buf[..shown]).await.unwrap();
                    let wrong = buf[..n].iter().zip(data.iter()).position(|(x, y)| x != y);
                    assert!(
                        n == shown && wrong.is_none(),
                        "reader {r}, read {reads}: shown {shown} bytes, read {n}, first wrong byte at {wrong:?}"
                    );
                    reads += 1;
                    tokio::task::yield_now().await;
                }
                reads
            })
        })
        .collect();
    for (k, piece) in data.chunks(PIECE).enumerate() {
        w.write_at(&a, (k * PIECE) as u64, piece).await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    for r in readers {
        assert!(r.await.unwrap() > 0, "a reader never read");
    }
    w.close(&a, true).await.unwrap();
}
