//! Simulator speed, measured in one run on this machine:
//!
//! 1. simulated events per second of the 1992 model on one core (target:
//!    5 million), beside the rate of the bare event kernel (push and pop
//!    only) measured in the same run, so the ratio says what the policy
//!    core and the model cost on top of the queue;
//! 2. wall time of every `kotz92-*` scenario on all cores (target: 10 s).
//!
//! Run: `cargo run --release -p parcache-bench --bin sim-speed`

use anyhow::Result;
use parcache_core::{Time, WritePolicyKind as W};
use parcache_sim::kernel::Kernel;
use parcache_sim::kotz92::{run, Compute, KotzParams, Pattern};
use parcache_sim::scenario::{self, RunOptions};
use std::time::Instant;

fn model_rate() -> (u64, f64) {
    // A mix like the scenarios': every pattern, cached and not, whole and
    // partial records, all four 1992 policies.
    let mut plan = vec![];
    for pattern in [Pattern::Lw1, Pattern::Seg, Pattern::Gw] {
        for policy in [W::WriteThrough, W::WriteBack, W::WriteFree, W::WriteFull] {
            for record_blocks in [0.25, 1.0, 2.5] {
                for compute in [None, Some(Compute::PAPER)] {
                    plan.push(KotzParams {
                        pattern,
                        policy,
                        record_blocks,
                        compute,
                        ..KotzParams::default()
                    });
                }
            }
        }
        plan.push(KotzParams {
            pattern,
            buffers: 0,
            ..KotzParams::default()
        });
    }
    let t = Instant::now();
    let events: u64 = plan.iter().map(|p| run(p).expect("valid").events).sum();
    (events, t.elapsed().as_secs_f64())
}

fn kernel_rate(n: u64) -> f64 {
    let t = Instant::now();
    let mut k: Kernel<u32> = Kernel::new();
    // Keep ~40 events pending, like 20 processes and 20 disks.
    for i in 0..40u32 {
        k.at(Time(i as u64), i);
    }
    let mut x = 0u64;
    while k.handled() < n {
        let (now, e) = k.pop().expect("never empty");
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        k.at(Time(now.0 + 1 + (x >> 40) % 30_000_000), e);
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn main() -> Result<()> {
    let (events, secs) = model_rate();
    let rate = events as f64 / secs;
    let base = kernel_rate(events.min(20_000_000));
    println!(
        "1992 model, one core: {events} events in {secs:.2} s = {:.2} M events/s",
        rate / 1e6
    );
    println!("bare event kernel, same run:          {:.2} M events/s", base / 1e6);
    println!("ratio model / bare kernel:            {:.2}", rate / base);
    println!("ratio model / 5 M events/s target:    {:.2}", rate / 5e6);

    let opts = RunOptions::default();
    let t = Instant::now();
    for s in scenario::list().iter().filter(|s| s.name.starts_with("kotz92-")) {
        scenario::run(s.name, &opts, &|| {})?;
    }
    let all = t.elapsed().as_secs_f64();
    println!("all kotz92-* scenarios on {} threads:  {all:.2} s", opts.threads);
    println!("ratio 10 s target / time:             {:.2}", 10.0 / all);
    Ok(())
}
