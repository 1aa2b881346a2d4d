//! `parcache`: the command line of the parcache parallel file system.

/// `println!` that hands a closed standard output (`parcache status | head
/// -1`) back as an error, which `main` ends quietly on, instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
    }};
}

mod advise;
mod calibrate;
mod cluster;
mod daemon;
mod fs;
mod mount;
mod replay;
mod sim;

use clap::{Parser, Subcommand};
use std::io::Write;

/// parcache — a parallel file system built around its cache, with a
/// deterministic simulator of the same policy code.
#[derive(Parser)]
#[command(name = "parcache", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the simulator: reproduce the papers' tables and figures, or ask
    /// "what if" with your own parameters.
    #[command(subcommand)]
    Sim(sim::SimCommand),
    /// Which policies suit a workload? Replay a trace under every
    /// combination its sharing allows, rank them, recommend per directory,
    /// and (--apply) set them on the cluster.
    Advise(advise::AdviseArgs),
    /// Run a data server: it stores its stripes of every file behind a
    /// durable write log (an acknowledged write survives kill -9).
    Iod(daemon::IodArgs),
    /// Run the metadata server on its own.
    Mds(daemon::MdsArgs),
    /// Create a new cluster secret file.
    Secret(daemon::SecretArgs),
    /// Start a whole cluster on this host (a metadata server and N data
    /// servers under DIR); run again on the same DIR to restart it, or
    /// to restart those of its servers that are down.
    Up(cluster::UpArgs),
    /// Stop the cluster in DIR (servers flush their logs first).
    Down(cluster::DataArg),
    /// Show the servers of the cluster in DIR and their counters, this
    /// host's mounts, and the nodes heard from (`--format json` for tools).
    Status(cluster::StatusArgs),
    /// Empty the data servers' caches of the cluster in DIR (dirty blocks
    /// are written down first), for cold-cache measurements without a
    /// restart; pair it with `echo 3 > /proc/sys/vm/drop_caches` and a
    /// remount for every cache below a program.
    DropCaches(cluster::DataArg),
    /// Copy a file into, out of, or within the cluster (pc:/path).
    Cp(fs::CpArgs),
    /// Print a cluster file.
    Cat(fs::PathArgs),
    /// List a cluster directory.
    Ls(fs::PathArgs),
    /// Make a cluster directory.
    Mkdir(fs::PathArgs),
    /// Remove a cluster file or empty directory.
    Rm(fs::PathArgs),
    /// Show a cluster file's attributes and layout.
    Stat(fs::PathArgs),
    /// Remove what no file owns from the data servers: content-addressed chunks
    /// (store=cas) no recipe names, and parts of files the metadata server
    /// does not know (left by a crash), after ending the files unlinked
    /// while open on a mount that died.
    Gc(fs::GcArgs),
    /// Set or show a file's or directory's policies.
    #[command(subcommand)]
    Policy(fs::PolicyCommand),
    /// Say where a file's requests go: through or around the node's cache
    /// and the global cache, per range, for reads and writes (discretionary
    /// caching, Vilayannur et al. 2003).
    Hint(fs::HintArgs),
    /// Mount the cluster as a FUSE file system (runs until unmounted).
    Mount(mount::MountArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sim(c) => sim::run(c),
        Command::Advise(a) => advise::advise(a),
        Command::Iod(a) => daemon::iod(a),
        Command::Secret(a) => daemon::secret(a),
        Command::Mds(a) => daemon::mds(a),
        Command::Up(a) => cluster::up(a),
        Command::Down(a) => cluster::down(a),
        Command::Status(a) => cluster::status(a),
        Command::DropCaches(a) => cluster::drop_caches(a),
        Command::Cp(a) => fs::cp(a),
        Command::Cat(a) => fs::cat(a),
        Command::Ls(a) => fs::ls(a),
        Command::Mkdir(a) => fs::mkdir(a),
        Command::Rm(a) => fs::rm(a),
        Command::Stat(a) => fs::stat(a),
        Command::Policy(c) => fs::policy(c),
        Command::Gc(a) => fs::gc(a),
        Command::Hint(a) => fs::hint(a),
        Command::Mount(a) => mount::mount(a),
    };
    if let Err(e) = result {
        // A reader that went away (`| head`) is not an error.
        if e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        }) {
            return;
        }
        // Not eprintln!: it panics when standard error is gone too.
        let _ = writeln!(std::io::stderr(), "parcache: error: {e:#}");
        std::process::exit(1);
    }
}
