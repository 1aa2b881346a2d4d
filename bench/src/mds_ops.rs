//! What one metadata request costs, against a loopback round trip measured
//! in the same run: the small-file columns of `mount-io` are a chain of
//! these (a created file: a lookup of the new name, the create, its bytes
//! to a data server and the size report at close; a file read back: a
//! lookup and up to three attribute fetches before its read).
//!
//! One client sends each kind of request `N` times, one at a time, to a
//! metadata server (and one data server) on loopback, started in this
//! process with the real protocol. A request's time over the round trip
//! says how much of it is the server's own work: a lookup is nearly all
//! round trip; a create also pays for its store's write transaction,
//! whose cost alone (a bare redb commit of one number, then the durable
//! commit after N of them) is printed last.
//!
//! Run: `cargo run --release -p parcache-bench --bin mds-ops [-- N]`
//! (default 4,000).

use anyhow::Result;
use parcache_bench::BenchCluster;
use parcache_client::Fs;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Microseconds per round trip of a 64-byte message between two loopback
/// sockets of this process (the floor of any request).
async fn loopback_round_trip(n: usize) -> Result<f64> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let echo = tokio::spawn(async move {
        let (mut s, _) = l.accept().await?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 64];
        for _ in 0..n {
            s.read_exact(&mut b).await?;
            s.write_all(&b).await?;
        }
        anyhow::Ok(())
    });
    let mut c = tokio::net::TcpStream::connect(addr).await?;
    c.set_nodelay(true)?;
    let mut b = [7u8; 64];
    let t = Instant::now();
    for _ in 0..n {
        c.write_all(&b).await?;
        c.read_exact(&mut b).await?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    echo.await??;
    Ok(us)
}

/// Microseconds per write transaction of the metadata server's store
/// (redb), each inserting one number and committed without an fsync as
/// the server commits a change; then one durable commit after them all,
/// as its syncer makes them durable.
fn store_commits(dir: &std::path::Path, n: usize) -> Result<(f64, f64)> {
    const T: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("t");
    let db = redb::Database::create(dir.join("commits.redb"))?;
    let t = Instant::now();
    for i in 0..n as u64 {
        let mut tx = db.begin_write()?;
        tx.set_durability(redb::Durability::None);
        tx.open_table(T)?.insert(i, i)?;
        tx.commit()?;
    }
    let each = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let t = Instant::now();
    let mut tx = db.begin_write()?;
    tx.set_durability(redb::Durability::Immediate);
    tx.commit()?;
    Ok((each, t.elapsed().as_secs_f64() * 1e6))
}

/// Microseconds per call of `f(i)` for `i` in `0..n`, one at a time.
async fn per_call<F, Fut>(n: usize, mut f: F) -> Result<f64>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let t = Instant::now();
    for i in 0..n {
        f(i).await?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
}

fn main() -> Result<()> {
    let n: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(4000);
    anyhow::ensure!(n > 0, "N must be at least 1");
    let dir = std::env::temp_dir().join(format!("parcache-bench-mds-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let cluster = BenchCluster::start(&dir, 1)?;
    let client = parcache_server::runtime()?;
    let rows = client.block_on(async {
        let fs = Fs::connect(&cluster.mds_addr, &cluster.secret).await?;
        let rtt = loopback_round_trip(n).await?;
        let d = fs.mkdir("/ops", 0o755).await?;
        let lookup = per_call(n, |i| {
            let fs = fs.clone();
            async move {
                let r = fs.lookup(d.handle, format!("missing{i}").as_bytes()).await;
                anyhow::ensure!(r.is_err(), "missing{i} was found");
                Ok(())
            }
        })
        .await?;
        let mut made = Vec::with_capacity(n);
        let t = Instant::now();
        for i in 0..n {
            made.push(fs.create_at(d.handle, format!("f{i}").as_bytes(), 0o644, true).await?);
        }
        let create = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let getattr = per_call(n, |i| {
            let (fs, h) = (fs.clone(), made[i].handle);
            async move {
                fs.getattr(h).await?;
                Ok(())
            }
        })
        .await?;
        let block = vec![5u8; 4096];
        let (mut open, mut write, mut close) = (0.0, 0.0, 0.0);
        for a in &made {
            let t = Instant::now();
            let a = fs.open(a, true).await?;
            let t1 = Instant::now();
            fs.write_at(&a, 0, &block).await?;
            let t2 = Instant::now();
            fs.close(&a, true).await?;
            open += (t1 - t).as_secs_f64();
            write += (t2 - t1).as_secs_f64();
            close += t2.elapsed().as_secs_f64();
        }
        let us = |s: f64| s * 1e6 / n as f64;
        let (open, write, close) = (us(open), us(write), us(close));
        let t = Instant::now();
        fs.sync_metadata().await?;
        let sync = t.elapsed().as_secs_f64() * 1e6;
        anyhow::Ok(vec![
            ("loopback round trip (64 bytes)", rtt),
            ("lookup of a missing name", lookup),
            ("getattr", getattr),
            ("create", create),
            ("open for writing", open),
            ("write 4 KiB (into the node cache)", write),
            ("close (bytes down, size reported)", close),
            ("sync of the metadata after them", sync),
        ])
    })?;
    let (commit, durable) = store_commits(&dir, n)?;
    let rtt = rows[0].1;
    println!("mds-ops: {n} of each request, one at a time, to a metadata server and one data server on loopback");
    println!("{:<34} {:>10} {:>14}", "", "us", "round trips");
    for (name, us) in &rows {
        println!("{name:<34} {us:>10.1} {:>14.1}", us / rtt);
    }
    println!("the store alone (redb, in this process, no network):");
    println!(
        "{:<34} {commit:>10.1} {:>14.1}",
        "  a commit without fsync",
        commit / rtt
    );
    println!(
        "{:<34} {durable:>10.1} {:>14.1}",
        "  one durable commit after them",
        durable / rtt
    );
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
