//! Content-addressed files (store=cas, CAPFS 2005 §3.4) through crashes of
//! the servers: a writer commits whole records (each spanning chunks on
//! several data servers) while the metadata server or a data server is
//! killed -9 at a random moment. After a restart every record holds the
//! old or the new contents, never a mixture, nothing acknowledged by
//! `fsync` is lost, and collection leaves no chunk that no recipe names.

use parcache_client::Fs;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::{chunk_counts, parcache, Cluster};

const RECORDS: u64 = 8;
/// A record: four 16 KiB chunks, so four hashes committed at once.
const RECORD: usize = 64 << 10;
const CHUNK: usize = 16 << 10;

/// Record `r` of file `file` at version `v`: each chunk `k` is one 8-byte
/// word `(file, r, k, v)` repeated, so every chunk anywhere is distinct
/// (named chunks equal stored chunks when nothing leaks).
fn record(file: u16, r: u16, v: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD);
    for k in 0..(RECORD / CHUNK) as u16 {
        let w = [file, r, k, v].map(u16::to_le_bytes).concat();
        for _ in 0..CHUNK / 8 {
            out.extend_from_slice(&w);
        }
    }
    out
}

/// The version a record holds, if it is whole (every chunk of one
/// version, and the record's own words).
fn version_of(file: u16, r: u16, data: &[u8]) -> Option<u16> {
    let v = u16::from_le_bytes([data[6], data[7]]);
    (data == record(file, r, v)).then_some(v)
}

/// Writes versions 1, 2, … of every record until a write fails; returns
/// the last version `fsync` acknowledged, the last one tried, and per
/// record the last one whose write returned (committed).
async fn writer(fs: Arc<Fs>, path: String, file: u16) -> (u16, u16, Vec<u16>) {
    let a = fs.resolve(&path).await.unwrap();
    let (mut acked, mut committed) = (0u16, vec![0u16; RECORDS as usize]);
    for v in 1..u16::MAX {
        for r in 0..RECORDS {
            if fs
                .write_at(&a, r * RECORD as u64, &record(file, r as u16, v))
                .await
                .is_err()
            {
                return (acked, v, committed);
            }
            committed[r as usize] = v;
        }
        // fsync every fourth version: kills land in commits more often.
        if v % 4 == 0 {
            if fs.fsync(&a).await.is_err() {
                return (acked, v, committed);
            }
            acked = v;
        }
    }
    (acked, u16::MAX, committed)
}

/// kill -9 of the metadata server or of one data server while a writer
/// commits 64 KiB records, at random moments, alternately. After a
/// metadata server's crash the rest are killed too; after a data server's
/// the rest stop cleanly (`parcache down`), so every commit the metadata
/// server answered stays. Restarted with `parcache up`, each record holds
/// one version: at most the last one tried, at least the last one `fsync`
/// acknowledged (metadata server killed) or the last one committed (data
/// server killed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_are_whole_through_kill_9_of_the_metadata_and_data_servers() {
    let c = Cluster::up("cascrash", 3);
    let (ok, err) = c.cas_root("seq-2");
    assert!(ok, "{err}");
    let mut rng = rand_pcg::Pcg64::seed_from_u64(5);
    let rounds = 16u16;
    let mut done: Vec<(String, u16, Vec<u16>, u16)> = vec![];
    let (mut mds_kills, mut iod_kills, mut midway, mut acked_total) = (0, 0, 0, 0u32);
    for round in 0..rounds {
        let fs = c.fs().await;
        fs.set_retries(1);
        let path = format!("/f{round}");
        let a = fs.create(&path, 0o644, true).await.unwrap();
        for r in 0..RECORDS {
            fs.write_at(&a, r * RECORD as u64, &record(round, r as u16, 0))
                .await
                .unwrap();
        }
        fs.fsync(&a).await.unwrap();
        let w = tokio::spawn(writer(fs.clone(), path.clone(), round));
        tokio::time::sleep(Duration::from_millis(rng.gen_range(30..400))).await;
        let pids = c.pids();
        let (iods, mds) = (&pids[..pids.len() - 1], pids[pids.len() - 1]);
        let mds_killed = round % 2 == 0;
        if mds_killed {
            c.kill9(mds);
            mds_kills += 1;
        } else {
            c.kill9(iods[rng.gen_range(0..iods.len())]);
            iod_kills += 1;
        }
        let (acked, tried, committed) = w.await.unwrap();
        acked_total += acked as u32;
        if mds_killed {
            for p in pids {
                c.kill9(p);
            }
        } else {
            let (ok, out, err) = parcache(&["down", "--data", c.d()]);
            assert!(ok, "down with a data server dead: {out}{err}");
        }
        c.start(3);
        let least = if mds_killed {
            vec![acked; RECORDS as usize]
        } else {
            committed
        };
        // Every record of every file so far: whole, and not older than acknowledged.
        let fs = c.fs().await;
        done.push((path, round, least, tried));
        for (path, file, least, tried) in &done {
            let a = fs.resolve(path).await.unwrap();
            let data = fs.read_at(&a, 0, RECORDS * RECORD as u64).await.unwrap();
            assert_eq!(data.len(), RECORDS as usize * RECORD, "{path}");
            let mut versions = vec![];
            for (r, rec) in data.chunks(RECORD).enumerate() {
                let v = version_of(*file, r as u16, rec)
                    .unwrap_or_else(|| panic!("{path} record {r}: a mixture of versions"));
                assert!(
                    (least[r]..=*tried).contains(&v),
                    "{path} record {r}: version {v}, at least {} expected, {tried} tried",
                    least[r]
                );
                versions.push(v);
            }
            if versions.iter().any(|&v| v != versions[0]) {
                midway += (*path == done.last().unwrap().0) as u32;
            }
        }
    }
    // Collection: afterwards every stored chunk is one a recipe names
    // (every chunk written is distinct, so named == stored).
    let (ok, out, err) = parcache(&["gc", "--data", c.d(), "--older-than", "0"]);
    assert!(ok, "{out}{err}");
    let (named, stored) = chunk_counts(c.d());
    assert_eq!(named, rounds as u64 * RECORDS * (RECORD / CHUNK) as u64);
    assert_eq!(stored, named, "chunks stored that no recipe names: {out}");
    eprintln!(
        "{rounds} kill points ({mds_kills} metadata server, {iod_kills} data server), \
         {midway} in the middle of a round of records; every record whole; \
         {acked_total} versions acknowledged by fsync in all; after gc {stored} chunks stored, all named"
    );
}
