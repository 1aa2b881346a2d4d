//! `parcache`: the command line of the parcache parallel file system.

mod daemon;
mod sim;

use clap::{Parser, Subcommand};

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
    /// Run a data server: it stores its stripes of every file behind a
    /// durable write log (an acknowledged write survives kill -9).
    Iod(daemon::IodArgs),
    /// Create a new cluster secret file.
    Secret(daemon::SecretArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sim(c) => sim::run(c),
        Command::Iod(a) => daemon::iod(a),
        Command::Secret(a) => daemon::secret(a),
    };
    if let Err(e) = result {
        // A reader that went away (`| head`) is not an error.
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return;
        }
        eprintln!("parcache: error: {e:#}");
        std::process::exit(1);
    }
}
