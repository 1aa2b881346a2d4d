//! Misuse and faults a user meets: a file copied onto itself, two daemons
//! on one directory, servers given in another order, a data server dying
//! with unwritten bytes, a full disk, a failed `up`, a closed pipe, wrong
//! secrets and wrong addresses, a metadata server killed and restarted
//! under nodes that keep what it told them. Each test failed on the code
//! before its fix.

use parcache_client::Fs;
use parcache_proto::Secret;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use common::{parcache, Cluster, SmallDisk};

/// Runs `parcache ARGS`, killing it after `secs` (a hang is a failure).
fn parcache_within(secs: u64, args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_parcache"))
        .args(args)
        .env("PARCACHE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "parcache {args:?} did not answer within {secs} s: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

/// A daemon started by hand; killed when dropped.
struct Daemon(Child);

impl Daemon {
    /// Starts `parcache ARGS`; returns it and the address it listens on,
    /// or its error output if it did not start.
    fn start(args: &[&str]) -> Result<(Daemon, String), String> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_parcache"))
            .args(args)
            .env("PARCACHE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        match line.trim().strip_prefix("listening on ") {
            Some(a) => Ok((Daemon(child), a.to_string())),
            None => {
                let o = child.wait_with_output().unwrap();
                Err(String::from_utf8_lossy(&o.stderr).into())
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn put(c: &Cluster, name: &str, bytes: &[u8]) {
    let local = c.dir.with_extension(format!("{}.in", name.replace('/', "-")));
    std::fs::write(&local, bytes).unwrap();
    let (ok, _, err) = parcache(&["cp", "--data", c.d(), local.to_str().unwrap(), &format!("pc:/{name}")]);
    assert!(ok, "{err}");
    let _ = std::fs::remove_file(local);
}

fn cat(c: &Cluster, name: &str) -> Vec<u8> {
    let o = Command::new(env!("CARGO_BIN_EXE_parcache"))
        .args(["cat", "--data", c.d(), &format!("pc:/{name}")])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o.stdout
}

/// Issue 9.1: `cp pc:/f pc:/f` (or `pc:/./f`) emptied the file, exit 0.
#[test]
fn cp_refuses_to_copy_a_file_onto_itself() {
    let c = Cluster::up("trust-cp", 2);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    put(&c, "f", &data);
    for dst in ["pc:/f", "pc:/./f", "pc:/"] {
        let (ok, _, err) = parcache(&["cp", "--data", c.d(), "pc:/f", dst]);
        assert!(!ok && err.contains("are the same file"), "cp pc:/f {dst}: {err}");
    }
    assert_eq!(cat(&c, "f"), data, "the file is intact");
}

/// `cp` of a directory (a local one into the cluster, a cluster one within
/// it) onto an existing file emptied the file, then failed ("Is a
/// directory", "has no layout"); a new destination was left empty. GNU cp
/// refuses before it touches the destination; so does `cp` now.
#[test]
fn cp_of_a_directory_refuses_before_it_touches_the_destination() {
    let c = Cluster::up("trust-cpdir", 1);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    put(&c, "f", &data);
    let local = std::env::temp_dir().join(format!("parcache-cpdir-{}", std::process::id()));
    std::fs::create_dir_all(&local).unwrap();
    let (ok, _, err) = parcache(&["mkdir", "--data", c.d(), "pc:/dir"]);
    assert!(ok, "{err}");
    let cases = [
        (local.to_str().unwrap().to_string(), "pc:/f"),
        (local.to_str().unwrap().to_string(), "pc:/new"),
        ("pc:/dir".to_string(), "pc:/f"),
        ("pc:/dir".to_string(), "pc:/new"),
    ];
    for (src, dst) in &cases {
        let (ok, _, err) = parcache(&["cp", "--data", c.d(), src, dst]);
        assert!(cat(&c, "f") == data, "cp {src} {dst} changed pc:/f ({err})");
        assert!(!ok && err.contains("nothing was changed"), "cp {src} {dst}: {err}");
    }
    let (ok, out, err) = parcache(&["ls", "--data", c.d(), "pc:/"]);
    assert!(ok && !out.contains("new"), "no file made: {out}{err}");
    // A file where a directory is wanted is named by its path.
    let one = local.join("one");
    std::fs::write(&one, b"1").unwrap();
    let (ok, _, err) = parcache(&["cp", "--data", c.d(), one.to_str().unwrap(), "pc:/f/x"]);
    assert!(!ok && err.contains("'/f' is not a directory"), "{err}");
    let _ = std::fs::remove_dir_all(&local);
}

/// Issue 9.2: a second data server (or metadata server) on one directory
/// is refused while the first runs; the first's data stays readable.
#[test]
fn a_second_daemon_on_one_directory_is_refused() {
    let c = Cluster::up("trust-twice", 2);
    put(&c, "f", b"kept");
    let secret = c.dir.join("secret");
    for (what, sub) in [("iod", "iod-0"), ("mds", "mds")] {
        let d = c.dir.join(sub);
        let mut args = vec![
            what,
            "--data",
            d.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--secret-file",
            secret.to_str().unwrap(),
        ];
        if what == "mds" {
            args.extend(["--iod", "127.0.0.1:1"]);
        }
        let err = Daemon::start(&args).err().expect("refused");
        assert!(err.contains("already running on"), "{what}: {err}");
    }
    assert_eq!(cat(&c, "f"), b"kept");
}

/// A daemon's directory holds what clients wrote (a data server's parts
/// and log, the metadata server's copies of small files): its owner's
/// alone, so another local user cannot read it without the cluster
/// secret. One opened by hand is closed again at the next start.
#[test]
fn daemon_directories_are_their_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::up("trust-private", 2);
    put(&c, "f", b"private bytes");
    let mode = |sub: &str| std::fs::metadata(c.dir.join(sub)).unwrap().permissions().mode() & 0o777;
    for sub in ["iod-0", "iod-1", "mds"] {
        assert_eq!(mode(sub) & 0o077, 0, "{sub}: {:o}", mode(sub));
    }
    let (ok, _, err) = parcache(&["down", "--data", c.d()]);
    assert!(ok, "{err}");
    std::fs::set_permissions(c.dir.join("iod-0"), std::fs::Permissions::from_mode(0o755)).unwrap();
    c.start(2);
    assert_eq!(mode("iod-0"), 0o700);
    assert_eq!(cat(&c, "f"), b"private bytes");
}

/// Issue 9.2: a stripe missing from a data server's store is an error,
/// never zeros; holes (sparse files, truncate up) still read as zeros.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_stripe_is_an_error_and_holes_are_zeros() {
    let c = Cluster::up("trust-missing", 3);
    let fs = c.fs().await;
    // Sparse: one byte at the start, one 3 MiB in; a file cut up to 5 MiB.
    let a = fs.create("/sparse", 0o644, true).await.unwrap();
    fs.write_at(&a, 0, b"a").await.unwrap();
    fs.write_at(&a, 3 << 20, b"b").await.unwrap();
    fs.fsync(&a).await.unwrap();
    let t = fs.create("/cut", 0o644, true).await.unwrap();
    fs.write_at(&t, 0, b"xyz").await.unwrap();
    fs.fsync(&t).await.unwrap();
    fs.truncate(&fs.resolve("/cut").await.unwrap(), 5 << 20).await.unwrap();
    let other = c.fs().await;
    let s = other.resolve("/sparse").await.unwrap();
    let got = other.read_at(&s, 0, s.size).await.unwrap();
    let mut want = vec![0u8; (3 << 20) + 1];
    want[0] = b'a';
    want[3 << 20] = b'b';
    assert!(got == want, "holes read as zeros");
    let t = other.resolve("/cut").await.unwrap();
    let got = other.read_at(&t, 0, t.size).await.unwrap();
    assert!(got.len() == 5 << 20 && &got[..3] == b"xyz" && got[3..].iter().all(|&b| b == 0));

    // A whole file, then its stripes on one data server lost.
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 249) as u8).collect();
    put(&c, "whole", &data);
    let (ok, _, err) = parcache(&["down", "--data", c.d()]);
    assert!(ok, "{err}");
    for e in std::fs::read_dir(c.dir.join("iod-1/objects")).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    c.start(3);
    let o = Command::new(env!("CARGO_BIN_EXE_parcache"))
        .args(["cat", "--data", c.d(), "pc:/whole"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("missing"), "{err}");
}

/// Issue 9.3: the metadata server restarted with its data servers in
/// another order, or fewer of them, refuses to start, naming the order.
#[test]
fn the_metadata_server_refuses_data_servers_in_another_order() {
    let c = Cluster::up("trust-order", 3);
    let data: Vec<u8> = (0..400_000u32).map(|i| (i * 7 % 253) as u8).collect();
    put(&c, "f", &data);
    let (ok, _, err) = parcache(&["down", "--data", c.d()]);
    assert!(ok, "{err}");
    let secret = c.dir.join("secret");
    let s = secret.to_str().unwrap();
    let mut iods = vec![];
    for i in 0..3 {
        let d = c.dir.join(format!("iod-{i}"));
        let args = [
            "iod",
            "--data",
            d.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--secret-file",
            s,
        ];
        iods.push(Daemon::start(&args).unwrap());
    }
    let mds_dir = c.dir.join("mds");
    let mds = |order: &[usize]| {
        let mut args = vec![
            "mds".to_string(),
            "--data".into(),
            mds_dir.to_str().unwrap().into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--secret-file".into(),
            s.into(),
        ];
        for &i in order {
            args.push("--iod".into());
            args.push(iods[i].1.clone());
        }
        Daemon::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let err = mds(&[1, 0, 2]).err().expect("refused");
    let right = format!("--iod {} --iod {} --iod {}", iods[0].1, iods[1].1, iods[2].1);
    assert!(err.contains("wrong order") && err.contains(&right), "{err}");
    let err = mds(&[0, 1]).err().expect("refused");
    assert!(err.contains("has 3 data servers"), "{err}");
    // The right order starts, and the file reads back whole.
    let (_m, addr) = mds(&[0, 1, 2]).expect("the right order starts");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fs = Fs::connect(&addr, &Secret::load(&secret).unwrap()).await.unwrap();
        let a = fs.resolve("/f").await.unwrap();
        assert_eq!(fs.read_at(&a, 0, a.size).await.unwrap(), data);
    });
}

/// Issue 9.4: a data server killed while a node still held written bytes:
/// the close fails, and the file's size is never reported beyond what the
/// data servers acknowledged (it used to be, at unmount, so the missing
/// stripes read back as zeros with no error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_back_never_reports_its_size() {
    let c = Cluster::up("trust-close", 2);
    let fs = c.fs().await;
    fs.set_retries(1);
    fs.mkdir("/wb", 0o755).await.unwrap();
    fs.set_policy("/wb", "write", "write-back").await.unwrap();
    let a = fs.create("/wb/f", 0o644, true).await.unwrap();
    let a = fs.open(&a, true).await.unwrap();
    fs.write_at(&a, 0, &vec![5u8; 1 << 20]).await.unwrap();
    c.kill9(c.pids()[1]);
    assert!(fs.close(&a, true).await.is_err(), "the close reports the loss");
    assert!(fs.shutdown().await.is_err(), "so does the shutdown");
    let other = c.fs().await;
    let size = other.resolve("/wb/f").await.unwrap().size;
    assert_eq!(size, 0, "no size beyond the acknowledged bytes");
    assert_eq!(fs.local_size(a.handle), None, "the writer's own view fell back too");
}

/// A metadata server killed before its durable commit loses the files
/// created since, as a crash does; their handles are never given to new
/// files, whose holes then read as zeros, not as the bytes of a lost file
/// that the data servers still hold (a new file used to get the lost one's
/// handle, and its part).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_lost_in_a_crash_is_never_given_again() {
    let c = Cluster::up("trust-handles", 2);
    lose_a_file(&c).await;
    let fs = c.fs().await;
    let b = fs.create("/b", 0o644, true).await.unwrap();
    let b = fs.open(&b, true).await.unwrap();
    fs.write_at(&b, 0, &[b'B'; 4096]).await.unwrap();
    fs.write_at(&b, 1 << 20, &[b'B'; 4096]).await.unwrap();
    fs.close(&b, true).await.unwrap();
    let other = c.fs().await;
    let b = other.resolve("/b").await.unwrap();
    let hole = other.read_at(&b, 4096, 8192).await.unwrap();
    assert!(
        hole.iter().all(|&x| x == 0),
        "the new file's hole reads a lost file's bytes"
    );
}

/// Writes 2 MiB files and kills the metadata server (`kill -9`) after each
/// close, restarting it, until one file is lost: created after the
/// server's last durable commit, its parts kept by the data servers.
/// Returns the lost file's name.
async fn lose_a_file(c: &Cluster) -> String {
    // The metadata server commits every second: try until the kill comes
    // first (it almost always does at once).
    for round in 0..5 {
        let fs = c.fs().await;
        let name = format!("/a{round}");
        let a = fs.create(&name, 0o644, true).await.unwrap();
        let a = fs.open(&a, true).await.unwrap();
        fs.write_at(&a, 0, &vec![b'A'; 2 << 20]).await.unwrap();
        fs.close(&a, true).await.unwrap();
        restart_mds(c);
        if c.fs().await.resolve(&name).await.is_err() {
            return name;
        }
    }
    panic!("a kill never came before the metadata server's commit");
}

/// The handles of the parts every data server of the cluster holds.
fn parts(c: &Cluster) -> Vec<u64> {
    common::parts_in(&c.dir)
}

/// `parcache gc` removes the parts of a file the metadata server lost in
/// a crash (they stayed on the data servers as used space), only those,
/// and only once old enough (by default ten minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_no_file_owns_are_collected() {
    let c = Cluster::up("trust-orphan-parts", 2);
    let fs = c.fs().await;
    let keep = fs.create("/keep", 0o644, true).await.unwrap();
    let f = fs.open(&keep, true).await.unwrap();
    let bytes: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    fs.write_at(&f, 0, &bytes).await.unwrap();
    // Durable at the metadata server too, so the kill below cannot lose
    // /keep.
    fs.fsync(&f).await.unwrap();
    fs.close(&f, true).await.unwrap();
    lose_a_file(&c).await;
    let before = parts(&c);
    let (ok, out, err) = parcache(&["gc", "--data", c.d()]);
    assert!(ok, "{err}");
    assert!(
        out.contains("0 file parts written over 600 s ago, 0 of no file removed"),
        "{out}"
    );
    assert_eq!(parts(&c), before, "a young part was removed");

    // A file just written (its create perhaps not yet durable) is known.
    let fs = c.fs().await;
    let fresh = fs.create("/fresh", 0o644, true).await.unwrap();
    let f = fs.open(&fresh, true).await.unwrap();
    fs.write_at(&f, 0, &bytes).await.unwrap();
    fs.close(&f, true).await.unwrap();
    let (ok, out, err) = parcache(&["gc", "--data", c.d(), "--older-than", "0"]);
    assert!(ok, "{err}");
    let after = parts(&c);
    let mut owned = Vec::new();
    for e in fs.readdir("/").await.unwrap() {
        owned.push(e.handle);
    }
    let gone: Vec<u64> = before.iter().copied().filter(|h| !after.contains(h)).collect();
    assert!(!gone.is_empty(), "the lost file's parts stayed: {before:?}\n{out}");
    assert!(gone.iter().all(|h| !owned.contains(h)), "a file's part was removed");
    assert!(
        after.iter().all(|h| owned.contains(h)),
        "a part no file owns stayed: {after:?}, files {owned:?}"
    );
    assert!(out.contains(&format!("{} of no file removed", gone.len())), "{out}");
    for name in ["/keep", "/fresh"] {
        let a = fs.resolve(name).await.unwrap();
        assert_eq!(fs.read_at(&a, 0, bytes.len() as u64).await.unwrap(), bytes, "{name}");
    }
}

/// A 2-server cluster on a 40 MiB tmpfs, and a 4 MiB local file to copy
/// in. Fields drop in order: the cluster stops before the disk goes.
struct OnSmallDisk {
    c: Cluster,
    _disk: SmallDisk,
    dir: std::path::PathBuf,
    local: std::path::PathBuf,
    piece: Vec<u8>,
}

impl OnSmallDisk {
    /// `None` where no tmpfs can be mounted (not root).
    fn up(tag: &str) -> Option<OnSmallDisk> {
        let disk = SmallDisk::new(tag, 40)?;
        let dir = disk.0.join("cluster");
        let (ok, _, err) = parcache_within(30, &["up", "--data", dir.to_str().unwrap(), "--iods", "2"]);
        assert!(ok, "{err}");
        let piece: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 241) as u8).collect();
        let local = std::env::temp_dir().join(format!("parcache-{tag}-{}.in", std::process::id()));
        std::fs::write(&local, &piece).unwrap();
        Some(OnSmallDisk {
            c: Cluster { dir: dir.clone() },
            _disk: disk,
            dir,
            local,
            piece,
        })
    }
    fn d(&self) -> &str {
        self.dir.to_str().unwrap()
    }
    /// Copies the local file in as `pc:/NAME` (within a minute).
    fn cp(&self, name: &str) -> (bool, String) {
        let (ok, _, err) = parcache_within(
            60,
            &[
                "cp",
                "--data",
                self.d(),
                self.local.to_str().unwrap(),
                &format!("pc:/{name}"),
            ],
        );
        (ok, err)
    }
    /// Copies the local file in as f0, f1, … until a copy fails: the
    /// numbers stored, and the failure.
    fn fill(&self) -> (Vec<usize>, Option<String>) {
        let mut stored = vec![];
        for i in 0..30 {
            let (ok, err) = self.cp(&format!("f{i}"));
            if !ok {
                return (stored, Some(err));
            }
            stored.push(i);
        }
        (stored, None)
    }
}

impl Drop for OnSmallDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.local);
    }
}

/// Issues 9.5 and 9.6: on a full disk the application sees ENOSPC, nothing
/// panics or hangs, `status` and `down` answer, deleting files frees the
/// space, and the cluster restarts on the full disk.
#[test]
fn a_full_disk_gives_enospc_and_deleting_files_frees_it() {
    let Some(s) = OnSmallDisk::up("trust-full") else {
        return;
    };
    let (d, dir) = (s.d(), &s.dir);
    let (stored, full) = s.fill();
    let err = full.expect("40 MiB fill up");
    eprintln!("full after {} files: {err}", stored.len());
    assert!(err.to_lowercase().contains("space"), "ENOSPC is named: {err}");
    assert!(!stored.is_empty());
    let (_, out, err) = parcache_within(5, &["status", "--data", d]);
    assert!(out.contains(" up ") && !err.contains("panicked"), "{out}{err}");
    for log in ["iod-0.log", "iod-1.log", "mds.log"] {
        let l = std::fs::read_to_string(dir.join(log)).unwrap_or_default();
        assert!(!l.contains("panicked"), "{log}: {l}");
    }
    // A restart on the full disk: replay needs no space.
    let (_, _, err) = parcache_within(60, &["down", "--data", d]);
    assert!(!err.contains("panicked"), "{err}");
    let (ok, _, err) = parcache_within(60, &["up", "--data", d]);
    assert!(ok, "restart on a full disk: {err}");
    assert_eq!(cat(&s.c, &format!("f{}", stored[0])), s.piece);
    // Deleting frees the space: the same files fit again.
    for i in &stored {
        let (ok, _, err) = parcache_within(30, &["rm", "--data", d, &format!("pc:/f{i}")]);
        assert!(ok, "{err}");
    }
    for i in 0..stored.len().min(3) {
        let (ok, err) = s.cp(&format!("g{i}"));
        assert!(ok, "space came back after deleting: {err}");
    }
    assert_eq!(cat(&s.c, "g0"), s.piece);
    let (ok, _, err) = parcache_within(30, &["down", "--data", d]);
    assert!(ok, "{err}");
}

/// A full disk that fails the metadata server's durable commit does not
/// leave it refusing every later request: once files are deleted, without
/// a restart, new files are created, written and read back (it used to
/// answer "Previous I/O error occurred" until restarted).
#[test]
fn a_full_disk_is_recovered_from_without_a_restart() {
    let Some(s) = OnSmallDisk::up("trust-full2") else {
        return;
    };
    let d = s.d();
    let (stored, _) = s.fill();
    // Fill what is left with the metadata server's own writes: many small
    // files, until one fails.
    for i in 0..2000 {
        let (ok, _, _) = parcache_within(30, &["mkdir", "--data", d, &format!("pc:/d{i}")]);
        if !ok {
            break;
        }
    }
    let (ok, out, err) = parcache_within(30, &["ls", "--data", d, "pc:/"]);
    assert!(ok, "ls on a full disk: {out}{err}");
    for i in &stored {
        let (ok, _, err) = parcache_within(30, &["rm", "--data", d, &format!("pc:/f{i}")]);
        assert!(ok, "rm without a restart: {err}");
    }
    let (ok, err) = s.cp("g0");
    assert!(ok, "space came back after deleting, without a restart: {err}");
    assert_eq!(cat(&s.c, "g0"), s.piece);
    let l = std::fs::read_to_string(s.dir.join("mds.log")).unwrap_or_default();
    assert!(!l.contains("panicked"), "mds.log: {l}");
    let (ok, _, err) = parcache_within(30, &["down", "--data", d]);
    assert!(ok, "{err}");
}

/// Issue 9.8 and 9.10: a restart reuses the ports; a failed `up` (a port in
/// use) stops the servers it started; a port base past 65535 is refused.
#[test]
fn up_reuses_ports_and_a_failed_up_leaves_nothing_running() {
    let c = Cluster::up("trust-ports", 2);
    let before = (c.info()["mds"].clone(), c.info()["iods"].clone());
    let (ok, _, err) = parcache(&["down", "--data", c.d()]);
    assert!(ok, "{err}");
    c.start(2);
    assert_eq!((c.info()["mds"].clone(), c.info()["iods"].clone()), before);

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let p = taken.local_addr().unwrap().port();
    let dir = c.dir.with_extension("failed");
    let (ok, _, err) = parcache(&[
        "up",
        "--data",
        dir.to_str().unwrap(),
        "--iods",
        "3",
        "--port-base",
        &(p - 2).to_string(),
    ]);
    assert!(!ok && err.contains("in use"), "the daemon's own error is shown: {err}");
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    for pid in info["pids"].as_array().unwrap() {
        let pid = pid.as_u64().unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(stat.is_empty() || stat.contains(") Z "), "server {pid} left running");
    }
    let (ok, out, _) = parcache(&["down", "--data", dir.to_str().unwrap()]);
    assert!(ok && out.contains("stopped already"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
    let (ok, _, err) = parcache(&["up", "--data", dir.to_str().unwrap(), "--port-base", "65534"]);
    assert!(!ok && err.contains("65535"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn threads(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Issue 9.11: a data server grew to about 516 threads under a sequential
/// write (tokio's blocking pool); every daemon stays at or under 64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_threads_stay_bounded_under_a_large_write() {
    let c = Cluster::up("trust-threads", 2);
    let fs = c.fs().await;
    let pids = c.pids();
    let sampler = {
        let pids = pids.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            for _ in 0..400 {
                for &p in &pids {
                    most = most.max(threads(p));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            most
        })
    };
    let a = fs.create("/big", 0o644, true).await.unwrap();
    let piece = vec![3u8; 8 << 20];
    let mut writes = vec![];
    for k in 0..32u64 {
        let (fs, a, piece) = (fs.clone(), a.clone(), piece.clone());
        writes.push(tokio::spawn(async move { fs.write_at(&a, k << 23, &piece).await }));
    }
    for w in writes {
        w.await.unwrap().unwrap();
    }
    fs.fsync(&a).await.unwrap();
    let most = sampler.join().unwrap();
    eprintln!("most threads in one daemon under a 256 MiB write: {most}");
    assert!(most > 0 && most <= 64, "{most} threads");
}

/// Issue 9.12 and the clear errors: a closed pipe ends a command quietly;
/// a wrong secret, a data server given as the metadata server and a port
/// that is not parcache's each say so in a sentence; a stopped cluster
/// says stopped; `status` fails while a server is down; statfs counts a
/// disk shared by all servers once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_say_what_is_wrong() {
    let c = Cluster::up("trust-errors", 2);
    let bin = env!("CARGO_BIN_EXE_parcache");
    for cmd in ["status", "ls pc:/"] {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("{bin} {cmd} --data {} | head -c 1 >/dev/null", c.d()))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{cmd} | head: {err}");
    }
    // A copy out whose reader goes away ends quietly and well; one that
    // cannot be written names where it went.
    put(&c, "big", &vec![7u8; 1 << 20]);
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{bin} cat --data {} pc:/big | head -c 1 >/dev/null; exit ${{PIPESTATUS[0]}}",
            c.d()
        ))
        .output()
        .unwrap();
    assert!(o.status.success() && o.stderr.is_empty(), "cat | head: {o:?}");
    let (ok, _, err) = parcache(&["cp", "--data", c.d(), "pc:/big", "/dev/full"]);
    assert!(!ok && err.contains("writing /dev/full: No space left"), "{err}");
    // A file given as a cluster directory, a mount point that is not there.
    let file = c.dir.with_extension("a-file");
    std::fs::write(&file, b"x").unwrap();
    let (ok, _, err) = parcache(&["up", "--data", file.to_str().unwrap()]);
    assert!(!ok && err.contains("not a directory"), "{err}");
    let _ = std::fs::remove_file(&file);
    let (ok, _, err) = parcache(&["mount", "--data", c.d(), "/no/such/mount/point"]);
    assert!(!ok && err.contains("/no/such/mount/point does not exist"), "{err}");
    let iod = c.info()["iods"][0].as_str().unwrap().to_string();
    let secret = c.dir.join("secret");
    let (ok, _, err) = parcache(&["ls", "--mds", &iod, "--secret-file", secret.to_str().unwrap(), "pc:/"]);
    assert!(!ok && err.contains("data server, not a metadata server"), "{err}");
    let wrong = c.dir.with_extension("wrong-secret");
    Secret::generate().save(&wrong).unwrap();
    let mds = c.info()["mds"].as_str().unwrap().to_string();
    let (ok, _, err) = parcache(&["ls", "--mds", &mds, "--secret-file", wrong.to_str().unwrap(), "pc:/"]);
    assert!(!ok && err.contains("secret file does not match"), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    let log = std::fs::read_to_string(c.dir.join("mds.log")).unwrap();
    assert!(log.contains("cluster secret does not match"), "the server warns: {log}");
    let _ = std::fs::remove_file(wrong);
    // A port that is not parcache's: it answers with something else.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other_addr = other.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = other.accept() {
            use std::io::Write;
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        }
    });
    let (ok, _, err) = parcache(&[
        "ls",
        "--mds",
        &other_addr,
        "--secret-file",
        secret.to_str().unwrap(),
        "pc:/",
    ]);
    assert!(!ok && err.contains("not a parcache server"), "{err}");

    // Policies: stripe keys apply to new files; a width past the servers
    // warns; `policy get` says where each value comes from.
    put(&c, "data", b"laid out already");
    let (ok, _, err) = parcache(&["policy", "set", "--data", c.d(), "pc:/data", "stripe_unit=1M"]);
    assert!(!ok && err.contains("applies to new files"), "{err}");
    let (ok, _, err) = parcache(&["mkdir", "--data", c.d(), "pc:/wide"]);
    assert!(ok, "{err}");
    let (ok, _, err) = parcache(&[
        "policy",
        "set",
        "--data",
        c.d(),
        "pc:/wide",
        "stripe_width=9",
        "write=write-back",
    ]);
    assert!(ok && err.contains("warning") && err.contains("2 data servers"), "{err}");
    put(&c, "wide/f", b"x");
    let (ok, out, err) = parcache(&["policy", "get", "--data", c.d(), "pc:/wide/f"]);
    assert!(
        ok && out.contains("write=write-back")
            && out.contains("inherited from its directory")
            && out.contains("replacement=lru")
            && out.contains("(default)")
            && out.contains("stripe_width=2"),
        "{out}{err}"
    );
    for log in ["mds.log", "iod-0.log"] {
        let l = std::fs::read_to_string(c.dir.join(log)).unwrap();
        assert!(!l.contains('\u{1b}'), "{log} has colour codes: {l}");
    }

    let fs = c.fs().await;
    let st = fs.statfs().await.unwrap();
    let df = Command::new("stat")
        .args(["-f", "-c", "%b %S", c.d()])
        .output()
        .unwrap();
    let df = String::from_utf8_lossy(&df.stdout);
    let mut it = df.split_whitespace().map(|x| x.parse::<u64>().unwrap());
    let disk = it.next().unwrap() * it.next().unwrap();
    assert_eq!(st.capacity_bytes, disk, "both servers share one disk: counted once");

    c.kill9(c.pids()[0]);
    let (ok, out, err) = parcache_within(10, &["status", "--data", c.d()]);
    assert!(
        !ok && out.contains("DOWN") && err.contains("1 of 3 servers are down"),
        "{out}{err}"
    );
    parcache_within(60, &["down", "--data", c.d()]);
    let (ok, _, err) = parcache(&["status", "--data", c.d()]);
    assert!(!ok && err.contains("is stopped"), "{err}");
    let _ = Path::new(c.d());
}

/// The metadata server's process id.
fn mds_pid(c: &Cluster) -> u32 {
    c.pids()
        .into_iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .split(|&b| b == 0)
                .any(|w| w == b"mds")
        })
        .expect("the metadata server's pid")
}

/// Kills the metadata server (`kill -9`) and starts it again.
fn restart_mds(c: &Cluster) {
    c.kill9(mds_pid(c));
    let (ok, _, err) = parcache(&["up", "--data", c.d()]);
    assert!(ok, "restarting the metadata server: {err}");
}

/// `sprite` (Nelson, Welch & Ousterhout 1988) keeps who has a file open
/// and who last wrote it in the metadata server's memory. After a restart,
/// the nodes tell the new server what they have open and which files they
/// hold dirty blocks of, and other nodes' opens wait for them: an open
/// after the restart still recalls a writer's dirty blocks, and a file
/// open for writing elsewhere is still uncached. (The restarted server
/// knew of no writer, and the second node read the bytes from before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sprite_state_outlives_a_restart_of_the_metadata_server() {
    const LEN: usize = 256 << 10;
    let c = Cluster::up("trust-sprite-restart", 2);
    let (a, b) = (c.fs().await, c.fs().await);
    a.set_policy("/", "consistency", "sprite").await.unwrap();
    a.set_policy("/", "write", "write-back").await.unwrap();
    for name in ["/closed", "/open"] {
        let f = a.create(name, 0o644, true).await.unwrap();
        let f = a.open(&f, true).await.unwrap();
        a.write_at(&f, 0, &vec![b'0'; LEN]).await.unwrap();
        a.fsync(&f).await.unwrap();
        a.close(&f, true).await.unwrap();
    }
    // Dirty blocks on the first node: of a file it closed, and of one it
    // keeps open for writing.
    let closed = a.open(&a.resolve("/closed").await.unwrap(), true).await.unwrap();
    a.write_at(&closed, 0, &vec![b'A'; LEN]).await.unwrap();
    a.close(&closed, true).await.unwrap();
    let open = a.open(&a.resolve("/open").await.unwrap(), true).await.unwrap();
    a.write_at(&open, 0, &vec![b'A'; LEN]).await.unwrap();
    restart_mds(&c);
    let f = b.open(&b.resolve("/closed").await.unwrap(), false).await.unwrap();
    let got = b.read_at(&f, 0, LEN as u64).await.unwrap();
    b.close(&f, false).await.unwrap();
    let stale = got.iter().filter(|&&x| x != b'A').count();
    assert_eq!(stale, 0, "read {stale} bytes from before the writer's close");
    let g = b.open(&b.resolve("/open").await.unwrap(), false).await.unwrap();
    let got = b.read_at(&g, 0, LEN as u64).await.unwrap();
    let stale = got.iter().filter(|&&x| x != b'A').count();
    assert_eq!(stale, 0, "read {stale} bytes the writer's open file did not hold");
    // Write-shared now: the writer's next bytes reach the reader at once.
    a.write_at(&open, 0, &vec![b'B'; 4096]).await.unwrap();
    let got = b.read_at(&g, 0, 4096).await.unwrap();
    assert!(got.iter().all(|&x| x == b'B'), "a write-shared file was cached");
    b.close(&g, false).await.unwrap();
    a.close(&open, true).await.unwrap();
}

/// `sync-write` (2003) and CAPFS's coherent H-caches (2005) keep in the
/// metadata server's memory which nodes cache which blocks, or hashes, of
/// a file. After a restart, a node that cached them before must not read
/// them past another node's write: it drops them when it finds the server
/// again, and the server holds writes until the nodes have had time to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_write_copies_do_not_outlive_a_restart_of_the_metadata_server() {
    let c = Cluster::up("trust-sync-write-restart", 2);
    let (a, b) = (c.fs().await, c.fs().await);
    a.set_policy("/", "consistency", "sync-write").await.unwrap();
    let stale = stale_after_a_restart(&c, &a, &b).await;
    assert_eq!(
        stale, 0,
        "the first node read {stale} bytes of its copy from before the restart"
    );
}

/// The same for a content-addressed file under `seq-2` (a coherent
/// H-cache, CAPFS 2005 §3.4): the first node's cached hashes from before
/// the restart are not used past another node's commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coherent_hashes_do_not_outlive_a_restart_of_the_metadata_server() {
    let c = Cluster::up("trust-hcache-restart", 2);
    let (ok, err) = c.cas_root("seq-2");
    assert!(ok, "{err}");
    let (a, b) = (c.fs().await, c.fs().await);
    let stale = stale_after_a_restart(&c, &a, &b).await;
    assert_eq!(
        stale, 0,
        "the first node read {stale} bytes through hashes from before the restart"
    );
}

/// Node `a` writes `/f`, makes it durable and reads it (caching what its
/// policy caches, with the file kept open); the metadata server is killed
/// and restarted; node `b` writes the file anew. Returns how many bytes
/// `a` then reads that are not `b`'s.
async fn stale_after_a_restart(c: &Cluster, a: &Fs, b: &Fs) -> usize {
    const LEN: usize = 256 << 10;
    let f = a.create("/f", 0o644, true).await.unwrap();
    let f = a.open(&f, true).await.unwrap();
    a.write_at(&f, 0, &vec![b'A'; LEN]).await.unwrap();
    a.fsync(&f).await.unwrap();
    assert!(a.read_at(&f, 0, LEN as u64).await.unwrap().iter().all(|&x| x == b'A'));
    restart_mds(c);
    let g = b.open(&b.resolve("/f").await.unwrap(), true).await.unwrap();
    b.write_at(&g, 0, &vec![b'B'; LEN]).await.unwrap();
    b.close(&g, true).await.unwrap();
    let got = a.read_at(&f, 0, LEN as u64).await.unwrap();
    a.close(&f, true).await.unwrap();
    got.iter().filter(|&&x| x != b'B').count()
}

/// A node's size report answered by a metadata server that was then
/// killed before its durable commit is lost with the crash, and the
/// version the answer gave may be given again after the restart, to
/// another node's change. The first node, holding the file's blocks as
/// current at that version, must not take the other node's change for its
/// own: it read its own old bytes (the versions given after a restart now
/// start past every version given before it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_lost_in_a_crash_does_not_hide_another_nodes_change() {
    const LEN: usize = 256 << 10;
    let c = Cluster::up("trust-versions", 2);
    for round in 0..5 {
        let name = format!("/f{round}");
        let a = c.fs().await;
        let f = a.create(&name, 0o644, true).await.unwrap();
        let f = a.open(&f, true).await.unwrap();
        a.write_at(&f, 0, &vec![b'A'; LEN]).await.unwrap();
        a.fsync(&f).await.unwrap();
        a.close(&f, true).await.unwrap();
        // This node's change, answered and cached here; then the crash.
        let f = a.open(&a.resolve(&name).await.unwrap(), true).await.unwrap();
        a.write_at(&f, 0, &vec![b'a'; 2 * LEN]).await.unwrap();
        a.close(&f, true).await.unwrap();
        restart_mds(&c);
        let b = c.fs().await;
        let at_b = b.resolve(&name).await.unwrap();
        if at_b.size != LEN as u64 {
            // The commit came before the kill: the report was not lost.
            continue;
        }
        // Another node's change after the restart.
        let g = b.open(&at_b, true).await.unwrap();
        b.write_at(&g, 0, &vec![b'B'; 2 * LEN]).await.unwrap();
        b.close(&g, true).await.unwrap();
        // The first node opens the file again (close-to-open).
        let f = a.open(&a.resolve(&name).await.unwrap(), false).await.unwrap();
        let got = a.read_at(&f, 0, 2 * LEN as u64).await.unwrap();
        a.close(&f, false).await.unwrap();
        assert_eq!(got.len(), 2 * LEN);
        let stale = got.iter().filter(|&&x| x != b'B').count();
        assert_eq!(
            stale, 0,
            "the first node read {stale} bytes of its own lost change, not the other node's"
        );
        return;
    }
    panic!("a kill never came before the metadata server's commit");
}

/// Stops the metadata server as `parcache down` does (SIGTERM: it commits
/// and exits) and starts it again.
fn stop_and_restart_mds(c: &Cluster) {
    let pid = mds_pid(c);
    let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    let t = Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the metadata server did not stop"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (ok, _, err) = parcache(&["up", "--data", c.d()]);
    assert!(ok, "restarting the metadata server: {err}");
}

/// A request that is not idempotent, sent again with the same client id
/// and number (as a node does after a lost connection), is answered as
/// the first time and not done twice: on another connection, and after a
/// graceful restart of the metadata server. One lost in a crash is done
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_again_is_answered_not_done_twice() {
    use parcache_proto::{Client, Request, Response, ROOT};
    let c = Cluster::up("trust-once", 1);
    let secret = Secret::load(&c.dir.join("secret")).unwrap();
    let conn = || async {
        let addr = c.info()["mds"].as_str().unwrap().to_string();
        Client::connect(&addr, &secret).await.unwrap()
    };
    let create = |name: &str| Request::Create {
        parent: ROOT,
        name: name.as_bytes().to_vec(),
        mode: 0o644,
        exclusive: true,
    };
    // The first send of request `seq`, or (`repeat`) one sent again.
    let once = |seq: u64, repeat: bool, req: Request| Request::Once {
        client: 0x5eed,
        seq,
        repeat,
        req: Box::new(req),
    };
    let handle_of = |r: Response| match r {
        Response::Created { attr, .. } => attr.handle,
        other => panic!("not created: {other:?}"),
    };
    // Without `Once`, an exclusive create sent again fails.
    let plain = conn().await;
    plain.call(&create("plain"), &[]).await.unwrap();
    let again = plain.call(&create("plain"), &[]).await.unwrap().0;
    assert!(matches!(again, Response::Error(_)), "{again:?}");

    let first = handle_of(conn().await.call(&once(1, false, create("f")), &[]).await.unwrap().0);
    let repeat = conn().await.call(&once(1, true, create("f")), &[]).await.unwrap().0;
    assert_eq!(handle_of(repeat), first, "sent again on another connection");
    let unlink = Request::Unlink {
        parent: ROOT,
        name: b"f".to_vec(),
        keep_open: false,
        only: None,
    };
    let gone = conn().await.call(&once(2, false, unlink.clone()), &[]).await.unwrap().0;
    assert!(matches!(gone, Response::Unlinked { .. }), "{gone:?}");

    stop_and_restart_mds(&c);
    let repeat = conn().await.call(&once(1, true, create("f")), &[]).await.unwrap().0;
    assert_eq!(handle_of(repeat), first, "sent again after a graceful restart");
    let gone = conn().await.call(&once(2, true, unlink), &[]).await.unwrap().0;
    assert!(
        matches!(gone, Response::Unlinked { .. }),
        "an unlink sent again after a restart: {gone:?}"
    );
    let lookup = |name: &str| Request::Lookup {
        parent: ROOT,
        name: name.as_bytes().to_vec(),
    };
    let looked = conn().await.call(&lookup("f"), &[]).await.unwrap().0;
    assert!(
        matches!(looked, Response::Error(_)),
        "the create sent again after its unlink made the file again: {looked:?}"
    );

    // A create lost in a crash (its commit not yet made) is done again;
    // one committed before the kill is answered as before. Either way
    // the file is there after.
    let lost = handle_of(conn().await.call(&once(3, false, create("g")), &[]).await.unwrap().0);
    restart_mds(&c);
    let again = handle_of(conn().await.call(&once(3, true, create("g")), &[]).await.unwrap().0);
    let looked = conn().await.call(&lookup("g"), &[]).await.unwrap().0;
    match looked {
        Response::Attr(a) => assert_eq!(a.handle, again),
        other => panic!("the create sent again after a crash left no file: {other:?}"),
    }
    let _ = lost;
}

/// Requests in flight when the metadata server is stopped (`parcache
/// down`, or SIGTERM before an upgrade) are sent again to the server
/// restarted and done once: no create or unlink fails, and no name
/// unlinked comes back. (Before, a request the server had not read when
/// it closed the connection failed with EIO, and one it had done while
/// its answer was lost could not be sent again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_outlive_a_graceful_restart_of_the_metadata_server() {
    let c = Cluster::up("trust-graceful", 1);
    let fs = c.fs().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut streams = Vec::new();
    for s in 0..4 {
        let (fs, stop) = (fs.clone(), stop.clone());
        fs.mkdir(&format!("/d{s}"), 0o755).await.unwrap();
        streams.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let name = format!("/d{s}/f{i}");
                if let Err(e) = fs.create(&name, 0o644, true).await {
                    errors.push(format!("create {name}: {e}"));
                }
                if i > 0 {
                    let name = format!("/d{s}/f{}", i - 1);
                    if let Err(e) = fs.unlink(&name).await {
                        errors.push(format!("unlink {name}: {e}"));
                    }
                }
                i += 1;
            }
            (i, errors)
        }));
    }
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let c = &c;
        tokio::task::block_in_place(|| stop_and_restart_mds(c));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for (s, t) in streams.into_iter().enumerate() {
        let (made, errors) = t.await.unwrap();
        assert!(errors.is_empty(), "stream {s}: {errors:?}");
        // Only the last file made is left.
        let names: Vec<String> = fs
            .readdir(&format!("/d{s}"))
            .await
            .unwrap()
            .into_iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .filter(|n| n != "." && n != "..")
            .collect();
        assert_eq!(names, vec![format!("f{}", made - 1)], "stream {s}");
    }
}

/// `up` does not pass its caller's open descriptors on to the daemons it
/// starts. (A shell holding a file on a mount open while it ran `up` to
/// restart a server left the new server holding that file, and the mount
/// could not be unmounted until the server stopped.)
#[test]
fn up_does_not_pass_its_callers_descriptors_on() {
    let dir = common::scratch("trust-fds");
    std::fs::create_dir_all(&dir).unwrap();
    let held = dir.join("held-by-the-caller");
    std::fs::write(&held, b"x").unwrap();
    let data = dir.join("cluster");
    let script = format!(
        "exec 7<'{}'; exec '{}' up --data '{}' --iods 1",
        held.display(),
        env!("CARGO_BIN_EXE_parcache"),
        data.display()
    );
    let st = Command::new("bash").args(["-c", &script]).status().unwrap();
    assert!(st.success());
    let c = Cluster { dir: data };
    let pids = c.pids();
    assert_eq!(pids.len(), 2, "a metadata server and a data server");
    for pid in pids {
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
            let to = std::fs::read_link(fd.path()).unwrap_or_default();
            assert_ne!(
                to,
                held,
                "daemon {pid} holds the caller's descriptor {:?}",
                fd.file_name()
            );
        }
    }
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}
