//! `parcache cp`, `cat`, `ls`, `mkdir`, `rm`, `stat`, `policy`: files in a
//! running cluster through the client library. A path inside the cluster
//! is written `pc:/dir/file`; any other path is local.

use crate::cluster::read_cluster;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use parcache_client::Fs;
use parcache_proto::{show_name, Attr, FileKind, Secret};
use std::io::{Read, Write};
use std::path::PathBuf;

/// Which cluster to talk to.
#[derive(Args, Clone)]
pub struct Target {
    /// A cluster started by `parcache up --data DIR`.
    #[arg(long, value_name = "DIR", global = true)]
    data: Option<PathBuf>,
    /// Or a remote cluster's metadata server…
    #[arg(long, value_name = "ADDR", global = true)]
    mds: Option<String>,
    /// …with its secret file.
    #[arg(long, value_name = "FILE", global = true)]
    secret_file: Option<PathBuf>,
    /// Read every block through its data server. By default a random
    /// reader's missed block is read from the data server's part file
    /// where the server runs on this machine and this user may open its
    /// files (local reads, as HDFS's short-circuit reads; docs/client.md,
    /// "Local reads").
    #[arg(long, global = true)]
    no_local_reads: bool,
}

impl Target {
    /// The cluster directory, when the cluster was named by `--data`.
    pub fn data_dir(&self) -> Option<&std::path::Path> {
        self.data.as_deref()
    }

    /// Whether a remote metadata server was named (`--mds`).
    pub fn has_remote(&self) -> bool {
        self.mds.is_some()
    }

    pub async fn connect(&self) -> Result<std::sync::Arc<Fs>> {
        self.connect_with(parcache_client::NodeCacheConfig::default()).await
    }

    /// Connects with a node cache built as `cache` says.
    /// `--no-local-reads` turns its local reads off.
    pub async fn connect_with(&self, mut cache: parcache_client::NodeCacheConfig) -> Result<std::sync::Arc<Fs>> {
        cache.local_reads &= !self.no_local_reads;
        let (mds, secret) = match (&self.data, &self.mds) {
            (Some(dir), None) => (read_cluster(dir)?.mds, Secret::load(&dir.join("secret"))?),
            (None, Some(mds)) => {
                let f = self.secret_file.as_ref().context("--mds needs --secret-file")?;
                (mds.clone(), Secret::load(f)?)
            }
            (Some(_), Some(_)) => bail!("give either --data DIR or --mds ADDR, not both"),
            (None, None) => {
                bail!("which cluster? give --data DIR (from `parcache up`) or --mds ADDR --secret-file FILE")
            }
        };
        Ok(Fs::connect_with(&mds, &secret, cache).await?)
    }
}

fn cluster_path(p: &str) -> Option<&str> {
    p.strip_prefix("pc:")
}

fn need_cluster(p: &str) -> Result<&str> {
    match cluster_path(p) {
        Some(x) if x.starts_with('/') => Ok(x),
        Some(x) => bail!("'{p}': a cluster path is absolute: pc:/{x}"),
        None => bail!("'{p}' is not a cluster path (write it pc:/dir/file)"),
    }
}

#[derive(Args)]
pub struct CpArgs {
    /// Source: a local file or pc:/path.
    src: String,
    /// Destination: a local file or pc:/path (an existing directory takes the source's name).
    dst: String,
    #[command(flatten)]
    target: Target,
}

#[derive(Args)]
pub struct PathArgs {
    /// pc:/path
    path: String,
    #[command(flatten)]
    target: Target,
}

#[derive(Args)]
pub struct GcArgs {
    /// Only chunks and parts stored at least this many seconds ago
    /// (younger ones may belong to a write whose commit, or a file whose
    /// create, is on its way), and files unlinked while open on a mount
    /// gone at least this long.
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    older_than: u64,
    #[command(flatten)]
    target: Target,
}

/// Removes what the data servers keep that no file owns: content-addressed
/// chunks no file's recipe names any more (left by removed or overwritten
/// files, or by writes that crashed before their commit), and file parts
/// whose file the metadata server does not know (left by a node that died
/// between an unlink and removing the parts, or by files a metadata-server
/// crash lost). First it ends the files unlinked while open on a node that
/// died (their parts are then of no file).
pub fn gc(a: GcArgs) -> Result<()> {
    rt()?.block_on(async {
        let fs = a.target.connect().await?;
        let ended = fs.drop_orphans(a.older_than).await?;
        outln!(
            "{ended} files unlinked while open on a node gone over {} s ago ended",
            a.older_than
        )?;
        let (seen, dropped) = fs.collect_chunks(a.older_than).await?;
        outln!(
            "{seen} chunks stored over {} s ago, {dropped} named by no recipe removed",
            a.older_than
        )?;
        let (seen, removed) = fs.collect_parts(a.older_than).await?;
        outln!(
            "{seen} file parts written over {} s ago, {removed} of no file removed",
            a.older_than
        )?;
        Ok(())
    })
}

#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Set a file's or directory's policies (directories pass them to new files):
    /// write=…, replacement=…, prefetch=…, consistency=… (close-to-open, sprite,
    /// nfs, session, posix, none, sync-write), cooperative=… (none,
    /// lru-interleaved, n-chance, greedy, global, global(threshold=20)),
    /// bypass=RULES (see `parcache hint`), nv=on|off (writes acknowledged
    /// from a mount's --nv-dir durable write cache), page-cache=auto|bypass|cached
    /// (whether mounts open it for direct I/O: auto for opens for writing
    /// only, bypass for every open, cached for none), store=blocks|cas,
    /// stripe_unit=64K, stripe_width=N. Content-addressed files (store=cas, set before
    /// consistency) take consistency=seq-1|seq-2|for-1|for-2|rel-1.
    Set {
        path: String,
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Remove policy settings of a file or directory (they fall back to
    /// the default).
    Unset {
        path: String,
        #[arg(required = true, value_name = "KEY")]
        keys: Vec<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Show a file's or directory's effective policies and where each
    /// comes from (set on it, inherited from its directory, or the default).
    Get {
        path: String,
        #[command(flatten)]
        target: Target,
    },
}

/// `parcache hint`: where a file's requests go (Vilayannur et al. 2003).
#[derive(clap::Args)]
pub struct HintArgs {
    /// The cluster file or directory (pc:/path); a directory passes its
    /// hints to files made in it.
    path: String,
    /// The bytes the hint is for, A-B (end exclusive; 64K, 1M …); without
    /// it, the whole file (the coarse, file-level hint).
    #[arg(long, value_name = "A-B")]
    range: Option<String>,
    /// Where reads go: local=on|off,global=on|off (either or both). `off`
    /// goes around that cache: around the node's own cache, a read comes
    /// from the global cache or the data servers without being kept here;
    /// around the global cache (`cooperative=global`), from the data
    /// servers.
    #[arg(long, value_name = "LEVELS")]
    read: Option<String>,
    /// Where writes go: local=on|off,global=on|off. Around the node's own
    /// cache, a write goes below before it returns.
    #[arg(long, value_name = "LEVELS")]
    write: Option<String>,
    /// Remove every hint first (alone: just remove them).
    #[arg(long)]
    clear: bool,
    #[command(flatten)]
    target: Target,
}

/// Adds (or clears) a file's bypass hints and prints all it has.
pub fn hint(a: HintArgs) -> Result<()> {
    let mut rules = String::new();
    let range = match &a.range {
        Some(r) => {
            let (x, y) = parcache_core::bypass::hints::parse_range(r).context("--range")?;
            format!("@{x}-{y}")
        }
        None => String::new(),
    };
    for (op, levels) in [("read", &a.read), ("write", &a.write)] {
        if let Some(l) = levels {
            if !rules.is_empty() {
                rules.push(';');
            }
            rules.push_str(&format!("{op}{range}:{l}"));
        }
    }
    if rules.is_empty() && !a.clear {
        bail!("nothing to do: give --read LEVELS and/or --write LEVELS (e.g. --read global=off), or --clear");
    }
    if a.range.is_some() && rules.is_empty() {
        bail!("--range needs --read or --write");
    }
    let rules: parcache_client::HintList = rules.parse().with_context(|| format!("{}: bad hint", a.path))?;
    rt()?.block_on(async {
        let fs = a.target.connect().await?;
        let p = need_cluster(&a.path)?;
        if a.clear {
            fs.clear_hints(p).await?;
        }
        let all = if rules.is_empty() {
            fs.hints(p).await?
        } else {
            fs.hint(p, &rules).await?
        };
        outln!("bypass={all}")?;
        Ok(())
    })
}

const PIECE: usize = 8 << 20;

fn rt() -> Result<tokio::runtime::Runtime> {
    crate::daemon::runtime()
}

fn bar(len: u64) -> ProgressBar {
    if len < 16 << 20 {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{bytes:>10}/{total_bytes} [{bar:40}] {binary_bytes_per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb
}

async fn dest_in_cluster(fs: &Fs, dst: &str, src_name: &str) -> Result<String> {
    match fs.resolve(dst).await {
        Ok(a) if a.kind == FileKind::Dir => Ok(format!("{}/{}", dst.trim_end_matches('/'), src_name)),
        _ => Ok(dst.to_string()),
    }
}

/// A local file that lies on a parcache mount: its handle there (its
/// inode number) and the id of the cluster the mount serves (`None` if the
/// mount does not name it).
struct OnMount {
    handle: u64,
    cluster: Option<String>,
}

/// Where a local file lies on a parcache mount, for telling when a local
/// path and a cluster path are one file.
fn on_mount(p: &std::path::Path) -> Option<OnMount> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(p).ok()?;
    let abs = p.canonicalize().ok()?;
    // As bytes: a mount point elsewhere whose name is not UTF-8 must not
    // hide this one (the copy onto itself would then empty the file).
    let mounts = parcache_fuse::mount_table(&std::fs::read("/proc/mounts").ok()?);
    // The mount holding the path: the longest mount point it lies under.
    let (_, e) = mounts
        .into_iter()
        .filter(|e| abs.starts_with(&e.at))
        .map(|e| (e.at.as_os_str().len(), e))
        .max_by_key(|(n, _)| *n)?;
    e.is_parcache().then(|| OnMount {
        handle: md.ino(),
        cluster: e.cluster().map(str::to_string),
    })
}

/// Refuses to copy a file onto itself, as GNU cp does: opening the
/// destination for writing would empty the source. `local` is where the
/// local side lies on a mount, `handle` the cluster side's file in the
/// cluster `fs` reaches: one file if both name the same handle in the same
/// cluster (a mount that does not name its cluster is taken to be of it).
async fn refuse_same(fs: &Fs, src: &str, dst: &str, local: Option<OnMount>, handle: u64) -> Result<()> {
    let Some(m) = local else { return Ok(()) };
    if m.handle != handle {
        return Ok(());
    }
    let ours = match m.cluster {
        Some(id) => {
            fs.cluster()
                .await
                .with_context(|| "asking the metadata server for the cluster's id")?
                == id
        }
        None => true,
    };
    if ours {
        bail!("'{src}' and '{dst}' are the same file");
    }
    Ok(())
}

pub fn cp(a: CpArgs) -> Result<()> {
    rt()?.block_on(async {
        let fs = a.target.connect().await?;
        let src_name = a.src.rsplit('/').next().unwrap_or("file").to_string();
        match (cluster_path(&a.src), cluster_path(&a.dst)) {
            (None, Some(_)) => {
                let dst = dest_in_cluster(&fs, need_cluster(&a.dst)?, &src_name).await?;
                if let Ok(to) = fs.resolve(&dst).await {
                    refuse_same(&fs, &a.src, &a.dst, on_mount(std::path::Path::new(&a.src)), to.handle).await?;
                }
                let mut f = std::fs::File::open(&a.src).with_context(|| format!("opening {}", a.src))?;
                let md = f.metadata().with_context(|| format!("reading {}", a.src))?;
                // Before the destination is made or emptied, as GNU cp does.
                if md.is_dir() {
                    bail!("'{}' is a directory: cp copies one file (nothing was changed)", a.src);
                }
                let len = md.len();
                let mut attr = fs
                    .create(&dst, 0o644, false)
                    .await
                    .with_context(|| format!("creating pc:{dst}"))?;
                if attr.size > 0 {
                    attr = fs.truncate(&attr, 0).await?;
                }
                let attr = fs.open(&attr, true).await?;
                let pb = bar(len);
                let mut buf = vec![0u8; PIECE];
                let mut off = 0u64;
                loop {
                    let n = read_full(&mut f, &mut buf).with_context(|| format!("reading {}", a.src))?;
                    if n == 0 {
                        break;
                    }
                    fs.write_at(&attr, off, &buf[..n])
                        .await
                        .with_context(|| format!("writing pc:{dst} at {off}"))?;
                    off += n as u64;
                    pb.set_position(off);
                }
                fs.fsync(&attr).await.with_context(|| format!("syncing pc:{dst}"))?;
                fs.close(&attr, true).await?;
                pb.finish_and_clear();
            }
            (Some(_), None) => {
                let src = need_cluster(&a.src)?;
                let attr = fs.resolve(src).await?;
                if attr.kind != FileKind::File {
                    bail!("pc:{src} is not a regular file (nothing was changed)");
                }
                let mut dst = PathBuf::from(&a.dst);
                if dst.is_dir() {
                    dst.push(&src_name);
                }
                refuse_same(&fs, &a.src, &a.dst, on_mount(&dst), attr.handle).await?;
                let mut out = std::fs::File::create(&dst).with_context(|| format!("creating {}", dst.display()))?;
                let attr = fs.open(&attr, false).await?;
                copy_out(&fs, &attr, &mut out, &dst.display().to_string()).await?;
                fs.close(&attr, false).await?;
                // A regular file is made durable; a device or a pipe (a
                // read benchmark's /dev/null) has nothing to sync, and
                // refuses fsync (EINVAL).
                if out.metadata().is_ok_and(|m| m.is_file()) {
                    out.sync_all().with_context(|| format!("syncing {}", dst.display()))?;
                }
            }
            (Some(_), Some(_)) => {
                let src = need_cluster(&a.src)?;
                let attr = fs.resolve(src).await?;
                if attr.kind != FileKind::File {
                    bail!("pc:{src} is not a regular file (nothing was changed)");
                }
                let dst = dest_in_cluster(&fs, need_cluster(&a.dst)?, &src_name).await?;
                if fs.resolve(&dst).await.is_ok_and(|d| d.handle == attr.handle) {
                    bail!("'{}' and '{}' are the same file", a.src, a.dst);
                }
                let mut to = fs.create(&dst, attr.mode, false).await?;
                if to.size > 0 {
                    to = fs.truncate(&to, 0).await?;
                }
                let to = fs.open(&to, true).await?;
                let pb = bar(attr.size);
                let attr = fs.open(&attr, false).await?;
                let mut off = 0;
                while off < attr.size {
                    let d = fs.read_at(&attr, off, PIECE as u64).await?;
                    if d.is_empty() {
                        break;
                    }
                    fs.write_at(&to, off, &d).await?;
                    off += d.len() as u64;
                    pb.set_position(off);
                }
                fs.close(&attr, false).await?;
                fs.fsync(&to).await.with_context(|| format!("syncing pc:{dst}"))?;
                fs.close(&to, true).await?;
                pb.finish_and_clear();
            }
            (None, None) => bail!("neither '{}' nor '{}' is a cluster path (pc:/…)", a.src, a.dst),
        }
        fs.shutdown().await?;
        Ok(())
    })
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Copies a cluster file out to `out` (named `to` in errors), through one
/// buffer reused piece after piece.
async fn copy_out(fs: &Fs, attr: &Attr, out: &mut impl Write, to: &str) -> Result<()> {
    let pb = bar(attr.size);
    let mut buf = vec![0u8; PIECE.min(attr.size as usize).max(1)];
    let mut off = 0;
    while off < attr.size {
        let n = fs.read_into(attr, off, &mut buf).await?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).with_context(|| format!("writing {to}"))?;
        off += n as u64;
        pb.set_position(off);
    }
    pb.finish_and_clear();
    Ok(())
}

pub fn cat(a: PathArgs) -> Result<()> {
    rt()?.block_on(async {
        let fs = a.target.connect().await?;
        let p = need_cluster(&a.path)?;
        let attr = fs.resolve(p).await?;
        if attr.kind != FileKind::File {
            bail!("{}: not a regular file", a.path);
        }
        let attr = fs.open(&attr, false).await?;
        copy_out(&fs, &attr, &mut std::io::stdout().lock(), "standard output").await?;
        fs.close(&attr, false).await?;
        Ok(fs.shutdown().await?)
    })
}

pub fn ls(a: PathArgs) -> Result<()> {
    rt()?.block_on(async {
        let fs = a.target.connect().await?;
        let p = need_cluster(&a.path)?;
        let attr = fs.resolve(p).await?;
        let entries = if attr.kind == FileKind::Dir {
            fs.readdir(p).await?
        } else {
            vec![parcache_proto::DirEntry {
                name: p.rsplit('/').next().unwrap_or(p).as_bytes().to_vec(),
                handle: attr.handle,
                kind: attr.kind,
            }]
        };
        let mut out = std::io::stdout().lock();
        for e in entries {
            let a = fs.getattr(e.handle).await?;
            let k = match e.kind {
                FileKind::Dir => 'd',
                FileKind::File => '-',
                FileKind::Symlink => 'l',
                FileKind::Fifo => 'p',
                FileKind::CharDevice => 'c',
                FileKind::BlockDevice => 'b',
                FileKind::Socket => 's',
            };
            writeln!(out, "{k}{:o} {:>12} {}", a.mode, a.size, show_name(&e.name))?;
        }
        Ok(())
    })
}

pub fn mkdir(a: PathArgs) -> Result<()> {
    rt()?.block_on(async {
        let fs = a.target.connect().await?;
        fs.mkdir(need_cluster(&a.path)?, 0o755).await?;
        Ok(())
    })
}

pub fn rm(a: PathArgs) -> Result<()> {
    rt()?.block_on(async {
        let fs = a.target.connect().await?;
        let p = need_cluster(&a.path)?;
        match fs.resolve(p).await?.kind {
            FileKind::Dir => fs.rmdir(p).await?,
            _ => fs.unlink(p).await?,
        }
        // A small file's parts are removed in the background: waited for
        // here, or the process ended first and its space stayed taken.
        Ok(fs.shutdown().await?)
    })
}

pub fn stat(a: PathArgs) -> Result<()> {
    rt()?.block_on(async {
        let fs = a.target.connect().await?;
        let p = need_cluster(&a.path)?;
        let s = fs.resolve(p).await?;
        outln!("  path: pc:{p}")?;
        outln!(
            "handle: {}   kind: {:?}   mode: {:o}   links: {}",
            s.handle,
            s.kind,
            s.mode,
            s.nlink
        )?;
        outln!(
            "  size: {}   version: {}   uid/gid: {}/{}",
            s.size,
            s.version,
            s.uid,
            s.gid
        )?;
        outln!(
            " mtime: {}.{:09}   ctime: {}.{:09}",
            s.mtime.secs,
            s.mtime.nanos,
            s.ctime.secs,
            s.ctime.nanos
        )?;
        if let Some(l) = s.layout {
            outln!(
                "layout: stripe unit {} bytes over data servers {:?}",
                l.stripe_unit,
                l.servers
            )?;
        }
        Ok(())
    })
}

pub fn policy(c: PolicyCommand) -> Result<()> {
    rt()?.block_on(async {
        let (path, target) = match &c {
            PolicyCommand::Set { path, target, .. }
            | PolicyCommand::Get { path, target }
            | PolicyCommand::Unset { path, target, .. } => (path.clone(), target.clone()),
        };
        let fs = target.connect().await?;
        let p = need_cluster(&path)?;
        match c {
            PolicyCommand::Set { settings, .. } => {
                for kv in settings {
                    let (k, v) = kv.split_once('=').with_context(|| format!("'{kv}' is not KEY=VALUE"))?;
                    let (k, v) = (k.trim(), v.trim());
                    fs.set_policy(p, k, v).await?;
                    if k == "stripe_width" && v.parse::<usize>().is_ok_and(|n| n > fs.servers()) {
                        eprintln!(
                            "parcache: warning: stripe_width {v} is more than the cluster's {} data servers: \
                             new files use all {}",
                            fs.servers(),
                            fs.servers()
                        );
                    }
                }
            }
            PolicyCommand::Unset { keys, .. } => {
                let a = fs.resolve(p).await?;
                for k in keys {
                    fs.unset_policy_handle(a.handle, &k)
                        .await
                        .with_context(|| format!("{path}: unsetting {k}"))?;
                }
            }
            PolicyCommand::Get { .. } => {}
        }
        let a = fs.resolve(p).await?;
        for (k, v, origin) in fs.effective_policies(a.handle).await? {
            let from = match origin {
                "set" => "set here",
                "inherited" => "inherited from its directory when it was made",
                _ => "default",
            };
            outln!("{:<32} ({from})", format!("{k}={v}"))?;
        }
        if let Some(l) = &a.layout {
            outln!(
                "{:<32} (layout, fixed when the file was made)",
                format!("stripe_unit={}", l.stripe_unit)
            )?;
            outln!(
                "{:<32} (layout: data servers {:?})",
                format!("stripe_width={}", l.servers.len()),
                l.servers
            )?;
        }
        Ok(())
    })
}
